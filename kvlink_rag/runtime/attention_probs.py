"""Attention probabilities of the rows that ask for them (explain), computed beside the runner's attention.

SDPA never materialises the probabilities. For a row flagged with a receiver (:class:`MassReceiver`, the
``attention`` of :class:`kvlink_rag.runtime.ragged.RaggedRow`) the runner also calls :func:`attention_mass`: the
explicit ``softmax(q K^T * scale + mask)`` in float32 (transformers' eager kernel), summed over heads and
the counted query rows, one ``[keys]`` vector per layer. The row's output still comes from the ordinary
kernel, so an explained answer is the same as the plain one; only these rows pay the extra matmul.
"""

from __future__ import annotations

from typing import Protocol

import torch


class MassReceiver(Protocol):
    """Takes one layer's attention mass of a row.

    Attributes:
        skip: the row's first query rows not counted (e.g. link tokens before the question).
    """

    skip: int

    def add(self, layer: int, mass: torch.Tensor) -> None:
        """``mass``: ``[keys]`` float32, probabilities summed over heads and counted rows (keys in storage order)."""


def attention_mass(q: torch.Tensor, pieces: list[tuple[torch.Tensor, torch.Tensor]], mask: torch.Tensor | None,
                   scale: float, skip: int = 0) -> torch.Tensor:
    """``[keys]`` float32 attention probabilities of query rows ``skip..`` summed over heads and rows.

    Args:
        q: ``[heads, n, head_dim]`` queries after RoPE; pieces: ``(k, v)`` ``[kv_heads, tokens_i, head_dim]`` in
            storage order (grouped-query: head ``h`` reads kv head ``h // (heads / kv_heads)``).
        mask: additive ``[n, keys]`` or None (every key visible); scale: softmax scale.
    """
    k = torch.cat([kk for kk, _ in pieces], dim=1).float()  # [kv_heads, keys, head_dim]
    k = k.repeat_interleave(q.shape[0] // k.shape[0], dim=0)  # [heads, keys, head_dim]
    scores = torch.matmul(q[:, skip:].float(), k.transpose(1, 2)) * scale  # [heads, n - skip, keys]
    if mask is not None:
        scores = scores + mask[skip:].float()
    return torch.softmax(scores, dim=-1).sum(dim=(0, 1))
