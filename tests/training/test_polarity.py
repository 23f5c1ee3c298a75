"""The polarity task (training/polarity.py): opposite documents, questions on either side, held apart from
the contrast check."""

import pytest

from evaluation.contrast import CASES
from evaluation.nq import normalize_answer
from training import polarity
from training.mixture import Mixture, train_sample, val_samples


def test_an_example_holds_both_polarities_and_the_answer_is_in_the_asked_document_only():
    for i in range(40):
        ex = polarity.make_example(i, 5)
        assert len(ex.docs) == 5 and len({d.text for d in ex.docs}) == 5
        listing = ex.answers[0]
        assert listing in ex.docs[ex.gold].text.lower()
        assert not any(listing in d.text.lower() for j, d in enumerate(ex.docs) if j != ex.gold)
        assert all(item in listing for item in ex.answers[1:]) and len(ex.answers) == 4
        assert (" not " in ex.question or "forbidden" in ex.question or "refuse" in ex.question
                or "against" in ex.question or "no longer" in ex.question) == ex.negative


def test_both_sides_are_asked_and_examples_are_deterministic():
    sides = [polarity.make_example(i).negative for i in range(60)]
    assert 15 < sum(sides) < 45
    assert polarity.make_example(7) == polarity.make_example(7)
    assert polarity.make_example(7) != polarity.make_example(7, seed=polarity.POLARITY_VAL_SEED)


def test_bad_counts_are_refused():
    with pytest.raises(ValueError, match="2..31 documents, not 1"):
        polarity.make_example(0, 1)
    with pytest.raises(ValueError, match="index -1"):
        polarity.make_example(-1)


def test_no_contrast_check_phrase_or_subject_occurs_in_the_generator():
    """The contrast check (evaluation/contrast.py) stays held out: none of its answer or contrast phrases is
    (or contains) a generated item, subject or frame word sequence."""
    vocab = [normalize_answer(w) for w in (*polarity.ITEMS, *polarity.SUBJECTS)]
    phrases = [normalize_answer(p) for c in CASES for p in (*c.answers, *c.wrong)]
    clash = [(p, w) for p in phrases for w in vocab if p in w or w in p]
    assert not clash
    generated = " ".join(d.text for i in range(200) for d in polarity.make_example(i, 6).docs)
    assert not any(c.gold.text[:40] in generated or c.contrast.text[:40] in generated for c in CASES)


def test_the_mixture_draws_polarity_examples_from_a_pool_and_validates_on_other_seeds():
    mix = Mixture(weights=(("polarity", 1.0),), pool=3).check()
    a, b = train_sample(mix, [], [], 0, 1), train_sample(mix, [], [], 0, 4)
    assert a.task == "polarity" and a.question == b.question and a.docs == b.docs and 2 <= len(a.docs) <= 6
    val = val_samples(mix, "polarity", [], [], 5)
    assert len(val) == 5 and all(len(s.docs) == 4 for s in val)
    assert not {s.docs for s in val} & {train_sample(mix, [], [], 0, i).docs for i in range(3)}
