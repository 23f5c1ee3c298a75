"""The contrast check (evaluation/contrast.py): layouts in both orders and the metric that fails an answer taken
from the contrast document."""

import pytest

from evaluation.contrast import CASES, FIRST, build_documents, contrast_match, make_examples


def test_both_orders_put_the_answer_and_its_contrast_side_by_side():
    ex = make_examples()
    assert len(ex) == 48 and len({c.question for c in ex}) == 48 and FIRST == 16
    assert make_examples(16) == list(CASES[:16]) and CASES[0].question == "What does the warranty cover?"
    docs, slot = build_documents(ex, 0, 2, "first")
    assert (docs, slot) == ([ex[0].gold, ex[0].contrast], 0)
    docs, slot = build_documents(ex, 0, 2, "last")
    assert (docs, slot) == ([ex[0].contrast, ex[0].gold], 1)
    docs, slot = build_documents(ex, 3, 6, "middle")
    assert slot == 3 and docs[3] == ex[3].gold and docs[4] == ex[3].contrast and len(set(docs)) == 6
    assert all(d in {c.gold for c in CASES} for d in docs[:3] + docs[5:])


def test_every_answer_is_in_its_document_and_every_wrong_phrase_in_the_contrast_only():
    for c in CASES:
        assert any(a.lower() in c.gold.text.lower() for a in c.answers)
        assert all(w.lower() in c.contrast.text.lower() and w.lower() not in c.gold.text.lower() for w in c.wrong)


def test_an_answer_counts_only_without_the_contrast_documents_phrases():
    warranty = CASES[0]
    assert contrast_match("a faulty heating element", warranty.answers) == 1.0
    assert contrast_match("damage from dropping the kettle", warranty.answers) == 0.0
    assert contrast_match("a faulty heating element, but not limescale", warranty.answers) == 0.0
    assert contrast_match("The Wednesday, Thursday and Saturday", CASES[5].answers) == 1.0
    assert contrast_match("Monday, Tuesday and Saturday", CASES[5].answers) == 0.0  # the answer taken from both


def test_bad_counts_are_refused():
    with pytest.raises(ValueError, match="2..49 documents"):
        build_documents(make_examples(), 0, 1)
    with pytest.raises(ValueError, match="index 48 out of range"):
        build_documents(make_examples(), 48, 2)
    with pytest.raises(ValueError, match=">= 1"):
        make_examples(0)
