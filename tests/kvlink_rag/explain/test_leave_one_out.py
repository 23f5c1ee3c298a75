"""Leave-one-document-out attribution on a tiny random Llama with the real tokenizer: the answer's
log-likelihood equals teacher forcing the answer after an ordinary linked context, each drop is the
difference to re-linking without that document, and a chunked document is left out whole."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from factories import tiny_text_engine
from kvlink_rag.explain.leave_one_out import answer_log_likelihood, leave_one_out, with_leave_one_out
from kvlink_rag.types import Document

DOCS = [Document("The ferry leaves the harbour at seven every morning.", "Ferry"),
        Document("Granite quarries line the northern valley.", "Quarry"),
        Document("The lighthouse keeper trims the lamp at dusk.", "Lighthouse")]
QUESTION = "When does the ferry leave?"


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    eng = tiny_text_engine(tmp_path_factory.mktemp("loo"), max_new_tokens=4, link_k=2)
    assert eng.link_tokens is not None and eng.link_tokens.k == 2
    return eng


def teacher_forced(engine, docs: list[Document], answer: torch.Tensor) -> float:
    """log p(answer) from :meth:`Engine.link_context` then one forward of the answer on its cache."""
    ctx, _ = engine.link_context(QUESTION, docs)
    pos = torch.arange(ctx.next_position, ctx.next_position + answer.numel() - 1)
    with torch.inference_mode():
        out = engine.lm.model(input_ids=answer[None, :-1], position_ids=pos[None], cache=ctx.cache, use_cache=True)
    logits = torch.cat([ctx.last_logits[None], out.logits[0].float()])
    return -float(F.cross_entropy(logits, answer, reduction="sum"))


def test_the_answer_log_likelihood_and_each_drop_match_relinking_without_the_document(engine):
    answer = torch.tensor(engine.lm.tokenizer.encode(" at seven", add_special_tokens=False))
    kvs = [engine.get_or_encode(d)[0] for d in DOCS]
    q_ids = engine.template.question_ids(engine.lm.tokenizer, QUESTION)
    assert abs(answer_log_likelihood(engine, kvs, q_ids, answer) - teacher_forced(engine, DOCS, answer)) < 1e-3
    loo = leave_one_out(engine, QUESTION, DOCS, answer.tolist())
    assert loo.answer_tokens == answer.numel() and len(loo.drops) == 3
    for i in range(3):
        rest = DOCS[:i] + DOCS[i + 1:]
        assert abs(loo.drops[i] - (loo.log_likelihood - teacher_forced(engine, rest, answer))) < 1e-3
    positive = [max(d, 0.0) for d in loo.drops]
    assert loo.shares == pytest.approx([p / sum(positive) for p in positive]) if sum(positive) > 0 else \
        loo.shares == [0.0, 0.0, 0.0]


def test_one_token_answer_single_document_and_empty_answer(engine):
    one = leave_one_out(engine, QUESTION, DOCS[:2], [engine.lm.tokenizer.encode(" seven")[0]])
    assert one.answer_tokens == 1 and len(one.shares) == 2
    single = leave_one_out(engine, QUESTION, DOCS[:1], [5, 6])
    assert single.shares == [1.0] and single.drops == [0.0]
    empty = leave_one_out(engine, QUESTION, DOCS[:2], [])  # scores the stop token
    assert empty.answer_tokens == 1
    with pytest.raises(ValueError):
        leave_one_out(engine, QUESTION, [], [5])


def test_a_chunked_document_is_left_out_with_all_its_chunks(tmp_path):
    eng = tiny_text_engine(tmp_path, link_k=2, chunk_tokens=64)
    long = Document(" ".join(f"Paragraph {i} tells of the harbour lantern and the tidal ferry." for i in range(30)),
                    "Long")
    assert len(eng.chunks(long)) > 1
    loo = leave_one_out(eng, QUESTION, [DOCS[0], long], [5, 6, 7])
    kvs = [eng.get_or_encode(c)[0] for c in eng.chunks(DOCS[0])]
    q_ids = eng.template.question_ids(eng.lm.tokenizer, QUESTION)
    without_long = answer_log_likelihood(eng, kvs, q_ids, torch.tensor([5, 6, 7]))
    assert len(loo.drops) == 2 and abs(loo.drops[1] - (loo.log_likelihood - without_long)) < 1e-3


def test_with_leave_one_out_replaces_shares_and_keeps_passages():
    from kvlink_rag.explain.leave_one_out import LeaveOneOut

    body = {"prefix": 0.2, "documents": [{"share": 0.5, "passages": [{"start": 0, "end": 3, "share": 1.0}]},
                                         {"share": 0.3, "passages": []}], "method": "attention"}
    out = with_leave_one_out(body, LeaveOneOut(-2.0, [1.5, -0.5], [1.0, 0.0], 3))
    assert out["method"] == "leave_one_out" and out["answer_log_likelihood"] == -2.0 and out["prefix"] == 0.2
    assert [d["share"] for d in out["documents"]] == [1.0, 0.0]
    assert [d["log_likelihood_drop"] for d in out["documents"]] == [1.5, -0.5]
    assert out["documents"][0]["passages"] == body["documents"][0]["passages"]
    with pytest.raises(ValueError, match="1 leave-one-out scores for 2 documents"):
        with_leave_one_out(body, LeaveOneOut(0.0, [0.0], [1.0], 1))
