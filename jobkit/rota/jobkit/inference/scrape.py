"""Reads an engine's cache signals from any Prometheus ``/metrics`` page.

vLLM's names are read first (``vllm:kv_cache_usage_perc``, or the older
``vllm:gpu_cache_usage_perc``; the prefix-cache query and hit counters; preemptions;
generated tokens, the goodput of `rota.jobkit.inference.kv_climb`; requests running and
waiting, the cache's fit and its queue; the cache's size, from the ``num_gpu_blocks`` and
``block_size`` labels of ``vllm:cache_config_info``), and
``rota:recomputed_prefill_tokens_total`` where the engine exports it (ours). SGLang's
(``--enable-metrics``) come through an adapter: ``sglang:token_usage`` as usage and
``sglang:cache_hit_rate`` as the hit rate (a gauge, so the controller uses it as is),
``sglang:num_running_reqs`` and ``sglang:num_queue_reqs`` as running and waiting. A
page with none of the usage names, or a server that does not answer, gives None: the
controller then holds its window.
"""

from __future__ import annotations

import math
import re
import urllib.error
import urllib.request

from rota.jobkit.inference.kv_window import CacheSample

__all__ = ["cache_size", "parse_text", "sample_from", "sample_from_text", "scrape"]

CACHE_INFO = "vllm:cache_config_info"


def parse_text(text: str) -> dict[str, float]:
    """Sum of each metric's samples over its label sets (one engine, or all of a fleet)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        head, _, rest = line.rpartition("}") if "}" in line else ("", "", line)
        if head:
            name = head.split("{", 1)[0]
            fields = rest.split()
        else:
            name, *fields = line.split()
        if not fields:
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue
        if math.isfinite(value):
            out[name] = out.get(name, 0.0) + value
    return out


def cache_size(text: str) -> tuple[float, float] | None:
    """(blocks, tokens per block) from ``vllm:cache_config_info``'s labels: the blocks of every
    engine on the page (a fleet's are summed), at the first engine's block size; None if absent."""
    blocks, size = 0.0, None
    for line in text.splitlines():
        if not line.startswith(CACHE_INFO + "{"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("{", 1)[1].rsplit("}", 1)[0]))
        try:
            count, tokens = float(labels["num_gpu_blocks"]), float(labels["block_size"])
        except (KeyError, ValueError):
            continue
        if count > 0 and tokens > 0:
            blocks += count
            size = size or tokens
    return None if size is None else (blocks, size)


def _counter(m: dict[str, float], name: str) -> float | None:
    return m.get(f"{name}_total", m.get(name))


def sample_from(m: dict[str, float], size: tuple[float, float] | None = None) -> CacheSample | None:
    """A sample from parsed metrics (``parse_text``) and the cache's size (``cache_size``)."""
    blocks, block_tokens = size if size is not None else (None, None)
    usage = m.get("vllm:kv_cache_usage_perc", m.get("vllm:gpu_cache_usage_perc"))
    if usage is not None:
        return CacheSample(
            usage=min(1.0, max(0.0, usage)), prefix_queries=_counter(m, "vllm:prefix_cache_queries"),
            prefix_hits=_counter(m, "vllm:prefix_cache_hits"), preemptions=_counter(m, "vllm:num_preemptions"),
            recomputed_tokens=_counter(m, "rota:recomputed_prefill_tokens"),
            evictions=_counter(m, "rota:kv_block_evictions"),
            generated=_counter(m, "vllm:generation_tokens"), running=m.get("vllm:num_requests_running"),
            waiting=m.get("vllm:num_requests_waiting"), cache_blocks=blocks, block_tokens=block_tokens,
        )
    usage = m.get("sglang:token_usage")
    if usage is not None:
        rate = m.get("sglang:cache_hit_rate")
        return CacheSample(usage=min(1.0, max(0.0, usage)), hit_rate=rate,
                           generated=_counter(m, "sglang:generation_tokens"),
                           running=m.get("sglang:num_running_reqs"), waiting=m.get("sglang:num_queue_reqs"))
    return None


def sample_from_text(text: str) -> CacheSample | None:
    """``sample_from`` of a whole ``/metrics`` page."""
    return sample_from(parse_text(text), cache_size(text))


def scrape(url: str, timeout_s: float = 1.0) -> CacheSample | None:
    """One scrape of ``url``; None when it does not answer or has no usage metric."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 - a metrics URL
            text = response.read().decode("utf-8", errors="replace")
    except (urllib.error.URLError, OSError, ValueError):
        return None
    return sample_from_text(text)
