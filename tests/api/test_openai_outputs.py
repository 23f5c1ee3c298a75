"""logprobs / top_logprobs (chat) and logprobs (completions), seed reproducibility and response_format's
refusals against a real uvicorn with the official openai client, on the tiny random model (its answers are
noise, its log-probabilities exact). Structured output with the real model: tests/api/test_structured_real.py."""

from __future__ import annotations

import math

import openai
import pytest
import torch

from api_helpers import openai_server
from kvlink_rag.model.lora import adapter_scope

PROMPT = "The capital of France is"


@pytest.fixture
def server(tmp_path, tiny_engine, fixture_docs):
    with openai_server(tmp_path / "home", tiny_engine, fixture_docs) as srv:
        srv.engine = tiny_engine
        yield srv


def _direct_logprobs(engine, prompt_ids: list[int], generated: list[int]) -> torch.Tensor:
    """``[len(generated), vocab]`` log_softmax of the model's logits before each generated token (one
    transformers forward of the whole sequence, adapters off, as completions run)."""
    lm = engine.lm
    ids = torch.tensor([prompt_ids + generated[:-1]])
    with torch.no_grad(), adapter_scope(lm, None):
        logits = lm.model(input_ids=ids).logits[0].float()
    return torch.log_softmax(logits[len(prompt_ids) - 1:], dim=-1)


def test_completion_logprobs_equal_log_softmax_of_the_model_logits_streamed_or_not(server):
    kw = dict(model="kvlink-rag", prompt=PROMPT, max_tokens=6, temperature=0, logprobs=3,
              extra_body={"ignore_eos": True})
    done = server.client.completions.create(**kw)
    lp = done.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6
    tok = server.engine.lm.tokenizer
    prompt_ids = tok(PROMPT)["input_ids"]
    generated = tok(done.choices[0].text, add_special_tokens=False)["input_ids"]
    assert [tok.decode([t]) for t in generated] == lp.tokens  # the text re-tokenises to the generated ids
    direct = _direct_logprobs(server.engine, prompt_ids, generated)
    for i, t in enumerate(generated):
        assert lp.token_logprobs[i] == pytest.approx(float(direct[i, t]), abs=1e-3)
        top = torch.topk(direct[i], 3)
        want = {tok.decode([j]): v for j, v in zip(top.indices.tolist(), top.values.tolist())}
        assert set(lp.top_logprobs[i]) >= set(want)  # the sampled token is there too (vLLM's shape)
        for text, value in want.items():
            assert lp.top_logprobs[i][text] == pytest.approx(value, abs=1e-3)
        assert lp.token_logprobs[i] == pytest.approx(max(want.values()), abs=1e-6)  # greedy: the argmax
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(6)]
    chunks = list(server.client.completions.create(stream=True, **kw))
    streamed = [(t, v) for c in chunks if c.choices and c.choices[0].logprobs
                for t, v in zip(c.choices[0].logprobs.tokens, c.choices[0].logprobs.token_logprobs)]
    assert streamed == list(zip(lp.tokens, lp.token_logprobs))
    offsets = [o for c in chunks if c.choices and c.choices[0].logprobs for o in c.choices[0].logprobs.text_offset]
    assert offsets == lp.text_offset
    plain = server.client.completions.create(**{**kw, "logprobs": None})
    assert plain.choices[0].logprobs is None and plain.choices[0].text == done.choices[0].text


