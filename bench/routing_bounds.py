"""Analytic host-tier hit rates for the routing benchmarks' workload (queries of ``k`` distinct documents drawn
Zipf(1.0)): what round-robin gets, and what any routing could get.

* A document's chance to be in a query, ``q_d = 1 - exp(-tau x p_d)`` with ``tau`` such that the ``q_d`` add
  up to ``k`` (the Poisson approximation of successive sampling without replacement; ``p_d`` the Zipf
  probability of one draw).
* An LRU tier of ``C`` tokens fed independent requests at rates ``q_d`` holds document ``d`` with probability
  ``1 - exp(-q_d x T)``, ``T`` such that the held sizes add up to ``C`` (Che's approximation: Che, Tung and
  Wang, IEEE JSAC 2002; Fricker, Robert and Roberts, ITC 2012 for unequal sizes).
* Round-robin: each replica sees every ``replicas``-th query, an independent sample of the same stream, so its
  tier's hit rate is one LRU of ``C`` over the whole corpus, whatever the number of replicas.
* Any routing: a hit needs the document in the chosen replica's tier, so hits come from the union of the
  tiers, at most ``replicas x C`` tokens: the most popular documents (by requests per token held) that fit.
* Per-document routing (each document always to one home replica, a quarter of the corpus each): an LRU of
  ``C`` over each home's documents; what a fleet of LRU tiers reaches when the corpus is partitioned, which
  whole-query routing can only approach (a query's 10 documents have different homes).
* Modelled TTFT (:func:`ttft_bounds`): with every replica busy, closed-loop clients wait in proportion to the
  mean service time (Little's law), so the TTFT ratio of two policies is about the ratio of their mean service
  times, ``fixed + query tokens x (h x hit + (1 - h) x miss)`` at token hit rates ``h``.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Sequence

from bench.routing_workload import zipf_weights


def _solve(f: Callable[[float], float], target: float, hi: float = 1.0) -> float:
    """``x >= 0`` with ``f(x) = target`` for an increasing ``f`` (bisection, relative precision ~1e-12)."""
    while f(hi) < target:
        hi *= 2
    lo = 0.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) < target else (lo, mid)
    return (lo + hi) / 2


def inclusion_probabilities(n_docs: int, per_query: int, s: float = 1.0) -> list[float]:
    """``q_d``: probability that document ``d`` (Zipf rank) is among a query's ``per_query`` distinct ones."""
    w = zipf_weights(n_docs, s)
    total = sum(w)
    p = [x / total for x in w]
    tau = _solve(lambda t: sum(1 - math.exp(-t * x) for x in p), per_query)
    return [1 - math.exp(-tau * x) for x in p]


def lru_hit_rates(rates: Sequence[float], sizes: Sequence[int], capacity: float) -> tuple[float, float]:
    """Che's approximation of an LRU tier of ``capacity`` tokens under independent requests: ``(hit rate by
    documents, by tokens)`` (``rates``: requests per query; ``sizes``: tokens)."""
    if sum(sizes) <= capacity:
        return 1.0, 1.0
    t = _solve(lambda x: sum(s * (1 - math.exp(-r * x)) for r, s in zip(rates, sizes)), capacity)
    held = [1 - math.exp(-r * t) for r in rates]
    docs = sum(r * h for r, h in zip(rates, held)) / sum(rates)
    tokens = sum(r * s * h for r, s, h in zip(rates, sizes, held)) / sum(r * s for r, s in zip(rates, sizes))
    return docs, tokens


def best_static(rates: Sequence[float], sizes: Sequence[int], capacity: float) -> tuple[float, float]:
    """Upper bounds on any cache of ``capacity`` tokens: ``(by documents, by tokens)``, each the most requests
    that fit (documents ordered by requests per token, the last one fractional; for tokens, by requests)."""
    def fill(value: Sequence[float]) -> float:
        left, got = capacity, 0.0
        for i in sorted(range(len(sizes)), key=lambda i: -value[i] / sizes[i]):
            take = min(1.0, left / sizes[i])
            got, left = got + take * value[i], left - take * sizes[i]
            if left <= 0:
                break
        return got / sum(value)

    return fill(rates), fill([r * s for r, s in zip(rates, sizes)])


def home(d: int, replicas: int) -> int:
    """A fixed pseudo-random home replica of document ``d`` (for the partitioned bound)."""
    return zlib.crc32(f"d{d}".encode()) % replicas


def bounds(sizes: Sequence[int], per_query: int, replicas: int, host_fraction: float) -> dict:
    """``{round_robin, partitioned_lru, any_routing, single_tier_best}``, each ``{docs, tokens}`` hit rates,
    and ``max_ratio_over_round_robin``: any_routing / round_robin (by documents)."""
    q = inclusion_probabilities(len(sizes), per_query)
    cap = host_fraction * sum(sizes)
    rr = lru_hit_rates(q, sizes, cap)
    parts = [[d for d in range(len(sizes)) if home(d, replicas) == r] for r in range(replicas)]
    per = [lru_hit_rates([q[d] for d in p], [sizes[d] for d in p], cap) for p in parts if p]
    req = [sum(q[d] for d in p) for p in parts if p]
    tok = [sum(q[d] * sizes[d] for d in p) for p in parts if p]
    part = (sum(h[0] * w for h, w in zip(per, req)) / sum(req), sum(h[1] * w for h, w in zip(per, tok)) / sum(tok))
    anyr = best_static(q, sizes, replicas * cap)
    one = best_static(q, sizes, cap)
    name = ("docs", "tokens")
    return {"round_robin": dict(zip(name, rr)), "partitioned_lru": dict(zip(name, part)),
            "any_routing": dict(zip(name, anyr)), "single_tier_best": dict(zip(name, one)),
            "max_ratio_over_round_robin": anyr[0] / rr[0], "query_tokens": sum(x * s for x, s in zip(q, sizes))}


def ttft_bounds(b: dict, fixed_ms: float, hit_us: float, miss_us: float, target: float = 0.6) -> dict:
    """From :func:`bounds` ``b`` and a service model (ms a request, us per hit and per missed token):
    ``{round_robin_ms, any_routing_ms}`` (mean service times), ``best_ratio`` (their ratio: the lowest TTFT
    ratio any routing could reach) and ``hit_rate_for_target``: the token hit rate whose service time is
    ``target`` x round-robin's (above 1: unreachable even with every token a hit)."""
    tokens = b["query_tokens"]

    def service(h: float) -> float:
        return fixed_ms + tokens * (h * hit_us + (1 - h) * miss_us) / 1000.0

    rr, best = service(b["round_robin"]["tokens"]), service(b["any_routing"]["tokens"])
    saved_per_hit = tokens * (miss_us - hit_us) / 1000.0  # ms saved going from h = 0 to h = 1
    need = (service(0.0) - target * rr) / saved_per_hit if saved_per_hit > 0 else float("inf")
    return {"round_robin_ms": rr, "any_routing_ms": best, "best_ratio": best / rr, "hit_rate_for_target": need,
            "target": target}
