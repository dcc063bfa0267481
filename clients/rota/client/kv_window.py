"""Admission control of a running agentic batch (CONCUR) for an agent framework outside Rota.

A job running `rota.jobkit.inference` with its controller serves `/admit`, `/release` and `/window`
on its node and names the address in its progress (`admission_url`). An outside agent asks
at each of its step boundaries, and goes on only when admitted; it keeps its place in the
queue while held, and releases its slot when it is done:

    gate = client.admission(job_id)
    # tokens: what the next step's request holds (its history and the tokens it generates); with
    # it the controller admits the agent only where that turn fits in the engine's KV cache
    while not gate.admit("my-agent-7", tokens=len(history) + max_new_tokens):
        time.sleep(0.05)
    ...                          # one step: generate, tool call, observe
    gate.release("my-agent-7")   # when the agent has finished

The endpoint listens on the node's loopback: call it from the job's node.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from rota.client.errors import FailedPreconditionError, InvalidArgumentError, UnavailableError


@dataclass(frozen=True)
class AdmissionEndpoint:
    """A job's admission controller at `url` (the job's `admission_url`)."""

    url: str
    timeout: timedelta = timedelta(seconds=5)

    def admit(self, agent: str, *, tokens: int | None = None) -> bool:
        """At a step boundary: True if `agent` may run its next step now, else ask again later.

        `tokens`: what that step's request holds in the KV cache (the agent's history and the
        tokens it generates), if known; then it is admitted only where it fits beside the
        active agents'.
        """
        if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1):
            raise InvalidArgumentError(f"tokens: a positive integer, got {tokens!r}", field="tokens")
        return bool(self._post("admit", agent, "" if tokens is None else f"&tokens={tokens}")["admitted"])

    def release(self, agent: str) -> list[str]:
        """`agent` is done: its slot is freed; the agents that now hold the freed slots."""
        return [str(a) for a in self._post("release", agent)["admitted"]]

    def window(self) -> dict[str, Any]:
        """The controller's window, active and held agents, and its last decision."""
        return self._call("GET", f"{self.url}/window")

    def _post(self, route: str, agent: str, more: str = "") -> dict[str, Any]:
        if not agent or len(agent) > 256:
            raise InvalidArgumentError("agent: a name of 1 to 256 characters", field="agent")
        return self._call("POST", f"{self.url}/{route}?agent={urllib.parse.quote(agent)}{more}")

    def _call(self, method: str, url: str) -> dict[str, Any]:
        request = urllib.request.Request(url, data=b"" if method == "POST" else None, method=method)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout.total_seconds()) as answer:
                data: dict[str, Any] = json.loads(answer.read())
                return data
        except urllib.error.HTTPError as exc:
            raise InvalidArgumentError(f"{url}: {exc.code} {exc.read()[:200]!r}") from exc
        except (OSError, ValueError) as exc:
            raise UnavailableError(f"the job's admission endpoint {url} does not answer ({exc}); it listens on "
                                   "its node's loopback, and only while the job runs") from exc


def endpoint_of(job_id: str, progress: dict[str, Any], timeout: timedelta) -> AdmissionEndpoint:
    url = progress.get("admission_url")
    if not isinstance(url, str) or not url.startswith("http://"):
        raise FailedPreconditionError(f"job {job_id} reports no admission_url: it is not an agentic batch "
                                      "under admission control, or has not started it yet")
    return AdmissionEndpoint(url.rstrip("/"), timeout)
