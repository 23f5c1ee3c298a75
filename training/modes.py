"""Names of the evaluation modes and gold positions (no torch: the CLI checks its arguments with them
before loading the model)."""

from __future__ import annotations

from evaluation.nq import GOLD_POSITIONS

MODES = ("full", "naive", "linked", "linked-untrained", "full-adapted", "linked-query-lora")
FULL_MODES = ("full", "full-adapted")
ROTATION = ("first", "middle", "last")
EVAL_POSITIONS = (*GOLD_POSITIONS, "rotate")
