"""Sampling and decoding."""

import pytest
import torch

from factories import random_ids, tiny_model
from kvlink_rag.runtime.model_runner import get_runner
from kvlink_rag.generate import SamplingParams, decode, full_prefill, sample_next, stream_text


def test_greedy_is_argmax_and_top_p_keeps_the_nucleus():
    logits = torch.tensor([0.0, 3.0, 1.0, 2.9])
    assert sample_next(logits, SamplingParams(), None) == 1
    g = torch.Generator().manual_seed(0)
    tiny_p = SamplingParams(temperature=1.0, top_p=0.01)
    assert {sample_next(logits, tiny_p, g) for _ in range(50)} == {1}
    half = SamplingParams(temperature=1.0, top_p=0.6)  # p(1)~0.46, p(3)~0.42: both in the nucleus
    assert {sample_next(logits, half, g) for _ in range(200)} == {1, 3}


def test_sampling_is_deterministic_with_a_seed():
    lm = tiny_model("llama")
    params = SamplingParams(max_new_tokens=8, temperature=1.5, seed=7)
    runs = [list(decode(lm, full_prefill(lm, random_ids(12, 0)), params)) for _ in range(2)]
    assert runs[0] == runs[1] and len(runs[0]) == 8


def test_stop_token_ends_generation_and_is_not_yielded():
    lm = tiny_model("llama")
    greedy = list(decode(lm, full_prefill(lm, random_ids(12, 0)), SamplingParams(max_new_tokens=6)))
    stopped = list(decode(lm, full_prefill(lm, random_ids(12, 0)),
                          SamplingParams(max_new_tokens=6, stop_token_ids=(greedy[2],))))
    assert stopped == greedy[:greedy.index(greedy[2])]


def test_full_prefill_decode_matches_transformers_generate():
    lm = tiny_model("qwen2")
    ids = random_ids(15, 3)
    ours = list(decode(lm, full_prefill(lm, ids), SamplingParams(max_new_tokens=5)))
    ref = lm.model.generate(ids[None], max_new_tokens=5, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert ours == ref[0, 15:].tolist()


def test_bad_sampling_params():
    for kwargs in ({"max_new_tokens": 0}, {"temperature": -1.0}, {"top_p": 0.0}, {"top_p": 1.5}):
        with pytest.raises(ValueError):
            SamplingParams(**kwargs)


class _ByteTokenizer:
    def decode(self, ids, skip_special_tokens=True):
        return bytes(ids).decode("utf-8", errors="replace")


def test_stream_text_keeps_multibyte_characters_whole():
    ids = list("héllo 中".encode())
    pieces = list(stream_text(_ByteTokenizer(), iter(ids)))
    assert "".join(pieces) == "héllo 中"
    assert all("\ufffd" not in p for p in pieces)


def test_decode_stops_at_the_context_end_and_never_feeds_a_position_past_it():
    lm = tiny_model("llama", max_position_embeddings=96)
    fed: list[int] = []
    hook = lm.model.register_forward_pre_hook(lambda m, a, kw: fed.append(int(kw["position_ids"].max())),
                                              with_kwargs=True)  # the prefill (transformers)
    runner = get_runner(lm)  # the decode steps (the model runner)
    runner_forward = runner.forward
    runner.forward = lambda batch, embeds, pos, adapter=None: (fed.append(int(pos.max())),
                                                                runner_forward(batch, embeds, pos, adapter))[1]
    ctx = full_prefill(lm, random_ids(50, 0))
    toks = list(decode(lm, ctx, SamplingParams(max_new_tokens=100)))
    hook.remove()
    assert len(toks) == 96 - 50 and ctx.finish_reason == "length"
    assert max(fed) == 94  # tokens at positions 50..95; the last one is yielded, never fed


def test_finish_reason_stop_and_a_prompt_without_room_for_a_token():
    lm = tiny_model("llama", max_position_embeddings=96)
    ctx = full_prefill(lm, random_ids(12, 0))
    first = list(decode(lm, ctx, SamplingParams(max_new_tokens=3)))[0]
    ctx = full_prefill(lm, random_ids(12, 0))
    assert list(decode(lm, ctx, SamplingParams(max_new_tokens=3, stop_token_ids=(first,)))) == []
    assert ctx.finish_reason == "stop"
    from kvlink_rag.types import ContextTooLong

    with pytest.raises(ContextTooLong, match="prompt of 96 tokens plus 1 new token"):
        full_prefill(lm, random_ids(96, 0))
