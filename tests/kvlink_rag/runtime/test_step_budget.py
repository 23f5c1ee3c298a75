"""The step budget: decode tokens first, prefill chunks shortest first, a completing prefill's step kept short."""

from dataclasses import dataclass

from kvlink_rag.runtime.step_budget import MIN_CHUNK, allot


@dataclass
class _Req:
    pending_left: int


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
