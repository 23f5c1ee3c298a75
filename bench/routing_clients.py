"""The routing bench's clients (:mod:`bench.routing`): closed-loop threads sending streamed ``/v1/query``
requests through the router, one record per request, and the figures a policy's row reports from them; with a
kill, the requests that failed split into those in flight on the killed replica and any other."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

REPLICA_HEADER = "x-kvlink-replica"
"""The header the router names the answering replica in (:data:`router.proxy.REPLICA_HEADER`)."""


@dataclass
class Sent:
    """One request: ``start``/``end`` (``time.perf_counter()`` seconds), ``ttft_s`` (seconds to the stream's
    headers, sent with the first token; None when none came), the ``replica`` that answered (None: no headers
    from one), whether it ``ok`` (200 and the stream's ``done`` event), and ``error`` otherwise."""

    start: float
    end: float = 0.0
    ttft_s: float | None = None
    replica: str | None = None
    ok: bool = False
    error: str = ""


def _send(c: httpx.Client, body: dict) -> Sent:
    s = Sent(start=time.perf_counter())
    try:
        with c.stream("POST", "/v1/query", json=body) as r:
            s.ttft_s, s.replica = time.perf_counter() - s.start, r.headers.get(REPLICA_HEADER)
            text = r.read()
        s.ok = r.status_code == 200 and b"event: done" in text and b"event: error" not in text
        s.error = "" if s.ok else f"HTTP {r.status_code}: {text[-300:].decode('utf-8', 'replace')}"
    except httpx.HTTPError as e:
        s.error = f"{type(e).__name__}: {e}"
    s.end = time.perf_counter()
    return s


def run_clients(router: str, queries: list[list[int]], questions: list[str], clients: int,
                call_at: int | None = None, call: Callable[[], None] | None = None,
                transport: httpx.BaseTransport | None = None) -> tuple[list[Sent], float, float]:
    """Send ``queries`` (document indices; document ``i`` is ``d{i}``, query ``i`` asks ``questions[i % len]``)
    from ``clients`` threads, each taking the next query when its last one ended; ``call()`` (a kill, a reading
    of counters) is called in a thread of its own once ``call_at`` queries have been taken. Returns ``(records
    in query order, wall seconds, when call() was called: perf_counter() seconds, or 0.0)``. ``transport``: the clients' (tests)."""
    out: list[Sent | None] = [None] * len(queries)
    lock, todo, called_at = threading.Lock(), iter(enumerate(queries)), [0.0]

    def client() -> None:
        with httpx.Client(base_url=router, timeout=600, transport=transport) as c:
            while True:
                with lock:
                    i, q = next(todo, (None, None))
                    if i is None:
                        return
                    if call is not None and i == call_at:
                        called_at[0] = time.perf_counter()
                        threading.Thread(target=call).start()
                body = {"question": questions[i % len(questions)], "document_ids": [f"d{d}" for d in q],
                        "stream": True}
                out[i] = _send(c, body)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [s for s in out if s is not None], time.perf_counter() - t0, called_at[0]


def _quantile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))] if values else float("nan")


def summarize(sent: list[Sent], wall_s: float) -> dict:
    """A policy's row from its records: TTFT p50/p99 (seconds, answered requests), throughput (answered queries
    per second of ``wall_s``), requests answered per replica, max/min of those, and the failures."""
    done = [s for s in sent if s.ok]
    per: dict[str, int] = {}
    for s in done:
        per[s.replica or "?"] = per.get(s.replica or "?", 0) + 1
    loads = sorted(per.values())
    ttft = [s.ttft_s for s in done if s.ttft_s is not None]
    return {"ttft_p50_s": _quantile(ttft, 0.5), "ttft_p99_s": _quantile(ttft, 0.99),
            "throughput_qps": len(done) / wall_s, "requests_per_replica": per, "wall_s": wall_s,
            "max_min_load": loads[-1] / max(1, loads[0]) if len(loads) > 1 else float("inf"),
            "requests": len(sent), "failed": len(sent) - len(done)}


def kill_outcome(sent: list[Sent], killed: str, killed_at: float) -> dict:
    """What a kill of replica ``killed`` at ``killed_at`` (perf_counter() seconds) cost: the requests in flight
    on it then (it had sent their headers, and they had not ended), the failed ones among them, and failed
    requests of any other kind (the issue's target: none; ``..._without_replica``: those of them no replica
    answered, e.g. the router's 502 after its one retry), with their first errors."""
    on_it = [s for s in sent if s.replica == killed and s.start <= killed_at < s.end]
    failed = [s for s in sent if not s.ok]
    other = [s for s in failed if not (s.replica == killed and s.start <= killed_at < s.end)]
    after = [s for s in sent if s.start > killed_at]
    return {"killed": killed, "in_flight_on_killed_at_kill": len(on_it),
            "failed_in_flight_on_killed": len([s for s in on_it if not s.ok]), "failed_other": len(other),
            "failed_other_without_replica": len([s for s in other if s.replica is None]),
            "sent_after_kill": len(after),
            "answered_by_killed_after_kill": len([s for s in after if s.replica == killed]),
            "errors": sorted({s.error[:200] for s in failed})[:5]}
