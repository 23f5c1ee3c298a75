"""The router's policies over a simulated fleet, no model, no processes (the suite: :mod:`bench.routing_sim_suite`).

What is real: the router's ranking (:meth:`router.proxy.Router.rank` over a :class:`router.fleet.Fleet` of
:class:`router.fleet.ReplicaState`, so the policies of :mod:`router.scoring` and the prefix index as served),
each replica's host tier (:class:`store.tiers.tier.CacheTier`, LRU, byte budget) and its cache events, applied
to the router's index at its poll times. What is modelled: the replicas' time per request (a FIFO prefill
server per replica, :class:`bench.routing_sim_fleet.ServiceModel`), closed-loop clients that send their next
query when the last one's first token is out, and a request's load as the router's own in-flight count (no
heartbeats). Hit rates and TTFTs are counted after ``warmup`` queries (the tiers filled).
"""

from __future__ import annotations

import asyncio
import heapq
import json
import math
from dataclasses import dataclass, field

from bench.routing_sim_fleet import KV_BYTES_PER_TOKEN, ServiceModel, SimReplica
from router.documents import Resolved
from router.fleet import Fleet
from router.proxy import Router
from router.settings import RouterSettings


@dataclass
class Workload:
    """Documents (tokens each, popularity rank = index), queries (document indices) and their questions."""

    tokens: list[int]
    queries: list[list[int]]
    questions: list[str] = field(default_factory=list)

    def resolved(self, i: int) -> Resolved:
        """Query ``i`` as the router resolves it (cache key ``d<index>``; text as :mod:`router.documents`)."""
        q = self.queries[i]
        ids = [f"d{d}" for d in q]
        question = self.questions[i % len(self.questions)] if self.questions else f"question {i}"
        return Resolved(docs=[(f"d{d}", self.tokens[d]) for d in q], text=json.dumps(["default", question, ids]))


@dataclass
class Setup:
    """The fleet: ``replicas`` replicas whose host tiers hold ``host_fraction`` of the corpus' bytes each
    (``bytes_per_token`` charged per token), ``clients`` closed-loop clients, the router polling events every
    ``poll_s`` seconds; tallies start after ``warmup`` queries; ``restart_at``: the query before which the last
    replica restarts (:meth:`bench.routing_sim_fleet.SimReplica.restart`; None: no restart)."""

    replicas: int = 4
    host_fraction: float = 0.1
    clients: int = 16
    poll_s: float = 0.1
    warmup: int = 1000
    restart_at: int | None = None
    bytes_per_token: int = KV_BYTES_PER_TOKEN

    def host_bytes(self, tokens: list[int]) -> int:
        return int(self.host_fraction * sum(tokens) * self.bytes_per_token)


class _Counts:
    """Per-run tallies after the warm-up: hits and lookups (documents, tokens), TTFTs, requests per replica."""

    def __init__(self, names: list[str]):
        self.hit_docs = self.docs = self.hit_tokens = self.tokens = 0
        self.ttft: list[float] = []
        self.routed = dict.fromkeys(names, 0)

    def add(self, replica: str, docs: list[tuple[str, int]], hit_tokens: int, hit_docs: int, ttft: float) -> None:
        self.hit_docs, self.docs = self.hit_docs + hit_docs, self.docs + len(docs)
        self.hit_tokens, self.tokens = self.hit_tokens + hit_tokens, self.tokens + sum(t for _, t in docs)
        self.ttft.append(ttft)
        self.routed[replica] += 1

    def row(self) -> dict:
        """``{hit_rate_docs, hit_rate_tokens, max_min_load, requests_per_replica, ttft_p50_s, ttft_p99_s}``."""
        t, loads = sorted(self.ttft), sorted(self.routed.values())
        return {"hit_rate_docs": self.hit_docs / max(1, self.docs), "hit_rate_tokens": self.hit_tokens / max(1, self.tokens),
                "max_min_load": loads[-1] / loads[0] if loads[0] else math.inf, "requests_per_replica": self.routed,
                "ttft_p50_s": percentile(t, 0.5), "ttft_p99_s": percentile(t, 0.99)}


def percentile(ordered: list[float], q: float) -> float:
    """The ``q`` quantile of an ascending list (nearest rank; 0.0 when empty)."""
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else 0.0


def _router(names: list[str], reps: dict[str, SimReplica], settings: dict, model: ServiceModel) -> Router:
    fleet = Fleet(static=names)
    for name in names:
        fleet.replicas[name] = reps[name].state
    fields = {k: v for k, v in settings.items() if k != "rank"}
    router = Router(RouterSettings(replicas=names, shared_tier=model.shared_tier, **fields), fleet, resolver=None)
    asyncio.run(router.client.aclose())  # no HTTP: only its ranking is used
    if settings.get("rank") is not None:
        router.document_rank = settings["rank"]
    return router


def simulate(work: Workload, setup: Setup, model: ServiceModel, settings: dict) -> dict:
    """One policy's run (``settings``: router settings) over ``work``; returns :meth:`_Counts.row`."""
    names = [chr(ord("a") + i) for i in range(setup.replicas)]
    reps = {n: SimReplica(n, setup.host_bytes(work.tokens), setup.bytes_per_token) for n in names}
    router = _router(names, reps, settings, model)
    counts, nxt = _Counts(names), 0
    events: list[tuple[float, int, str, int]] = [(0.0, c, "", -1) for c in range(setup.clients)]  # (t, tie, replica, query)
    heapq.heapify(events)
    tie = setup.clients
    while events:
        now, _, done_on, _ = heapq.heappop(events)
        if done_on:
            reps[done_on].state.in_flight -= 1
        if nxt >= len(work.queries):
            continue
        polled = math.floor(now / setup.poll_s) * setup.poll_s
        for rep in reps.values():
            rep.deliver(polled)
        if nxt == setup.restart_at:
            reps[names[-1]].restart(now)
        resolved = work.resolved(nxt)
        chosen = router.rank(resolved)[0]
        chosen.in_flight += 1
        router.remember(resolved, chosen.url)
        first, hit_tokens, hit_docs = reps[chosen.url].serve(resolved.docs, now, model)
        if nxt >= setup.warmup:
            counts.add(chosen.url, resolved.docs, hit_tokens, hit_docs, first - now)
        heapq.heappush(events, (first, tie, chosen.url, nxt))
        tie, nxt = tie + 1, nxt + 1
    return counts.row()
