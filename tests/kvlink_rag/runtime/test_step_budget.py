"""The step budget: decode tokens first, prefill chunks shortest first, a completing prefill's step kept short."""

from dataclasses import dataclass

import math

from kvlink_rag.runtime.step_budget import MIN_CHUNK, allot, key_weight, tokens_for_cost


@dataclass
class _Req:
    pending_left: int
    context_keys: int = 0
    prefill_tokens: int = 0


def _tokens(running, budget):
    return {h: n for h, _, n in allot(running, budget)}


def test_decodes_then_the_shortest_prefill_then_the_rest_of_the_budget():
    running = [("long", _Req(3000)), ("dec", _Req(1)), ("mid", _Req(500))]
    assert _tokens(running, 128) == {"dec": 1, "mid": 127}


def test_a_prefill_that_completes_leaves_the_others_a_small_chunk_only():
    running = [("long", _Req(3000)), ("short", _Req(70)), ("dec", _Req(1))]
    assert _tokens(running, 128) == {"dec": 1, "short": 70, "long": MIN_CHUNK}


def test_a_long_prefill_alone_takes_the_whole_budget_and_its_last_chunk_completes_it():
    assert _tokens([("long", _Req(3000))], 128) == {"long": 128}
    assert _tokens([("long", _Req(100)), ("other", _Req(900))], 128) == {"long": 100, "other": 16}


def test_short_prefills_beside_a_completing_one_keep_the_room():
    running = [("a", _Req(40)), ("b", _Req(60)), ("c", _Req(50)), ("long", _Req(3000))]
    assert _tokens(running, 128) == {"a": 40, "c": 50, "b": 38}  # the long one waits for a step without arrivals


def test_decodes_filling_the_budget_still_leave_a_prefill_its_minimum():
    running = [(f"d{i}", _Req(1)) for i in range(130)] + [("long", _Req(3000))]
    assert _tokens(running, 128)["long"] == MIN_CHUNK


W = 1 / 3072  # SmolLM2-135M's key weight


def test_key_weight_is_attention_flops_per_key_over_linear_flops_per_token():
    from types import SimpleNamespace

    cfg = SimpleNamespace(hidden_size=576, num_attention_heads=9, num_key_value_heads=3, intermediate_size=1536)
    lm = SimpleNamespace(config=cfg, head_dim=64)
    linear = 2 * (576 * 576 * 2 + 576 * 192 * 2 + 3 * 576 * 1536)  # q, o, k, v, gate/up/down
    assert math.isclose(key_weight(lm), 4 * 9 * 64 / linear)
    assert math.isclose(1 / key_weight(lm), 3072.0)


def test_tokens_for_cost_is_the_largest_chunk_within_the_budget():
    assert tokens_for_cost(128, 0, 0.0) == 128
    n = tokens_for_cost(128, 3072, W)  # every token costs ~2 at 3k keys
    cost = lambda m: m * (1 + W * (3072 + m / 2))  # noqa: E731
    assert cost(n) <= 128 < cost(n + 1)
    assert n == 63
    assert tokens_for_cost(0.5, 10_000, W) == 1  # never below one token


def test_a_long_prefill_is_capped_by_the_cost_of_its_chunk_at_its_keys():
    early, late = _Req(3000, context_keys=0), _Req(3000, context_keys=3072)
    assert _tokens([("long", early)], 256) == {"long": 256}  # no cap: the room
    assert _tokens([("long", early)], 256) == {h: n for h, _, n in allot([("long", early)], 256, None, W)}
    assert {h: n for h, _, n in allot([("long", early)], 256, 128, W)} == {"long": tokens_for_cost(128, 0, W)}
    assert {h: n for h, _, n in allot([("long", late)], 256, 128, W)} == {"long": 63}


def test_the_cap_leaves_short_prefills_and_decodes_alone():
    running = [("long", _Req(3000, 3072)), ("q", _Req(200, 1300)), ("dec", _Req(1, 1400))]
    got = {h: n for h, _, n in allot(running, 256, 64, W)}
    assert got == {"dec": 1, "q": 200, "long": MIN_CHUNK}  # q completes: the long prompt gets the minimum
    got = {h: n for h, _, n in allot([("long", _Req(3000, 100_000))], 256, 64, W)}
    assert got == {"long": MIN_CHUNK}  # a cap below the minimum chunk still moves it on


def test_the_last_chunks_of_a_long_prefill_stay_capped():
    """The 3.3k-token prompt's tail (225 tokens left after ~3.1k keys) once ran as one uncapped 390 ms step."""
    tail = _Req(225, context_keys=3075, prefill_tokens=3300)
    assert {h: n for h, _, n in allot([("long", tail)], 256, 128, W)} == {"long": tokens_for_cost(128, 3075, W)}
    short = _Req(225, context_keys=3075, prefill_tokens=225)  # a prefill that was never long: no cap
    assert {h: n for h, _, n in allot([("q", short)], 256, 128, W)} == {"q": 225}
