"""The linked TTFT bench times each repeat from the link's start: what ``before`` does is not in the figure."""

from __future__ import annotations

import time

from bench.ttft import ttft_linked
from factories import tiny_text_engine
from kvlink_rag.types import Document


def test_what_runs_before_each_repeat_is_not_timed(tmp_path, monkeypatch):
    engine = tiny_text_engine(tmp_path)
    docs = [Document(f"Document {i} says the code word is kiwi{i}.", f"T{i}") for i in range(2)]
    for d in docs:
        engine.get_or_encode(d)
    clock = [0.0]

    def tick() -> float:  # every reading of the clock moves it by a millisecond
        clock[0] += 0.001
        return clock[0]

    monkeypatch.setattr(time, "perf_counter", tick)
    res = ttft_linked(engine, "what is the code word?", docs, repeats=3,
                      before=lambda: clock.__setitem__(0, clock[0] + 100.0))  # a wait of 100 s, e.g. a tier fill
    assert res["total"]["n"] == 3 and 0 < res["total"]["max_s"] < 100.0
