"""Routing decisions on a fake fleet (router.scoring: pure functions)."""

from router.scoring import (ReplicaView, Weights, document_aware, document_cost, document_cost_tokens, least_load,
                            load_cap, load_floor, load_tokens, prefix_only, round_robin, sticky_first, uncached_tokens)

W = Weights(request_tokens=100)
DOCS = [("k1", 200), ("k2", 300)]


def fleet(**held) -> list[ReplicaView]:
    return [ReplicaView("a", held.get("a", {})), ReplicaView("b", held.get("b", {})), ReplicaView("c", held.get("c", {}))]


def test_the_replica_holding_the_documents_in_its_host_tier_wins():
    reps = fleet(b={"k1": {"host"}, "k2": {"host"}}, c={"k1": {"host"}})
    assert [r.id for r in document_aware(DOCS, reps, W)] == ["b", "c", "a"]
    assert uncached_tokens(DOCS, reps[1], W) == 0
    assert uncached_tokens(DOCS, reps[2], W) == 300 * 0.3  # k2 fetched from the shared tier
    assert uncached_tokens(DOCS, reps[0], W) == 500 * 0.3


def test_a_shared_tier_copy_is_cheaper_than_an_encode_and_a_local_copy_cheaper_still():
    assert document_cost(None, Weights(shared_tier=False)) == 1.0
    assert document_cost(None, W) == 0.3
    assert document_cost({"local"}, W) == 0.15
    assert document_cost({"cold", "host"}, W) == 0.0


def test_load_outweighs_holding_when_the_holder_is_busy_enough():
    holder = ReplicaView("b", {"k1": {"host"}, "k2": {"host"}}, running=1, waiting=1, queued_prefill_tokens=100)
    idle = ReplicaView("a")
    assert load_tokens(holder, W) == 100 + 2 * 100
    assert document_cost_tokens(DOCS, idle, W) == 16 * 500 * 0.3  # uncached tokens weigh 16 (Weights.uncached_weight)
    assert document_aware(DOCS, [idle, holder], W)[0].id == "b"  # 300 queued < 2400 weighted uncached
    holder.queued_prefill_tokens = 2300
    assert document_aware(DOCS, [idle, holder], W)[0].id == "a"  # 2500 queued > 2400
    assert document_aware(DOCS, [idle, holder], Weights(request_tokens=100, uncached_weight=1))[0].id == "a"


def test_bounded_load_puts_a_holder_far_above_the_mean_last_whatever_it_holds():
    holder = ReplicaView("b", {"k1": {"host"}, "k2": {"host"}}, in_flight=3)
    others = [ReplicaView("a", in_flight=1), ReplicaView("c")]
    # 4 requests + this one over 3 replicas, slack 0.5: a replica with ceil(1.5 x 5 / 3) = 3 is over
    assert load_cap([holder, *others], W) == 3
    assert [r.id for r in document_aware(DOCS, [holder, *others], W)] == ["c", "a", "b"]
    holder.in_flight = 1  # under the cap (ceil(1.5 x 3 / 3) = 2): what it holds wins again
    assert document_aware(DOCS, [holder, *others], W)[0].id == "b"
    assert document_aware(DOCS, [holder, *others], Weights(request_tokens=100, balance_slack=10))[0].id == "b"


def test_an_overloaded_holder_spills_to_the_next_cheapest_replica_not_the_idlest():
    holder = ReplicaView("b", {"k1": {"host"}, "k2": {"host"}}, in_flight=5)
    second = ReplicaView("c", {"k2": {"host"}}, in_flight=2)
    idle = ReplicaView("a", in_flight=1)
    assert load_cap([holder, second, idle], W) == 5  # ceil(1.5 x 9 / 3)
    assert [r.id for r in document_aware(DOCS, [holder, second, idle], W)] == ["c", "a", "b"]


def test_a_replica_under_the_load_floor_goes_first_however_little_it_holds():
    holders = [ReplicaView(x, {"k1": {"host"}, "k2": {"host"}}, in_flight=4) for x in "bcd"]
    cold = ReplicaView("a", in_flight=1)  # restarted: holds nothing
    # 13 requests over 4 replicas, slack 0.5: fewer than floor(13 / 4 / 1.5) = 2 is under-used
    assert load_floor([*holders, cold], W) == 2
    assert document_aware(DOCS, [*holders, cold], W)[0].id == "a"
    cold.in_flight = 2  # at the floor: the documents decide again (the holders are under the cap of 6)
    assert document_aware(DOCS, [*holders, cold], W)[0].id == "b"
    cold.in_flight = 1
    assert document_aware(DOCS, [*holders, cold], Weights(request_tokens=100, load_floor=False))[0].id == "b"


def test_no_floor_while_the_fleet_is_light():
    holder, idle = ReplicaView("b", {"k1": {"host"}, "k2": {"host"}}, in_flight=2), ReplicaView("a")
    assert load_floor([holder, idle], W) == 0  # 1 request per replica < 1 + slack
    assert document_aware(DOCS, [holder, idle], W)[0].id == "b"


def test_in_flight_counts_when_heartbeats_lag():
    a, b = ReplicaView("a", in_flight=3), ReplicaView("b", running=1)
    assert [r.id for r in least_load([a, b], W)] == ["b", "a"]


def test_ties_go_to_the_least_loaded_then_the_id():
    a, b = ReplicaView("b"), ReplicaView("a")
    assert [r.id for r in document_aware(DOCS, [a, b], W)] == ["a", "b"]


def test_round_robin_rotates_over_the_ids():
    reps = fleet()
    assert [[r.id for r in round_robin(reps, t)][0] for t in range(4)] == ["a", "b", "c", "a"]
    assert round_robin([], 3) == []


def test_prefix_only_takes_the_longest_match_unless_the_fleet_is_unbalanced():
    reps = fleet()
    assert prefix_only({"c": 90, "a": 10}, 100, reps, W)[0].id == "c"
    assert prefix_only({"c": 20}, 100, reps, W)[0].id == "a"  # too short a match: least load
    reps[2].in_flight, reps[0].in_flight = 20, 1
    assert prefix_only({"c": 90}, 100, reps, W)[0].id == "b"  # unbalanced: least load


def test_a_conversation_sticks_unless_its_replica_is_overloaded_or_gone():
    reps = fleet()
    assert [r.id for r in sticky_first(reps, "c", 4)][0] == "c"
    reps[2].in_flight = 4
    assert sticky_first(reps, "c", 4)[0].id == "a"
    assert sticky_first(reps, "gone", 4)[0].id == "a"
