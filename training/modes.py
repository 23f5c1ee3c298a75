"""Names of the evaluation modes and gold positions, and a mode's :class:`Retention` (no torch: the CLI checks its
arguments with them before loading the model)."""

from __future__ import annotations

from dataclasses import dataclass

from evaluation.nq import GOLD_POSITIONS

MODES = ("full", "naive", "linked", "linked-untrained", "full-adapted", "linked-query-lora")
FULL_MODES = ("full", "full-adapted")
ROTATION = ("first", "middle", "last")
EVAL_POSITIONS = (*GOLD_POSITIONS, "rotate")


@dataclass(frozen=True)
class Retention:
    """How much of each document a linked mode keeps: fraction ``r`` (0 < r <= 1) chosen by ``method``
    (``importance``, ``random`` or ``recency``, see :mod:`kvlink_rag.retention`); ``recompute_ratio``: the
    fraction of document tokens CacheBlend recomputes (:mod:`kvlink_rag.reuse.blend`, 0 = reuse only)."""

    r: float = 1.0
    method: str = "importance"
    explain: bool = False
    recompute_ratio: float = 0.0
