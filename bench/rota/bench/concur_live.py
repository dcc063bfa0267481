"""An agentic batch against a real OpenAI-compatible server, in wall-clock time.

Each agent is a thread and a real HTTP client: per turn it POSTs its whole history as token
ids to ``/v1/completions`` (``max_tokens = min_tokens = gen_tokens``, ``ignore_eos``), appends
the token ids it gets back, then calls its tool, which really waits (``time.sleep`` of the
drawn latency), and appends the observation. Before each turn (a step boundary) it asks
the gate for a slot and blocks until it has one; it releases its slot when it is done.

The gate is the same ``AdmissionController`` as on our engine, behind
``ScrapedAdmission``: for the controller arm a control thread scrapes the server's
``/metrics`` every control interval and applies the control law (the window's admitted
agents are woken); for a static cap nothing observes, so the window never moves.

The figures come from the server's own counters, read before and after the run
(generation tokens, prefix-cache queries and hits, preemptions). vLLM exports no count of
recomputed tokens, so ``recompute_ratio`` is the prefill it did beyond what an infinite
prefix cache would have needed (each turn's prompt less the full blocks of the agent's
previous sequence), per generated token.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from rota.jobkit.inference.admission import ScrapedAdmission
from rota.jobkit.inference.agents import AgentPlan, RunResult, Workload, make_plans
from rota.jobkit.inference.scrape import cache_size, parse_text, sample_from, sample_from_text

__all__ = ["LiveServer", "run_live"]

COUNTERS = {"generated": "vllm:generation_tokens_total", "queries": "vllm:prefix_cache_queries_total",
            "hits": "vllm:prefix_cache_hits_total", "preemptions": "vllm:num_preemptions_total"}


@dataclass(frozen=True)
class LiveServer:
    base_url: str
    model: str = "tiny"
    block_tokens: int = 16
    timeout_s: float = 300.0

    def complete(self, prompt: list[int], tokens: int) -> list[int]:
        return self.complete_counted(prompt, tokens)[0]

    def complete_counted(self, prompt: list[int], tokens: int) -> tuple[list[int], int | None]:
        """The generated token ids, and how many prompt tokens the server had cached (None
        where it does not say: vLLM says with ``--enable-prompt-tokens-details``)."""
        body = {"model": self.model, "prompt": prompt, "max_tokens": tokens, "min_tokens": tokens,
                "ignore_eos": True, "temperature": 0.0, "return_token_ids": True}
        req = urllib.request.Request(f"{self.base_url}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(req, timeout=self.timeout_s) as r:  # noqa: S310 - our own local server
            out = json.loads(r.read().decode())
        ids = out["choices"][0].get("token_ids")
        if not isinstance(ids, list) or len(ids) != tokens:
            raise RuntimeError(f"server returned {ids!r} for token_ids, wanted {tokens} token ids")
        details = (out.get("usage") or {}).get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens")
        return [int(t) for t in ids], None if cached is None else int(cached)

    def metrics_text(self) -> str:
        with urllib.request.urlopen(f"{self.base_url}/metrics", timeout=10) as r:  # noqa: S310 - local
            return str(r.read().decode("utf-8", errors="replace"))

    def counters(self) -> dict[str, float]:
        m = parse_text(self.metrics_text())
        return {k: m.get(name, 0.0) for k, name in COUNTERS.items()}


def ideal_prefill(plan: AgentPlan, gen_tokens: int, block: int) -> int:
    """Prefill tokens an infinite prefix cache would leave for one agent's turns."""
    total, length = 0, len(plan.prompt)
    for turn in range(plan.turns):
        if turn:
            cached = (length + gen_tokens - 1) // block * block  # the previous sequence's full blocks
            length += gen_tokens + len(plan.observations[turn - 1])
            total += length - min(cached, (length - 1) // block * block)
        else:
            total += length
    return total


@dataclass
class _Live:
    w: Workload
    gate: ScrapedAdmission
    server: LiveServer
    t0: float = field(default_factory=time.monotonic)
    events: dict[str, threading.Event] = field(default_factory=dict)
    points: list[dict[str, float]] = field(default_factory=list)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    finished: threading.Event = field(default_factory=threading.Event)

    def now(self) -> float:
        return time.monotonic() - self.t0

    def wake(self, agents: tuple[str, ...]) -> None:
        for a in agents:
            self.events[a].set()

    def admit(self, agent: str, tokens: int) -> None:
        event = self.events[agent]
        event.clear()
        if not self.gate.request(agent, tokens):
            event.wait()

    def agent(self, plan: AgentPlan) -> None:
        history = list(plan.prompt)
        try:
            for turn in range(plan.turns):
                if turn:
                    time.sleep(plan.latencies[turn - 1])  # the tool call
                    history += plan.observations[turn - 1]
                self.admit(plan.agent, len(history) + self.w.gen_tokens)
                ids, cached = self.server.complete_counted(history, self.w.gen_tokens)
                if cached is not None:
                    self.gate.served(plan.agent, len(history), cached)
                history += ids
        except Exception as exc:  # noqa: BLE001 - reported as the run's failure
            self.errors.append(f"{plan.agent}: {exc}")
        finally:
            self.wake(self.gate.release(plan.agent))

    def control(self, controlled: bool) -> None:
        """Every control interval: scrape, apply the law (controller arm), record a point."""
        gen0 = None
        last = self.now()
        while not self.finished.wait(self.w.control_interval_s):
            try:
                text = self.server.metrics_text()
            except OSError:
                text = ""
            m = parse_text(text)
            sample = sample_from(m, cache_size(text))
            now = self.now()
            if controlled:
                decision = self.gate.observe(sample, now)
                self.wake(decision.admitted)
                self.decisions.append({
                    "t": round(now, 3), "window": decision.window, "action": decision.action,
                    "reason": decision.reason, "active": decision.active, "held": decision.held,
                    "usage": decision.usage, "hit_rate": None if decision.hit_rate is None else round(decision.hit_rate, 3),
                    "running": m.get("vllm:num_requests_running"), "waiting": m.get("vllm:num_requests_waiting"),
                    "preemptions": m.get("vllm:num_preemptions_total"),
                    "generated": m.get(COUNTERS["generated"])})
            gen = m.get(COUNTERS["generated"], 0.0)
            if gen0 is not None:
                self.points.append({"t": round(now, 3), "tokens_per_s": round((gen - gen0) / max(now - last, 1e-9), 2),
                                    "active_agents": len(self.gate.active),
                                    "usage": round(sample.usage if sample else 0.0, 4)})
            gen0, last = gen, now


def run_live(w: Workload, gate: ScrapedAdmission, server: LiveServer, *, controlled: bool,
             vocab: int) -> RunResult:
    plans = make_plans(w, vocab)
    live = _Live(w, gate, server)
    live.events = {p.agent: threading.Event() for p in plans}
    before = server.counters()
    if controlled:  # the controller reads the server (its cache's size) before any agent asks
        gate.observe(sample_from_text(server.metrics_text()), 0.0)
    live.t0 = time.monotonic()
    control = threading.Thread(target=live.control, args=(controlled,), daemon=True)
    control.start()
    threads = [threading.Thread(target=live.agent, args=(p,), daemon=True) for p in plans]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    makespan = live.now()
    live.finished.set()
    control.join()
    if live.errors:
        raise RuntimeError(f"{len(live.errors)} agents failed; first: {live.errors[0]}")
    after = server.counters()
    d = {k: after[k] - before[k] for k in COUNTERS}
    ideal = sum(ideal_prefill(p, w.gen_tokens, server.block_tokens) for p in plans)
    ideal -= (len(plans) - 1) * (w.shared_prefix_tokens // server.block_tokens * server.block_tokens)
    recomputed = max(0, int(d["queries"] - d["hits"]) - ideal)
    generated = int(d["generated"])
    usage = [p["usage"] for p in live.points]
    return RunResult(
        tokens_per_s=generated / max(makespan, 1e-9), makespan_s=makespan,
        recompute_ratio=recomputed / max(generated, 1), hit_rate=d["hits"] / max(d["queries"], 1.0),
        evictions=0, mean_usage=sum(usage) / len(usage) if usage else 0.0, preemptions=int(d["preemptions"]),
        generated=generated, recomputed=recomputed, series=live.points, decisions=live.decisions,
    )
