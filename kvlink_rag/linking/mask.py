"""The KVLink attention mask over a segment layout (Yang et al., 2025, arXiv 2502.16002, section 3).

Layout in position order: ``[prefix][d1][L1][d2][L2]...[dN][LN][question][answer]``.
- prefix tokens: causal within the prefix;
- document tokens: causal within their own document, and (anchored) also the prefix;
- link tokens, question and answer tokens: causal over everything before them.
"""

from __future__ import annotations

import torch

from .context import Segment

_SEES_ALL_BEFORE = ("link", "question", "answer")


def segment_rule(segments: list[Segment], anchored: bool) -> torch.Tensor:
    """``[S, S]`` bool: may segment ``i`` attend to (all of) an *earlier* segment ``j``."""
    n = len(segments)
    rule = torch.zeros(n, n, dtype=torch.bool)
    for i, si in enumerate(segments):
        for j, sj in enumerate(segments):
            if sj.start >= si.start:
                continue
            if si.kind in _SEES_ALL_BEFORE:
                rule[i, j] = True
            elif si.kind == "document" and anchored and sj.kind == "prefix":
                rule[i, j] = True
    return rule


def segment_ids(segments: list[Segment], positions: torch.Tensor) -> torch.Tensor:
    """``[tokens]`` int64: index of the segment holding each position id in ``positions``."""
    starts = torch.tensor([s.start for s in segments])
    order = torch.argsort(starts)
    idx = torch.searchsorted(starts[order], positions, right=True) - 1
    return order[idx]


def allowed(segments: list[Segment], anchored: bool, query_pos: torch.Tensor, key_pos: torch.Tensor) -> torch.Tensor:
    """``[queries, keys]`` bool: may the token at ``query_pos[i]`` attend to the one at ``key_pos[j]``.

    Args:
        segments: the layout; positions are contiguous and cover every queried position.
        query_pos, key_pos: ``[queries]``, ``[keys]`` int64 position ids (keys in storage order).
    """
    qs, ks = segment_ids(segments, query_pos), segment_ids(segments, key_pos)
    same = (qs[:, None] == ks[None, :]) & (key_pos[None, :] <= query_pos[:, None])
    return same | segment_rule(segments, anchored)[qs[:, None], ks[None, :]]


def additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bool ``[q, k]`` -> additive ``[1, 1, q, k]`` (0 where allowed, dtype min elsewhere) for eager and SDPA."""
    out = torch.zeros(mask.shape, dtype=dtype)
    out.masked_fill_(~mask, torch.finfo(dtype).min)
    return out[None, None]