def test_chat_logprobs_and_top_logprobs_streamed_not_and_with_n(server):
    kw = dict(model="kvlink-rag", messages=[{"role": "user", "content": "Which volcano has a lava lake?"}],
              max_tokens=5, temperature=0, logprobs=True, top_logprobs=4,
              extra_body={"document_ids": ["volcano"], "ignore_eos": True})
    done = server.client.chat.completions.create(**kw)
    content = done.choices[0].logprobs.content
    assert len(content) == done.usage.completion_tokens == 5
    for e in content:
        assert len(e.top_logprobs) == 4 and e.logprob <= 0
        values = [t.logprob for t in e.top_logprobs]
        assert values == sorted(values, reverse=True) and e.logprob == pytest.approx(values[0], abs=1e-6)
        assert e.token == e.top_logprobs[0].token and bytes(e.bytes).decode("utf-8", "replace") == e.token
        assert math.fsum(math.exp(v) for v in values) <= 1 + 1e-4
    assert b"".join(bytes(e.bytes) for e in content).decode("utf-8", "replace").strip() == done.choices[0].message.content
    chunks = list(server.client.chat.completions.create(stream=True, **kw))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    # the same tokens; the logprobs to float32 rounding (the first request read its document from LMDB in its
    # stored order, the second reuses what the first left in the prefix tree and memory tiers)
    assert [e.token for e in streamed] == [e.token for e in content]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in content], abs=1e-5)
    two = server.client.chat.completions.create(n=2, **{**kw, "temperature": 1.0, "seed": 3})
    for c in two.choices:
        assert len(c.logprobs.content) == 5 and all(len(e.top_logprobs) == 4 for e in c.logprobs.content)
    explained = server.client.chat.completions.create(**{**kw, "extra_body": {**kw["extra_body"], "explain": True}})
    assert len(explained.choices[0].logprobs.content) == 5  # explain runs in the scheduler too
    bare = server.client.chat.completions.create(**{**kw, "top_logprobs": None})
    assert all(e.top_logprobs == [] for e in bare.choices[0].logprobs.content)
    assert [e.logprob for e in bare.choices[0].logprobs.content] == pytest.approx([e.logprob for e in content])


def test_the_same_seed_gives_the_same_sampled_tokens_through_the_scheduler(server):
    kw = dict(model="kvlink-rag", prompt=PROMPT, max_tokens=8, temperature=1.0, extra_body={"ignore_eos": True})
    runs = [server.client.completions.create(seed=s, **kw).choices[0].text for s in (11, 11, 12, 11)]
    assert runs[0] == runs[1] == runs[3] and runs[2] != runs[0]
    chat = dict(model="kvlink-rag", messages=[{"role": "user", "content": "Which volcano has a lava lake?"}],
                max_tokens=8, temperature=1.0, seed=7, extra_body={"document_ids": ["volcano"], "ignore_eos": True})
    a, b = (server.client.chat.completions.create(**chat).choices[0].message.content for _ in range(2))
    assert a == b


def test_bad_logprobs_and_response_format_get_a_4xx_naming_the_problem(server):
    chat = dict(model="kvlink-rag", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                extra_body={"document_ids": ["volcano"]})
    for bad, match in (({"top_logprobs": 2}, "top_logprobs needs logprobs"),
                       ({"logprobs": True, "top_logprobs": 21}, "less than or equal to 20"),
                       ({"response_format": {"type": "json_object"},
                         "extra_body": {"document_ids": ["volcano"], "ignore_eos": True}}, "ignore_eos")):
        with pytest.raises(openai.UnprocessableEntityError, match=match):
            server.client.chat.completions.create(**{**chat, **bad})
    for fmt, match in (({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}},
                        "Invalid type: nonsense"),
                       ({"type": "json_schema", "json_schema": {"name": "x"}}, "needs json_schema"),
                       ({"type": "yaml"}, "must be 'text', 'json_object' or 'json_schema'")):
        with pytest.raises(openai.BadRequestError, match=match):
            server.client.chat.completions.create(response_format=fmt, **chat)
    r = server.http.post("/v1/completions", json={"prompt": PROMPT, "logprobs": 6})
    assert r.status_code == 422 and "logprobs" in r.json()["error"]["message"], r.text
    r = server.http.post("/v1/completions", json={"prompt": PROMPT, "guided_json": {"type": "nonsense"}})
    assert r.status_code == 400 and "nonsense" in r.json()["error"]["message"], r.text
