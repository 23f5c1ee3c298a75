"""Sampling and decoding."""

import pytest
import torch

from factories import random_ids, real_tokenizer, tiny_model
from kvlink_rag.decoding.generate import (SamplingParams, answer_text, decode, full_prefill, sample_next, sampling_generator,
                                 stream_text, whole_text)
from kvlink_rag.runtime.model_runner import get_runner


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
    runner.forward = lambda batch, embeds, pos, adapter=None, between=None: (
        fed.append(int(pos.max())), runner_forward(batch, embeds, pos, adapter, between))[1]
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


def test_a_temperature_below_float32_resolution_decodes_greedily():
    logits = torch.tensor([0.0, 3.0, 1.0, 2.9])
    for t in (1e-300, 5e-324, 1e-6, 9.99e-6):  # 1e-300 is 0 in float32: logits / t would be inf, then nan
        params = SamplingParams(temperature=t)
        assert params.greedy and sample_next(logits, params, None) == 1
    g = torch.Generator().manual_seed(0)
    for t in (1e-5, 1e-3, 5.0):  # the smallest sampled temperature and the largest the API accepts
        assert not SamplingParams(temperature=t).greedy
        assert {sample_next(logits, SamplingParams(temperature=t), g) for _ in range(20)} <= {0, 1, 2, 3}
    lm = tiny_model("llama")
    greedy = list(decode(lm, full_prefill(lm, random_ids(12, 0)), SamplingParams(max_new_tokens=6)))
    tiny = list(decode(lm, full_prefill(lm, random_ids(12, 0)), SamplingParams(max_new_tokens=6, temperature=1e-300)))
    assert tiny == greedy


def test_a_top_p_below_the_top_probability_samples_the_top_token():
    logits = torch.tensor([0.0, 3.0, 1.0, 2.9])
    g = torch.Generator().manual_seed(0)
    for p in (1e-300, 5e-324, 1e-8, 0.4):  # below float32 resolution or below p(1) ~ 0.46: the nucleus is {1}
        params = SamplingParams(temperature=1.0, top_p=p)
        assert {sample_next(logits, params, g) for _ in range(30)} == {1}
    assert {sample_next(logits, SamplingParams(temperature=1.0, top_p=1.0), g) for _ in range(300)} == {0, 1, 2, 3}


def test_without_a_seed_sampling_is_nondeterministic_and_with_one_repeatable():
    assert SamplingParams().seed is None
    lm = tiny_model("llama")

    def run(**kw):
        return list(decode(lm, full_prefill(lm, random_ids(12, 0)), SamplingParams(max_new_tokens=12,
                                                                                    temperature=2.0, **kw)))

    unseeded = {tuple(run()) for _ in range(4)}
    assert len(unseeded) > 1  # 4 draws of 12 tokens at temperature 2 over the tiny vocabulary
    assert run(seed=0) == run(seed=0) and run(seed=2**64 - 1) == run(seed=2**64 - 1)
    assert sampling_generator(SamplingParams(temperature=0.5)).initial_seed() != sampling_generator(
        SamplingParams(temperature=0.5)).initial_seed()
    assert sampling_generator(SamplingParams(temperature=1e-6, seed=3)) is None  # greedy: no generator


@pytest.mark.parametrize("text", ["日本語の絵文字😀テスト", "é中🎉ü", "answer: 東京タワー 🗼"])
def test_stream_and_answer_agree_wherever_generation_stops_inside_a_character(text):
    tok = real_tokenizer()
    ids = tok(text, add_special_tokens=False)["input_ids"]
    for n in range(1, len(ids) + 1):  # every cut: inside a character's bytes or between characters
        streamed = "".join(stream_text(tok, iter(ids[:n])))
        assert streamed.strip() == answer_text(tok, ids[:n]) == whole_text(tok, ids[:n]).strip()
        assert "\ufffd" not in streamed and text.startswith(streamed)
    assert answer_text(tok, ids) == text.strip()


def test_a_character_cut_off_by_the_end_of_generation_is_left_out_of_both():
    tok = real_tokenizer()
    ids = tok("日本語", add_special_tokens=False)["input_ids"]
    assert tok.decode(ids[:4]) == "日本\ufffd"  # generation stopped after the first byte(s) of 語
    assert answer_text(tok, ids[:4]) == "".join(stream_text(tok, iter(ids[:4]))) == "日本"
    assert answer_text(tok, ids[:1]) == "" and list(stream_text(tok, iter(ids[:1]))) == []
