"""The document-aware cost on a simulated fleet: replicas with small LRU host tiers, closed-loop clients and
Zipf(1.0) queries as in the routing bench; host-tier hit rate and max/min requests per replica per policy."""

from __future__ import annotations

import heapq
from collections import OrderedDict

import pytest

from bench.routing_workload import zipf_queries
from router.scoring import ReplicaView, Weights, document_aware, round_robin


def simulate(policy: str, w: Weights, replicas: int = 2, clients: int = 4, local: tuple[str, ...] = ("a",),
             n_docs: int = 40, n_queries: int = 400, per: int = 3, host_docs: int = 4, tokens: int = 180,
             seed: int = 0) -> tuple[float, float]:
    """``(host hit rate, max/min requests per replica)``: each request takes (1 + 0.3 per document missing
    from the chosen replica's host tier) x its requests in flight (processor sharing, roughly); the documents
    then enter that host tier (LRU of ``host_docs``); ``local`` replicas hold every document in their LMDB."""
    queries = zipf_queries(n_docs, n_queries, per, seed)
    names = [chr(ord("a") + i) for i in range(replicas)]
    host = {r: OrderedDict() for r in names}
    inflight, routed = dict.fromkeys(names, 0), dict.fromkeys(names, 0)
    hits = misses = turn = nxt = 0
    events: list[tuple[float, int, str]] = []

    def dispatch(now: float) -> None:
        nonlocal hits, misses, turn, nxt
        docs = [(f"d{d}", tokens) for d in queries[nxt]]
        nxt += 1
        views = []
        for r in names:
            held = {f"d{d}": {"local"} for d in range(n_docs)} if r in local else {}
            held.update({k: {"host"} | held.get(k, set()) for k in host[r]})
            views.append(ReplicaView(r, held, in_flight=inflight[r]))
        ranked = round_robin(views, turn) if policy == "round-robin" else document_aware(docs, views, w)
        turn += 1
        r = ranked[0].id
        routed[r] += 1
        inflight[r] += 1
        missed = 0
        for key, _ in docs:
            if key in host[r]:
                hits += 1
                host[r].move_to_end(key)
            else:
                misses += 1
                missed += 1
                host[r][key] = None
                if len(host[r]) > host_docs:
                    host[r].popitem(last=False)
        heapq.heappush(events, (now + (1 + 0.3 * missed) * inflight[r], nxt, r))

    for _ in range(clients):
        dispatch(0.0)
    while events:
        now, _, r = heapq.heappop(events)
        inflight[r] -= 1
        if nxt < len(queries):
            dispatch(now)
    loads = sorted(routed.values())
    return hits / (hits + misses), loads[-1] / max(1, loads[0])


OLD = Weights(uncached_weight=1.0, balance_slack=1e9)  # the weights of the last routing bench


@pytest.mark.parametrize("fleet", [dict(replicas=2, clients=4, local=("a",)), dict(replicas=2, clients=4, local=("a", "b")),
                                   dict(replicas=4, clients=16, local=()), dict(replicas=4, clients=16, local=tuple("abcd"))])
def test_the_tuned_cost_wins_hit_rate_over_round_robin_and_keeps_the_load_balanced(fleet):
    rr_hits, rr_balance = simulate("round-robin", Weights(), **fleet)
    old_hits, _ = simulate("document-aware", OLD, **fleet)
    hits, balance = simulate("document-aware", Weights(), **fleet)
    assert rr_balance == 1.0
    assert old_hits < 1.1 * rr_hits  # the load term decided: hardly better than round-robin (the bench's result)
    assert hits > 1.1 * rr_hits and hits > old_hits + 0.02 and balance <= 1.5


def test_a_strong_weight_without_the_bounded_load_piles_everything_on_the_local_copies():
    hits, balance = simulate("document-aware", Weights(balance_slack=1e9))
    assert balance > 1.5
    _, bounded = simulate("document-aware", Weights())
    assert bounded <= 1.5
