"""The ranges of the reuse fractions, checked without torch: retention (the share of each document's tokens kept,
:mod:`kvlink_rag.retention`) and CacheBlend's recompute ratio (:mod:`kvlink_rag.reuse.blend`). The CLI checks its
options with these before any model or torch import, so a bad value answers at once."""

from __future__ import annotations

import math

METHODS = ("importance", "random", "recency")
"""Which tokens a retention below 1 keeps (:mod:`kvlink_rag.retention`)."""


def check_retention(r: float) -> float:
    """``r`` as a float when ``0 < r <= 1``.

    Raises:
        ValueError: ``r`` outside ``(0, 1]`` or not a number (the message names the range).
    """
    try:
        value = float(r)
    except (TypeError, ValueError):
        raise ValueError(f"retention must be a number in (0, 1], got {r!r}") from None
    if not 0.0 < value <= 1.0 or math.isnan(value):
        raise ValueError(f"retention must be in (0, 1] (the fraction of each document's tokens kept), got {r}")
    return value


def check_recompute_ratio(ratio: float) -> float:
    """``ratio`` as a float when it is within [0, 1].

    Raises:
        ValueError: outside [0, 1] or not a number.
    """
    try:
        r = float(ratio)
    except (TypeError, ValueError):
        raise ValueError(f"recompute_ratio must be a number in [0, 1], got {ratio!r}") from None
    if not 0.0 <= r <= 1.0:  # NaN fails too
        raise ValueError(f"recompute_ratio must be within [0, 1] (fraction of document tokens recomputed), got {ratio}")
    return r
