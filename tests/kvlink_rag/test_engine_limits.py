"""Every length check counts prefix, documents, link tokens, question and new tokens (96-position model)."""

from __future__ import annotations

import pytest
import torch

from factories import tiny_text_engine
from kvlink_rag.types import ContextTooLong, Document

WORDS40, WORDS80 = Document("word " * 40), Document("word " * 80)  # 43 and 83 tokens with the framing


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return tiny_text_engine(tmp_path_factory.mktemp("limits"), max_positions=96, max_new_tokens=100)


def test_document_budget_counts_prefix_links_question_and_one_new_token(engine):
    assert (engine.prefix.num_tokens, engine.link_k, engine.min_question_tokens) == (29, 5, 9)
    assert engine.max_document_tokens() == 96 - 29 - 5 - 9 - 1
    assert engine.document_ids(WORDS80).numel() == 83
    with pytest.raises(ContextTooLong, match="document has 83 tokens; the longest this model can answer over is 52 "
                                             r"\(the model's context of 96 positions less the 29-token prefix"):
        engine.encode(WORDS80)


@pytest.mark.parametrize("full", [False, True], ids=["linked", "full-prefill"])
def test_answer_stops_at_the_context_end_with_finish_length(engine, full):
    ans = (engine.answer_full if full else engine.answer)("what is it?", [WORDS40])
    assert ans.context_tokens + len(ans.token_ids) == 96 and ans.finish_reason == "length"


def test_a_context_that_cannot_fit_is_refused_with_the_counts(engine):
    counts = r"the prompt needs 117 tokens \(prefix 29, 2 documents 66, link tokens 10, question 12\) plus 1 new token"
    with pytest.raises(ContextTooLong, match=counts):
        engine.answer("what is it?", [Document("word " * 30), Document("word " * 30)])
    with pytest.raises(ContextTooLong, match="plus 1 new token"):
        engine.answer_full("what is it?", [Document("word " * 30), Document("word " * 30)])


def _counting_encodes(engine, monkeypatch) -> list:
    """A copy of ``engine`` with an empty cache, and the list its encodes are recorded in."""
    import copy

    from kvlink_rag.cache import MemoryCache

    eng, calls = copy.copy(engine), []
    eng.cache = MemoryCache()
    monkeypatch.setattr(eng, "encode", lambda doc: calls.append(doc) or engine.encode(doc))
    return eng, calls


@pytest.mark.parametrize("reuse", [{}, {"retention": 0.5}, {"recompute_ratio": 0.5}],
                         ids=["linked", "retention", "cacheblend"])
def test_a_prompt_that_cannot_fit_is_refused_before_any_document_is_encoded(engine, monkeypatch, reuse):
    eng, calls = _counting_encodes(engine, monkeypatch)
    docs = [Document("word " * 30, "a"), Document("word " * 30)]
    message = (r"^the prompt needs 121 tokens \(prefix 29, 2 documents 70, link tokens 10, question 12\) plus 1 new "
               r"token\(s\); the model's context holds 96 tokens \(the longest, 'a', has 37 tokens\)$")  # titled: 4 more
    with pytest.raises(ContextTooLong, match=message):
        eng.answer("what is it?", docs, **reuse)
    assert calls == [] and eng.cache.get(eng.cache_key(docs[0])) is None


@pytest.mark.parametrize("links", ["last", "each"])
def test_a_long_document_counts_as_one_document_of_its_chunks(engine, monkeypatch, links, tmp_path):
    """Link tokens after the document's last chunk (the default), or after each chunk (chunks encoded alone)."""
    alone = links == "each" and tiny_text_engine(tmp_path, max_positions=96, max_new_tokens=100, chunk_context=0)
    eng, calls = _counting_encodes((alone or engine).with_chunk_tokens(64), monkeypatch)
    doc = Document("\n\n".join(f"Paragraph {i} says word " * 6 for i in range(12)), "notes")
    chunks = eng.chunks(doc)
    tokens = sum(int(eng.document_ids(c).numel()) for c in chunks)
    question = int(eng.template.question_ids(eng.lm.tokenizer, "what is it?").numel())
    assert len(chunks) > 2 and tokens > 96
    links = 5 * (len(chunks) if alone else 1)
    total = 29 + tokens + links + question
    with pytest.raises(ContextTooLong) as e:
        eng.answer("what is it?", [doc])
    assert str(e.value) == (f"the prompt needs {total} tokens (prefix 29, 1 document {tokens}, link tokens "
                            f"{links}, question {question}) plus 1 new token(s); the model's context holds "
                            f"96 tokens (document 'notes' has {tokens} tokens in {len(chunks)} chunks)")
    assert calls == [] and all(eng.cache.get(eng.cache_key(c)) is None for c in chunks)


def test_a_documents_ids_are_tokenised_once_and_stay_its_own(engine, monkeypatch):
    calls = []
    template = engine.template
    real = type(template).document_ids
    monkeypatch.setattr(type(template), "document_ids", lambda self, *a: calls.append(a[1:]) or real(self, *a))
    doc = Document("a memo a memo a memo", "Memo title")
    first = engine.document_ids(doc)
    engine.check_fits([doc, Document("a memo a memo a memo", "Memo title")], 12)
    assert torch.equal(engine.document_ids(doc), first) and len(calls) == 1
    other = engine.document_ids(Document("a memo a memo a memo", "Another title"))  # the title is part of the key
    assert len(calls) == 2 and not torch.equal(other, first)
