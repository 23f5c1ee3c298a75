"""Which replica serves a request: pure functions over a view of the fleet (no I/O, unit-tested on a fake one).

Document-aware cost of a replica (lowest wins), in prompt tokens::

    cost = uncached_weight x sum over the request's documents of tokens x tier_cost(best tier holding it)
         + queued_prefill_tokens + request_tokens x requests,   requests = max(running + waiting, in_flight)

``tier_cost``: 0 in the replica's device or host tier, :data:`TIER_COST` for its cold tier and local LMDB,
``shared`` for a document only the shared tier holds (fetched, not encoded), 1 for an encode. Bounded load
(Mirrokni, Thorup and Zadimoghaddam, "Consistent Hashing with Bounded Loads", SODA 2018): a replica with at
least ``ceil((1 + balance_slack) x (all replicas' requests + 1) / replicas)`` requests goes after the others
whatever its cost, so a strong weight on cached documents cannot pile the traffic on their holder; and, the
other side of the same bound (``load_floor``), a replica with fewer than ``floor(all replicas' requests /
replicas / (1 + balance_slack))`` goes before them, so a replica that holds little (just restarted, or its
holding being resynced) is not left idle while the others queue. Ties go to the least loaded replica, then the
id (deterministic).

Why ``uncached_weight`` is 16: with 1, a query of 3 passages of ~180 tokens differs by at most ~160 weighted
tokens between a replica holding them all and one fetching them from the shared tier, less than one request
of load (256): the load term decided and document-aware routing was least-load (a lower host-tier hit rate
than round-robin in the routing bench). When every replica has the passages in its local LMDB (0.15), a
passage in the host tier saves 0.15 x 180 = 27 tokens: 8 x that still loses to one request of load, 16 x
wins. On a simulated fleet (``tests/router/test_scoring_fleet.py``: 2 replicas and 4 clients, 4 and 16,
local copies on all, one or none) 16 raises the host-tier hit rate 1.1-1.6x over round-robin's with max/min
requests per replica at most 1.1, where a large weight without the bound sends everything to the replica
with the local copies.

Why the floor: in the model-free simulation of the issue's fleet (``kvlink-rag bench --suites routing-sim``: 4
replicas, host tiers of 10% of 1,000 NQ passages, 16 clients, Zipf(1.0) queries of 10, a miss encoded) a
replica restarted mid-run (empty tier) served 367-384 of 4,000 queries against ~1,210 for each of the others,
and with one query seed a replica was left idle from the start (0 served) with no restart at all: the cap
bounds only the busiest replica, and a replica holding nothing loses every cost comparison while the others
are under it. Modelled TTFT p50 was 1.22x round-robin's. With the floor: 983-1,022 each, 0.93-0.95x. Where
every replica is busy anyway it changes nothing (BENCHMARKS.md, "Router policies in a model-free simulation").
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

TIER_COST = {"device": 0.0, "host": 0.0, "cold": 0.5, "local": 0.15}
SHARED_COST = 0.3
ENCODE_COST = 1.0


@dataclass
class ReplicaView:
    """One live replica as the router sees it.

    Attributes:
        id: its name (its URL when listed by URL).
        held: cache key -> tiers holding it (``device``, ``host``, ``cold``, ``local``), from its cache events.
        running, waiting, queued_prefill_tokens: its last heartbeat (requests, requests, tokens).
        in_flight: requests the router has forwarded to it and not finished.
    """

    id: str
    held: Mapping[str, frozenset[str] | set[str]] = field(default_factory=dict)
    running: int = 0
    waiting: int = 0
    queued_prefill_tokens: int = 0
    in_flight: int = 0


@dataclass(frozen=True)
class Weights:
    """Cost of a document per tier (fractions of an encode), of a request in the queue (tokens), whether a
    shared tier exists (else a document no replica holds in memory is an encode wherever it goes), the weight
    of uncached tokens against load, the bounded load's slack and whether it also has a floor (see the module
    docstring)."""

    tier_cost: Mapping[str, float] = field(default_factory=lambda: dict(TIER_COST))
    shared_cost: float = SHARED_COST
    shared_tier: bool = True
    request_tokens: int = 256
    uncached_weight: float = 16.0
    balance_slack: float = 0.5
    load_floor: bool = True


def document_cost(tiers: frozenset[str] | set[str] | None, w: Weights) -> float:
    """Fraction of an encode that one document costs on a replica holding it in ``tiers`` (None: nowhere)."""
    best = min((w.tier_cost.get(t, ENCODE_COST) for t in tiers or ()), default=ENCODE_COST)
    return min(best, w.shared_cost) if w.shared_tier else best


def uncached_tokens(docs: Sequence[tuple[str, int]], r: ReplicaView, w: Weights) -> float:
    """Weighted prompt tokens ``r`` would compute or fetch for ``docs`` (``[(cache key, tokens)]``)."""
    return sum(tokens * document_cost(r.held.get(key), w) for key, tokens in docs)


def requests(r: ReplicaView) -> int:
    """Requests ``r`` is busy with: its heartbeat's running + waiting, or the router's in flight if more."""
    return max(r.running + r.waiting, r.in_flight)


def load_tokens(r: ReplicaView, w: Weights) -> float:
    """``r``'s queued work in prompt tokens: its queued prefill plus ``request_tokens`` per request."""
    return r.queued_prefill_tokens + w.request_tokens * requests(r)


