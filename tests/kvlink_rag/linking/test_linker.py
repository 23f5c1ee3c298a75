"""Linker layout and input checks."""

import pytest
import torch

from factories import random_ids, tiny_model
from kvlink_rag.linking.document_prefill import encode_document, encode_prefix
from kvlink_rag.linking.linker import link, link_count, plan_layout
from kvlink_rag.types import ContextTooLong


def test_layout_is_contiguous_with_links_after_each_document():
    segs = plan_layout(4, [3, 5], 2, 6)
    assert [(s.kind, s.index, s.start, s.length) for s in segs] == [
        ("prefix", -1, 0, 4), ("document", 0, 4, 3), ("link", 0, 7, 2), ("document", 1, 9, 5),
        ("link", 1, 14, 2), ("question", -1, 16, 6)]
    assert [s.kind for s in plan_layout(0, [3], 0, 2)] == ["document", "question"]


def test_a_joined_document_has_no_link_tokens_after_it_and_positions_stay_contiguous():
    segs = plan_layout(4, [3, 5, 2], 2, 6, joined=[True, False, False])
    assert [(s.kind, s.index, s.start, s.length) for s in segs] == [
        ("prefix", -1, 0, 4), ("document", 0, 4, 3), ("document", 1, 7, 5), ("link", 1, 12, 2),
        ("document", 2, 14, 2), ("link", 2, 16, 2), ("question", -1, 18, 6)]
    assert link_count(3, [True, False, False]) == 2 and link_count(3, None) == 3


def test_bad_link_inputs():
    lm = tiny_model("llama")
    prefix = encode_prefix(lm, random_ids(4, 0))
    doc = encode_document(lm, random_ids(9, 1), kv_dtype="float32")
    q = random_ids(3, 2)
    with pytest.raises(ValueError, match="at least one document"):
        link(lm, prefix, [], None, q, anchored=False)
    with pytest.raises(ValueError, match="question is empty"):
        link(lm, prefix, [doc], None, torch.zeros(0, dtype=torch.long), anchored=False)
    with pytest.raises(ValueError, match="width 7"):
        link(lm, prefix, [doc], torch.zeros(2, 7), q, anchored=False)
    other = encode_document(lm, random_ids(9, 1), kv_dtype="float16")
    with pytest.raises(ValueError, match="different fingerprints"):
        link(lm, prefix, [doc, other], None, q, anchored=False)
    big = encode_document(lm, random_ids(1500, 3), kv_dtype="float32")
    with pytest.raises(ContextTooLong, match=r"needs 3007 tokens \(prefix 4, 2 documents 3000, link tokens 0, "
                       r"question 3\) plus 0 new token\(s\); the model's context holds 2048"):
        link(lm, prefix, [big, big], None, q, anchored=False)


def test_reordering_documents_changes_the_answer_context():
    """Slot order matters (positions differ), and the cache is rebuilt per query from the same stored KV."""
    lm = tiny_model("llama")
    prefix = encode_prefix(lm, random_ids(4, 0))
    a, b = (encode_document(lm, random_ids(n, s), kv_dtype="float32") for n, s in ((9, 1), (14, 2)))
    q = random_ids(3, 5)
    ab = link(lm, prefix, [a, b], torch.zeros(2, lm.config.hidden_size), q, anchored=False)
    ba = link(lm, prefix, [b, a], torch.zeros(2, lm.config.hidden_size), q, anchored=False)
    assert ab.next_position == ba.next_position == 4 + 9 + 14 + 4 + 3
    assert (ab.last_logits - ba.last_logits).abs().max() > 1e-4
    again = link(lm, prefix, [a, b], torch.zeros(2, lm.config.hidden_size), q, anchored=False)
    assert torch.equal(ab.last_logits, again.last_logits)
