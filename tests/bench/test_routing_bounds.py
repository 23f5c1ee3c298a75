"""Analytic hit-rate bounds of the routing workload (bench.routing_bounds) against cases worked by hand and
against the simulation of the real LRU tier."""

import pytest

from bench.routing_bounds import best_static, bounds, inclusion_probabilities, lru_hit_rates, ttft_bounds
from bench.routing_sim import Setup, Workload, simulate
from bench.routing_sim_fleet import ServiceModel
from bench.routing_workload import zipf_queries


def test_inclusion_probabilities_add_up_to_the_documents_per_query_and_follow_the_ranks():
    q = inclusion_probabilities(100, 5)
    assert sum(q) == pytest.approx(5) and all(a > b for a, b in zip(q, q[1:])) and q[0] < 1


def test_lru_of_uniform_requests_holds_its_share_and_a_tier_holding_everything_always_hits():
    assert lru_hit_rates([1.0] * 10, [5] * 10, 20) == pytest.approx((0.4, 0.4))  # Che: h = C / N when uniform
    assert lru_hit_rates([3.0, 1.0], [5, 5], 10) == (1.0, 1.0)


def test_the_best_static_cache_keeps_the_most_requests_per_token():
    # rates 3, 1, 1 over sizes 1, 1, 2 in 2 tokens: documents 0 and 1, 4 of 5 requests; by tokens 3 + 1 of the
    # 3 + 1 + 2 requested (half of document 2 instead of document 1 would do as well)
    docs, tokens = best_static([3.0, 1.0, 1.0], [1, 1, 2], 2)
    assert docs == pytest.approx(4 / 5) and tokens == pytest.approx(4 / 6)


def test_the_fleet_bounds_are_ordered_and_round_robin_matches_the_simulated_lru():
    sizes = [10] * 200
    b = bounds(sizes, 5, replicas=2, host_fraction=0.1)
    rr, part, anyr = (b[k]["docs"] for k in ("round_robin", "partitioned_lru", "any_routing"))
    assert rr < part < anyr <= 1 and b["max_ratio_over_round_robin"] == pytest.approx(anyr / rr)
    work = Workload(sizes, zipf_queries(200, 3000, 5))
    model = ServiceModel("flat", fixed_ms=1.0, hit_us=0.0, miss_us=0.0)
    row = simulate(work, Setup(replicas=2, clients=2, warmup=500, bytes_per_token=10), model, {"policy": "round-robin"})
    assert row["hit_rate_docs"] == pytest.approx(rr, abs=0.03)


def test_ttft_bounds_compare_mean_service_times_and_name_the_hit_rate_a_target_needs():
    b = {"query_tokens": 1000, "round_robin": {"tokens": 0.5}, "any_routing": {"tokens": 1.0}}
    # 100 ms + 1000 tokens x (0 us a hit, 1000 us a miss): round-robin 600 ms, all hits 100 ms
    t = ttft_bounds(b, fixed_ms=100, hit_us=0, miss_us=1000, target=0.6)
    assert t["round_robin_ms"] == 600 and t["any_routing_ms"] == 100 and t["best_ratio"] == pytest.approx(1 / 6)
    assert t["hit_rate_for_target"] == pytest.approx(0.74)  # 100 + 1000 x 0.26 = 360 ms = 0.6 x 600
    cheap = ttft_bounds(b, fixed_ms=100, hit_us=0, miss_us=10)  # misses cost little: no hit rate reaches 0.6x
    assert cheap["best_ratio"] > 0.9 and cheap["hit_rate_for_target"] > 1
