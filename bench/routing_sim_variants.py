"""Document-aware rankings tried in the routing simulation (:mod:`bench.routing_sim`) and not adopted by the
router, kept so BENCHMARKS.md's what-if rows can be reproduced: the same signature as
:func:`router.scoring.document_aware`, built from its parts.

Rendezvous home (highest random weight: Thaler and Ravishankar 1998): each document has a home replica, the
live replica whose hash with the document's key is highest; a document away from its home costs ``home_weight``
x its fetch (or encode) more, unless every replica holds it in memory already (the hot documents, which every
tier keeps anyway). Meant to make the fleet's tiers partition the corpus; on the issue's workload it lowers the
hit rate (BENCHMARKS.md): a query's 10 documents have different homes, so following them pulls every query's
other documents into the same tier as before, and a home's pull outweighs where the documents actually are.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import xxhash

from router.scoring import (ReplicaView, Weights, document_cost, document_cost_tokens, load_cap, load_floor, load_key,
                            requests)

MEMORY = frozenset({"device", "host"})


def rendezvous_home(key: str, replicas: Sequence[str]) -> str:
    """The replica (id) whose 64-bit xxhash of ``replica + NUL + key`` is highest."""
    return max(replicas, key=lambda r: xxhash.xxh64_intdigest(f"{r}\0{key}".encode()))


def away_tokens(docs: Sequence[tuple[str, int]], r: ReplicaView, replicas: Sequence[ReplicaView], w: Weights) -> float:
    """Weighted tokens (as :func:`router.scoring.uncached_tokens`) of ``docs`` whose home is not ``r``, less those
    every replica holds in memory."""
    ids = [x.id for x in replicas]
    out = 0.0
    for key, tokens in docs:
        everywhere = all(MEMORY & set(x.held.get(key) or ()) for x in replicas)
        if not everywhere and rendezvous_home(key, ids) != r.id:
            out += tokens * document_cost(None, w)
    return out


def with_home(home_weight: float) -> Callable[[Sequence[tuple[str, int]], Sequence[ReplicaView], Weights], list]:
    """A ranking as :func:`router.scoring.document_aware` (floor, cap, cost) whose cost adds ``uncached_weight x
    home_weight x`` :func:`away_tokens`."""
    def rank(docs: Sequence[tuple[str, int]], replicas: Sequence[ReplicaView], w: Weights) -> list[ReplicaView]:
        cap, floor = load_cap(replicas, w), load_floor(replicas, w)
        def cost(r: ReplicaView) -> float:
            return document_cost_tokens(docs, r, w) + w.uncached_weight * home_weight * away_tokens(docs, r, replicas, w)
        return sorted(replicas, key=lambda r: (requests(r) >= cap, requests(r) >= floor, cost(r), *load_key(r, w)))
    return rank
