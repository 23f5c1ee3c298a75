"""Retention below 1, CacheBlend recompute and explain run inside the batching scheduler and give what the
one-request reference gives (tiny model, float32); they share steps with plain queries; a request cancelled
during a step frees its KV when that step ends."""

from __future__ import annotations

import threading

import pytest
import torch

from factories import tiny_text_engine
from kvlink_rag.runtime.gen_request import GenRequest
from kvlink_rag.runtime.prefix_tree import PrefixTree
from kvlink_rag.runtime.limits import SchedulerLimits
from kvlink_rag.runtime.scheduler import Scheduler
from kvlink_rag.types import Document

DOCS = [Document(f"Document number {i} says the code word is kiwi{i} and other things {i * 7} of harbour {i}.",
                 f"T{i}") for i in range(8)]
Q = "what is the code word?"


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return tiny_text_engine(tmp_path_factory.mktemp("reuse"), max_new_tokens=5, kv_dtype="float32",
                            importance_scores=True)


def request(engine, docs, question=Q, sampling=None, **kw) -> GenRequest:
    ids = engine.template.question_ids(engine.lm.tokenizer, question).tolist()
    return GenRequest(lambda: engine, docs, ids, engine.sampling(**(sampling or {})), "linked", keep_logits=True, **kw)


def run_all(sched, reqs):
    handles = [sched.submit(r) for r in reqs]
    return [(list(h.tokens()), h.result) for h in handles]


@pytest.fixture
def sched(engine):
    s = Scheduler(engine.lm, PrefixTree(1 << 30), threading.Lock(), SchedulerLimits(max_step_tokens=16))
    yield s
    s.close()


def _last_layer(ctx):
    layer = ctx.cache.layers[-1]
    return layer.keys[0], layer.values[0]


@pytest.mark.parametrize("reuse", [{"retention": 0.5}, {"recompute_ratio": 0.3}, {"recompute_ratio": 1.0},
                                   {"retention": 0.6, "recompute_ratio": 0.4}])
def test_retention_and_cacheblend_in_the_scheduler_equal_the_one_request_context(engine, sched, reuse):
    docs = DOCS[:3]
    (toks, res), = run_all(sched, [request(engine, docs, **reuse)])  # chunked: max_step_tokens 16
    ctx, _ = engine.link_context(Q, docs, retention=reuse.get("retention", 1.0),
                                 recompute_ratio=reuse.get("recompute_ratio", 0.0))
    assert torch.allclose(res.logits[0], ctx.last_logits, atol=1e-4)
    k, v = _last_layer(ctx)  # the same cache, slot for slot: [prefix][docs][links][question]
    assert torch.allclose(res.last_layer_kv[0], k, atol=1e-4) and torch.allclose(res.last_layer_kv[1], v, atol=1e-4)
    single = engine.answer(Q, docs, retention=reuse.get("retention"), recompute_ratio=reuse.get("recompute_ratio"))
    assert toks == res.token_ids == single.token_ids and res.prompt_tokens == single.context_tokens


def test_explain_in_the_scheduler_equals_the_captured_attribution(engine, sched):
    from kvlink_rag.explain.answers import attribution, explain_answer

    docs = DOCS[2:5]
    (toks, res), = run_all(sched, [request(engine, docs, explain=True, retention=0.8)])
    ans, ref = explain_answer(engine, Q, docs, retention=0.8)
    assert toks == ans.token_ids
    mass, ctx = res.attention
    got = attribution(engine, mass, ctx, docs)
    assert got.prefix == pytest.approx(ref.prefix, abs=1e-4)
    for a, b in zip(got.documents, ref.documents, strict=True):
        assert a.share == pytest.approx(b.share, abs=1e-4)
        assert torch.allclose(a.token_mass, b.token_mass, atol=1e-3)
        # the same spans; their weights to float32 rounding (on CUDA the sums differ in the 8th digit)
        assert [p[:2] for p in a.passages] == [p[:2] for p in b.passages]
        assert [p[2] for p in a.passages] == pytest.approx([p[2] for p in b.passages], abs=1e-6)


def test_reuse_requests_share_steps_with_a_plain_query(engine, sched):
    rows_per_step = []
    sched.observe = lambda rows, waits: rows_per_step.append(rows)
    whole = {"ignore_eos": True}  # every request decodes its whole budget
    reqs = [request(engine, DOCS[0:2], sampling=whole), request(engine, DOCS[2:4], sampling=whole, explain=True),
            request(engine, DOCS[4:6], sampling=whole, retention=0.5),
            request(engine, DOCS[6:8], sampling=whole, recompute_ratio=0.3)]
    results = run_all(sched, reqs)
    assert all(len(t) == 5 for t, _ in results) and results[1][1].attention is not None
    assert max(rows_per_step) == 4  # all four computed in the same steps
    alone = [run_all(sched, [request(engine, r.docs, retention=r.retention, recompute_ratio=r.recompute_ratio,
                                     explain=r.explain)])[0] for r in reqs]
    for (t, res), (_, one) in zip(results, alone):
        assert torch.allclose(res.logits[0], one.logits[0], atol=1e-4)  # batching changes nothing


def test_a_request_cancelled_during_a_step_frees_its_kv_when_the_step_ends(engine, sched, monkeypatch):
    import kvlink_rag.runtime.model_runner as mr

    req = request(engine, DOCS[:2], sampling={"ignore_eos": True, "max_new_tokens": 64})
    handle = sched.submit(req)
    tokens = handle.tokens()
    next(tokens)  # decoding now
    seen, real = {}, mr.forward_ragged

    def cancelling(lm, batch, embeds, positions, between_layers=None):
        out = real(lm, batch, embeds, positions, between_layers)
        if "rr" not in seen:
            seen["rr"] = next(rr for h, rr in sched.running if h is handle)
            handle.cancel()  # the client leaves while the step's forward runs
        return out

    def after_step(rows, waits):
        if "rr" in seen and "freed" not in seen:
            seen["freed"] = (seen["rr"].seq is None, all(h is not handle for h, _ in sched.running),
                             sched.tree.stats()["pinned_nodes"], sched.stats()["running_own_bytes"])

    monkeypatch.setattr(mr, "forward_ragged", cancelling)
    sched.observe = after_step
    deadline = threading.Event()
    for _ in range(200):
        if "freed" in seen:
            break
        deadline.wait(0.05)
    assert seen["freed"] == (True, True, 0, 0)  # right after the step it was cancelled in
    tokens.close()
