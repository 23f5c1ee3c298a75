"""When the others' decode steps are due inside a long prompt's forward (a fake clock)."""

from __future__ import annotations

from dataclasses import dataclass

from kvlink_rag.runtime import interjection
from kvlink_rag.runtime.interjection import LayerSlices


@dataclass
class _Req:
    pending_left: int


def test_decode_steps_are_due_after_the_paused_forward_ran_as_long_as_the_others(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(interjection.time, "perf_counter", lambda: now[0])
    paused, dec, prefill = _Req(200), _Req(1), _Req(40)
    running = [("p", paused), ("d", dec), ("f", prefill)]
    sl = LayerSlices()
    sl.pause([paused], owed_s=0.03)  # the step spent 30 ms on the others before the long forward
    now[0] += 0.02
    assert sl.decode_due(running) == []  # not yet: the long prompt has had 20 of its 30 ms
    now[0] += 0.011
    assert sl.decode_due(running) == [("d", dec)]  # generating ones only; never the paused forward's rows
    sl.ran(0.015)  # the interjected decode step took 15 ms
    now[0] += 0.01
    assert sl.decode_due(running) == []
    now[0] += 0.006
    assert sl.decode_due(running) == [("d", dec)]
    sl.clear()
    assert sl.decode_due([("p", paused)]) == []  # nothing decoding
