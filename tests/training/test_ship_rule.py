"""The shipping rule (training/ship_rule.py): validation, the contrast check and the newcomer case, all needed."""

import pytest

from training.ship_rule import verdict

SHIPPED = {"nq": 0.935, "kv": 0.313, "long": 0.863, "retention": 2.329}


def test_the_2026_12_06_mixture_artifact_fails_on_the_contrast_check_and_the_newcomer_case():
    """Its validation (val_compare.json of that run) passed the old mean-only rule at 0.83."""
    mixture = {"nq": 1.007, "kv": 0.0715, "long": 0.905, "retention": 2.262}
    v = verdict(SHIPPED, mixture, [1.0] * 17 + [0.0] * 15, [1.0] * 16 + [0.0] * 16, newcomer_ok=False)
    assert not v.ships and v.rule_score == pytest.approx(0.831, abs=1e-3)
    assert v.contrast == (17, 16) and round(v.ratios["nq"], 3) == 1.077
    assert v.reasons == ["contrast check: 16 of 32 right against the shipped artifact's 17",
                         "newcomer case: the warranty question is not answered from the coverage note"]


def test_a_candidate_ships_when_all_three_hold():
    better = {t: v * 0.95 for t, v in SHIPPED.items()}
    v = verdict(SHIPPED, better, [1.0, 0.0, 0.0], [1.0, 1.0, 0.0], newcomer_ok=True)
    assert v.ships and v.reasons == [] and v.rule_score == pytest.approx(0.95) and v.contrast == (1, 2)


def test_one_task_much_worse_vetoes_a_lower_mean():
    mixed = {**{t: v * 0.5 for t, v in SHIPPED.items()}, "nq": 0.935 * 1.2}
    v = verdict(SHIPPED, mixed, [1.0], [1.0], newcomer_ok=True)
    assert not v.ships and v.rule_score < 1 and v.reasons == ["validation: nq 1.20 above 1.10 of the shipped NLL"]


def test_mismatched_inputs_are_refused():
    with pytest.raises(ValueError, match="validation tasks differ"):
        verdict(SHIPPED, {"nq": 1.0}, [1.0], [1.0], True)
    with pytest.raises(ValueError, match="contrast scores differ"):
        verdict(SHIPPED, SHIPPED, [1.0], [], True)
    with pytest.raises(ValueError, match="> 0"):
        verdict({"nq": 0.0}, {"nq": 1.0}, [1.0], [1.0], True)
