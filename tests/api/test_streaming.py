"""Streams (api.streaming): a refusal known before the first token is an HTTP status, the streamed text and
the final answer follow one decoding rule, and sampling without a seed is nondeterministic."""

from __future__ import annotations

import asyncio
import json

import pytest

from api.streaming import started
from api_helpers import parse_sse, wait_ready
from factories import real_tokenizer

CJK = "日本語の絵文字😀テスト"


def test_started_raises_what_fails_before_the_first_item_and_passes_the_rest_through():
    closed = []

    async def items(fail_at: int | None):
        try:
            for i in range(3):
                if i == fail_at:
                    raise ValueError(f"at {i}")
                yield i
        finally:
            closed.append(fail_at)

    async def collect(fail_at):
        return [i async for i in await started(items(fail_at))]

    with pytest.raises(ValueError, match="at 0"):
        asyncio.run(collect(0))
    assert asyncio.run(collect(None)) == [0, 1, 2]
    with pytest.raises(ValueError, match="at 2"):  # after the first item: the stream's own error handling
        asyncio.run(collect(2))
    assert closed == [0, None, 2]


@pytest.mark.parametrize("scheduler", [True, False])
def test_a_chat_stream_past_the_context_is_a_422_before_it_starts(make_client, tmp_path, scheduler):
    from factories import tiny_text_engine

    small = tiny_text_engine(tmp_path / "small", max_positions=96, max_new_tokens=4)
    with make_client(engine=small, scheduler=scheduler) as c:
        for doc_id in ("a", "b"):  # 33 tokens each: one fits, both with the prefix and link tokens do not
            assert c.post("/v1/documents", json={"id": doc_id, "text": "word " * 30}).status_code == 202
            wait_ready(c, doc_id)
        chat = {"messages": [{"role": "user", "content": "what is it?"}], "document_ids": ["a", "b"]}
        for path, body in (("/v1/chat/completions", chat), ("/v1/query", {"question": "what is it?",
                                                                          "document_ids": ["a", "b"]})):
            for stream in (False, True):
                r = c.post(path, json={**body, "stream": stream})
                assert r.status_code == 422 and r.json()["error"]["code"] == "context_too_long", (path, r.text)
        ok = c.post("/v1/chat/completions", json={**chat, "document_ids": ["a"], "stream": True})
        assert ok.status_code == 200 and parse_sse(ok.text)[-1][1] == "[DONE]"


@pytest.fixture
def forced_answer(monkeypatch):
    """The scheduler samples the tokens of ``CJK`` in turn (a reset per request), whatever the logits."""
    ids = real_tokenizer()(CJK, add_special_tokens=False)["input_ids"]
    calls = [0]

    def sample(logits, params, generator, generated=0):
        calls[0] += 1
        return ids[(calls[0] - 1) % len(ids)]

    monkeypatch.setattr("kvlink_rag.runtime.running.sample_next", sample)  # the batching scheduler
    monkeypatch.setattr("kvlink_rag.decoding.generate.sample_next", sample)  # the one-request path
    return calls


@pytest.mark.parametrize("scheduler", [True, False])
def test_stream_and_answer_agree_when_generation_ends_inside_a_character(make_client, fixture_docs, forced_answer,
                                                                         scheduler):
    with make_client(scheduler=scheduler) as c:
        _agree(c, fixture_docs, forced_answer)


def _agree(client, fixture_docs, forced_answer) -> None:
    client.post("/v1/documents", json=fixture_docs[1])
    wait_ready(client, "paris")
    for n in range(1, 13):  # 5 of these 12 lengths end inside a character's bytes
        ask = {"question": "Say it in Japanese.", "document_ids": ["paris"], "max_new_tokens": n}
        forced_answer[0] = 0
        whole = client.post("/v1/query", json=ask).json()["answer"]
        forced_answer[0] = 0
        events = parse_sse(client.post("/v1/query", json={**ask, "stream": True}).text)
        streamed = "".join(json.loads(d)["text"] for e, d in events if e == "token")
        assert streamed == whole == json.loads(events[-1][1])["answer"], n
        assert "\ufffd" not in whole and CJK.startswith(whole), (n, whole)
        forced_answer[0] = 0
        chat = {"messages": [{"role": "user", "content": "Say it in Japanese."}], "document_ids": ["paris"],
                "max_tokens": n}
        content = client.post("/v1/chat/completions", json=chat).json()["choices"][0]["message"]["content"]
        forced_answer[0] = 0
        chunks = [json.loads(d) for _, d in parse_sse(client.post("/v1/chat/completions",
                                                                  json={**chat, "stream": True}).text)[:-1]]
        assert "".join(ch["choices"][0]["delta"].get("content", "") for ch in chunks) == content == whole
    assert whole == "日本語の絵文字"  # 12 tokens: the emoji's first bytes are left out of both


def test_without_a_seed_sampling_differs_per_request_and_with_one_repeats(client, fixture_docs):
    client.post("/v1/documents", json=fixture_docs[1])
    wait_ready(client, "paris")
    ask = {"question": "What is the capital of France?", "document_ids": ["paris"], "temperature": 1,
           "max_new_tokens": 4}

    def answers(n, **extra):
        return [client.post("/v1/query", json={**ask, **extra}).json()["answer"] for _ in range(n)]

    seeded = answers(2, seed=0)
    assert seeded[0] == seeded[1] and answers(1, seed=0, stream=False) == seeded[:1]
    done = json.loads(parse_sse(client.post("/v1/query", json={**ask, "seed": 0, "stream": True}).text)[-1][1])
    assert done["answer"] == seeded[0]  # a stream with the same seed answers the same
    unseeded = answers(4)  # a random tiny model: near-uniform over 49k tokens at temperature 1
    assert len(set(unseeded)) > 1 and set(unseeded) != {seeded[0]}
    greedy = answers(2, temperature=0)
    assert greedy[0] == greedy[1]  # greedy needs no seed
