"""A long prompt's step yields to new short requests between its decoder layers (tiny model, float32)."""

from __future__ import annotations

import pytest

from factories import tiny_text_engine
from scheduler_helpers import DOCS, QUESTIONS, make_scheduler, request


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return tiny_text_engine(tmp_path_factory.mktemp("interject"), max_new_tokens=4, kv_dtype="float32")


def test_a_short_request_arriving_mid_step_gets_its_first_token_before_that_step_ends(engine, monkeypatch):
    """The short request is submitted after the first layer of a long prompt's chunk: it is admitted and
    prefilled between that forward's layers, so it holds its first token when the forward ends; both answers are
    those each request gets alone."""
    import kvlink_rag.runtime.model_runner as mr

    sched = make_scheduler(engine, max_step_tokens=32)
    long_req = request(engine, " ".join(QUESTIONS * 8), DOCS, "full")
    short_req = request(engine, "say kiwi", DOCS[:1])
    seen, hooked, real = {}, [], mr.forward_ragged

    def forward(lm, batch, embeds, positions, between_layers=None):
        hooked.append((between_layers is not None, [r.length for r in batch.rows]))
        if between_layers is None or "short" in seen:
            return real(lm, batch, embeds, positions, between_layers)

        def hook():
            if "short" not in seen:
                seen["short"] = sched.submit(short_req)  # arrives while the long chunk's layers run
            between_layers()

        out = real(lm, batch, embeds, positions, hook)
        seen["tokens_when_it_ended"] = [len(rr.tokens) for h, rr in sched.running if h is seen["short"]]
        return out

    monkeypatch.setattr(mr, "forward_ragged", forward)
    try:
        long_h = sched.submit(long_req)
        long_toks = list(long_h.tokens())
        short_toks = list(seen["short"].tokens())
    finally:
        sched.close()
    assert seen["tokens_when_it_ended"] == [1]  # its prefill ran inside the long chunk's forward
    assert long_h.result.prompt_tokens > 4 * 32  # the long prompt really took several chunks
    assert long_toks == engine.answer_full(" ".join(QUESTIONS * 8), DOCS).token_ids
    assert short_toks == engine.answer("say kiwi", DOCS[:1]).token_ids
    interjected = hooked[1]  # the first forward after the long chunk's: the short request's prefill, alone
    assert interjected[0] is False and len(interjected[1]) == 1 and interjected[1][0] > 1
    assert all(rows != [1] for preemptible, rows in hooked if preemptible)  # decode-only steps never yield


def test_nothing_waits_nothing_is_interjected(engine, monkeypatch):
    """With no request waiting, the long prompt's chunks run as before: one forward a step."""
    import kvlink_rag.runtime.model_runner as mr

    sched = make_scheduler(engine, max_step_tokens=32)
    calls, real = [], mr.forward_ragged

    def forward(lm, batch, embeds, positions, between_layers=None):
        calls.append(len(batch.rows))
        return real(lm, batch, embeds, positions, between_layers)

    monkeypatch.setattr(mr, "forward_ragged", forward)
    try:
        h = sched.submit(request(engine, " ".join(QUESTIONS * 8), DOCS, "full", max_new_tokens=2))
        list(h.tokens())
    finally:
        sched.close()
    assert sched.steps == len(calls) and set(calls) == {1}


def test_generating_requests_decode_between_the_layers_of_a_long_prompt(engine, monkeypatch):
    """Once their turn has come (here at once), the requests already generating take their decode steps inside the
    long prompt's forward; every answer is still the one each request gets alone."""
    import kvlink_rag.runtime.model_runner as mr
    from kvlink_rag.runtime.interjection import LayerSlices

    real_pause = LayerSlices.pause
    monkeypatch.setattr(LayerSlices, "pause", lambda self, members, owed_s: real_pause(self, members, 0.0))
    sched = make_scheduler(engine, max_step_tokens=32)
    inside, depth, real = [], [0], mr.forward_ragged

    def forward(lm, batch, embeds, positions, between_layers=None):
        if depth[0]:
            inside.append([r.length for r in batch.rows])
        depth[0] += between_layers is not None
        try:
            return real(lm, batch, embeds, positions, between_layers)
        finally:
            depth[0] -= between_layers is not None

    monkeypatch.setattr(mr, "forward_ragged", forward)
    try:
        short_h = sched.submit(request(engine, "say kiwi", DOCS[:1], max_new_tokens=40, ignore_eos=True))
        stream = short_h.tokens()
        first = next(stream)  # generating before the long prompt arrives
        long_h = sched.submit(request(engine, " ".join(QUESTIONS * 8), DOCS, "full"))
        short_toks = [first] + list(stream)
        long_toks = list(long_h.tokens())
    finally:
        sched.close()
    assert [1] in inside  # a decode step ran inside the long prompt's forward
    assert short_toks == engine.answer("say kiwi", DOCS[:1], max_new_tokens=40, ignore_eos=True).token_ids
    assert long_toks == engine.answer_full(" ".join(QUESTIONS * 8), DOCS).token_ids