def load_cap(replicas: Sequence[ReplicaView], w: Weights) -> int:
    """Requests at which a replica is over the bounded load: ``ceil((1 + slack) x (total + 1) / replicas)``."""
    total = sum(requests(r) for r in replicas) + 1
    return math.ceil((1 + w.balance_slack) * total / max(1, len(replicas)))


def load_floor(replicas: Sequence[ReplicaView], w: Weights) -> int:
    """Requests under which a replica is under-used: ``floor(total / replicas / (1 + slack))``, 0 (none) without
    :attr:`Weights.load_floor` or while the fleet is light (fewer than ``1 + slack`` requests per replica)."""
    if not w.load_floor or not replicas:
        return 0
    return math.floor(sum(requests(r) for r in replicas) / len(replicas) / (1 + w.balance_slack))


def load_key(r: ReplicaView, w: Weights) -> tuple[float, int, str]:
    return load_tokens(r, w), r.in_flight, r.id


def least_load(replicas: Sequence[ReplicaView], w: Weights) -> list[ReplicaView]:
    """Replicas, least loaded first."""
    return sorted(replicas, key=lambda r: load_key(r, w))


def round_robin(replicas: Sequence[ReplicaView], turn: int) -> list[ReplicaView]:
    """Replicas (ordered by id) rotated to start at ``turn`` modulo their number."""
    ordered = sorted(replicas, key=lambda r: r.id)
    if not ordered:
        return []
    i = turn % len(ordered)
    return ordered[i:] + ordered[:i]


def document_cost_tokens(docs: Sequence[tuple[str, int]], r: ReplicaView, w: Weights) -> float:
    """``uncached_weight`` x :func:`uncached_tokens` + :func:`load_tokens`: the document-aware cost."""
    return w.uncached_weight * uncached_tokens(docs, r, w) + load_tokens(r, w)


def document_aware(docs: Sequence[tuple[str, int]], replicas: Sequence[ReplicaView], w: Weights) -> list[ReplicaView]:
    """Replicas under the floor (:func:`load_floor`) first, then those within the bounded load
    (:func:`load_cap`), then the rest; each group by :func:`document_cost_tokens`, cheapest first."""
    cap, floor = load_cap(replicas, w), load_floor(replicas, w)
    return sorted(replicas, key=lambda r: (requests(r) >= cap, requests(r) >= floor, document_cost_tokens(docs, r, w),
                                           *load_key(r, w)))


def prefix_only(matched: Mapping[str, int], total: int, replicas: Sequence[ReplicaView], w: Weights,
                min_match: float = 0.5, balance_abs: float = 8, balance_rel: float = 1.5) -> list[ReplicaView]:
    """SGLang's cache-aware rule on an approximate prefix index: the replica with the longest matched prefix of
    the request text (``matched``: replica id -> characters; ``total``: the text's length) when it matches at
    least ``min_match`` of it and the fleet is balanced; else least load. Unbalanced: the busiest replica's
    load (requests) exceeds the idlest's by more than ``balance_abs`` and ``balance_rel`` times."""
    by_load = least_load(replicas, w)
    if not by_load:
        return []
    loads = [requests(r) for r in by_load]
    if loads[-1] - loads[0] > balance_abs and loads[-1] > balance_rel * loads[0]:
        return by_load
    best = max(by_load, key=lambda r: matched.get(r.id, 0))  # max keeps the first (least loaded) of equals
    if total and matched.get(best.id, 0) >= min_match * total:
        return [best] + [r for r in by_load if r is not best]
    return by_load


def overloaded(r: ReplicaView, limit: int) -> bool:
    """Whether ``r`` has ``limit`` requests in flight from the router or waiting in its scheduler."""
    return r.in_flight >= limit or r.waiting >= limit


def sticky_first(ranked: list[ReplicaView], sticky: str | None, limit: int) -> list[ReplicaView]:
    """``ranked`` with the conversation's replica ``sticky`` first unless it is gone or :func:`overloaded`."""
    for r in ranked:
        if r.id == sticky and not overloaded(r, limit):
            return [r] + [x for x in ranked if x is not r]
    return ranked
