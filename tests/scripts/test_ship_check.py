"""scripts/ship_check.py's verdict JSON: the per-prompt contrast scores survive beside the verdict's counts."""

from __future__ import annotations

import json

from training.ship_rule import verdict


def test_report_keeps_the_per_prompt_scores_and_the_counts(script):
    nll = {"shipped": {"nq": 1.0, "kv": 0.4}, "candidate": {"nq": 0.9, "kv": 0.1}}
    scores = {"shipped": [(0, "first", 1.0), (0, "last", 1.0), (1, "first", 0.0)],
              "candidate": [(0, "first", 1.0), (0, "last", 0.0), (1, "first", 1.0)]}
    v = verdict(nll["shipped"], nll["candidate"], [s for *_, s in scores["shipped"]],
                [s for *_, s in scores["candidate"]], newcomer_ok=False)
    out = script("ship_check").report("a.safetensors", "b.safetensors", nll, scores, v)
    assert out["contrast_scores"] == scores
    assert out["contrast"] == (2, 2)
    assert out["ships"] is False and out["newcomer_ok"] is False
    assert out["ratios"] == {"kv": 0.25, "nq": 0.9}
    assert out["validation_nll"] == nll and out["candidate"] == "b.safetensors"


def test_the_kv_target_is_read_from_the_candidates_training_json(tmp_path, script):
    read = script("ship_check").trained_kv_answer
    art = tmp_path / "mixture.safetensors"
    assert read(art) == "value"  # no JSON beside it
    (tmp_path / "mixture.json").write_text(json.dumps({"config": {"mixture": {"kv_answer": "sentence"}}}))
    assert read(art) == "sentence"
    (tmp_path / "mixture.json").write_text(json.dumps({"config": {"mixture": {"weights": [["kv", 1.0]]}}}))
    assert read(art) == "value"  # trained before the option
    (tmp_path / "mixture.json").write_text(json.dumps({"config": {"mixture": None}}))
    assert read(art) == "value"  # trained on NQ alone
