"""CacheBlend variants of the evaluation modes (``eval --recompute-ratio``).

A reuse mode at recompute ratio x > 0 runs with CacheBlend (:mod:`kvlink_rag.reuse.blend`): ``naive`` becomes
``cacheblend-x`` (no link tokens, x of the document tokens recomputed), a linked mode ``<mode>+blend-x``
(its link tokens and adapter, plus the recompute). Ratio 0 is the mode itself. Full-prefill modes have no
variants.
"""

from __future__ import annotations

from dataclasses import replace

from .modes import FULL_MODES, Retention


def blend_label(label: str, mode: str, ratio: float) -> str:
    """The row label of ``label`` (a label of ``mode``, e.g. ``"naive"`` or ``"linked r=0.5 random"``) at
    ``ratio``: ``cacheblend-0.15`` for naive, ``linked-query-lora+blend-0.15`` for a linked mode (any suffix of
    ``label`` after the mode name kept)."""
    rest = label[len(mode):]
    if mode == "naive":
        return f"cacheblend-{ratio:.2f}{rest}"
    return f"{mode}+blend-{ratio:.2f}{rest}"


def parse_ratios(text: str) -> list[float]:
    """``"0.05,0.15,0.3"`` -> ``[0.05, 0.15, 0.3]`` (distinct, in order).

    Raises:
        ValueError: an item is not a number in [0, 1], or the list is empty.
    """
    from kvlink_rag.bounds import check_recompute_ratio

    ratios = list(dict.fromkeys(check_recompute_ratio(x.strip()) for x in text.split(",") if x.strip()))
    if not ratios:
        raise ValueError("give at least one ratio in [0, 1], e.g. 0.05,0.15,0.3")
    return ratios


def blend_variants(variants: dict, ratios: list[float]) -> dict:
    """Label -> ``(mode, Retention or None)`` with every reuse variant at every ratio (ratio 0: as it is).

    Args:
        variants: label -> ``(mode, training.modes.Retention or None)`` (from the retention options).
        ratios: recompute ratios in [0, 1].
    """
    out: dict = {}
    for label, (mode, ret) in variants.items():
        if mode in FULL_MODES or (ret is not None and ret.explain):
            out[label] = (mode, ret)
            continue
        for x in ratios:
            if x == 0:
                out[label] = (mode, ret)
            else:
                out[blend_label(label, mode, x)] = (mode, replace(ret or Retention(), recompute_ratio=x))
    return out
