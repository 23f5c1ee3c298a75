"""The model-free routing simulation (bench.routing_sim) on tiny deterministic fleets: its hit-rate, load and
modelled-TTFT arithmetic, the real tier's LRU under it, and the router's index fed by its events."""

from bench.routing_sim import Setup, Workload, simulate
from bench.routing_sim_fleet import ServiceModel, SimReplica

MODEL = ServiceModel("test", fixed_ms=100.0, hit_us=0.0, miss_us=1000.0)  # 1 ms per missed token
TINY = Setup(replicas=2, host_fraction=0.75, clients=1, warmup=0, bytes_per_token=10)  # tiers of 30 tokens


def test_hit_rates_by_documents_and_tokens_load_and_modelled_ttft_on_a_hand_checked_case():
    # round-robin, one client: a gets queries 0 and 2, b gets 1 and 3. a: 0, 1 miss (holds 0, 1); b: 2, 0 miss;
    # a: 0 hits, 2 misses and evicts 1 (LRU); b: 1 misses and evicts 2, then 0 hits.
    work = Workload(tokens=[10, 20, 10], queries=[[0, 1], [2, 0], [0, 2], [1, 0]])
    row = simulate(work, TINY, MODEL, {"policy": "round-robin"})
    assert row["hit_rate_docs"] == 2 / 8
    assert row["hit_rate_tokens"] == 20 / 100
    assert row["requests_per_replica"] == {"a": 2, "b": 2} and row["max_min_load"] == 1.0
    # modelled first-token times: 100 ms + 1 ms per missed token: 130, 120, 110, 120 ms
    assert round(row["ttft_p50_s"], 6) == 0.12 and round(row["ttft_p99_s"], 6) == 0.13


def test_the_warmup_queries_are_not_counted():
    work = Workload(tokens=[10, 20, 10], queries=[[0, 1], [2, 0], [0, 2], [1, 0]])
    row = simulate(work, Setup(**{**vars(TINY), "warmup": 2}), MODEL, {"policy": "round-robin"})
    assert row["hit_rate_docs"] == 2 / 4 and row["requests_per_replica"] == {"a": 1, "b": 1}


def test_document_aware_follows_the_documents_once_the_router_has_seen_the_events():
    # every query asks for the same two documents: after the first, whoever holds them takes them all
    work = Workload(tokens=[10, 10, 20], queries=[[0, 1]] * 6)  # tiers of 30 tokens hold both
    row = simulate(work, Setup(**{**vars(TINY), "poll_s": 1e-6}), MODEL, {"policy": "document-aware"})
    assert row["hit_rate_docs"] == 10 / 12 and max(row["requests_per_replica"].values()) == 6


def test_the_router_index_sees_what_the_tier_holds_after_delivery_and_a_restart_resyncs_it():
    rep = SimReplica("a", host_bytes=300, bytes_per_token=10)
    first, hits, _ = rep.serve([("d0", 10), ("d1", 20)], arrival=1.0, model=MODEL)
    assert (first, hits) == (1.0 + 0.13, 0)
    rep.deliver(0.5)
    assert rep.state.held == {}  # published at 1.0 s, not yet polled
    rep.deliver(1.0)
    assert set(rep.state.held) == {"d0", "d1"} and rep.state.synced
    rep.restart(2.0)
    assert rep.state.held == {} and not rep.state.synced and len(rep.tier) == 0
    rep.deliver(2.0)
    assert rep.state.synced and rep.state.held == {}
