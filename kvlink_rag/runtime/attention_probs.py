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
        exclude_self: a query's probability on its own key not counted (H2O's importance: attention
            received from later tokens).
    """

    skip: int
    exclude_self: bool

    def add(self, layer: int, mass: torch.Tensor) -> None:
        """``mass``: ``[keys]`` float32, probabilities summed over heads and counted rows (keys in storage order)."""


ROW_BLOCK = 256  # query rows per block: a block's scores stay in cache, the masked tail of its keys is skipped


def attention_mass(q: torch.Tensor, pieces: list[tuple[torch.Tensor, torch.Tensor]], mask: torch.Tensor | None,
                   scale: float, skip: int = 0, exclude_self: bool = False) -> torch.Tensor:
    """``[keys]`` float32 attention probabilities of query rows ``skip..`` summed over heads and rows.

    Computed in blocks of :data:`ROW_BLOCK` query rows, each query group against its own kv head (no copy
    of the keys per head), and only over the keys some row of the block can see (a causal block skips the
    keys after its last row: half the work of a document's own prefill).

    Args:
        q: ``[heads, n, head_dim]`` queries after RoPE; pieces: ``(k, v)`` ``[kv_heads, tokens_i, head_dim]`` in
            storage order (grouped-query: head ``h`` reads kv head ``h // (heads / kv_heads)``); the last ``n``
            keys are the queries' own.
        mask: additive ``[n, keys]`` or None (every key visible); scale: softmax scale.
        exclude_self: leave out each query's probability on its own key.
    """
    k = torch.cat([kk for kk, _ in pieces], dim=1) if len(pieces) > 1 else pieces[0][0]
    k = k.float()  # [kv_heads, keys, head_dim]
    kv, keys, d = k.shape
    heads, n = int(q.shape[0]), int(q.shape[1])
    g = heads // kv
    mass = torch.zeros(keys, dtype=torch.float32, device=q.device)
    for a in range(skip, n, ROW_BLOCK):
        b = min(n, a + ROW_BLOCK)
        m = None if mask is None else mask[a:b].float()
        cols = keys if m is None else int((m > torch.finfo(torch.float32).min / 2).any(0).nonzero().max()) + 1
        qs = q[:, a:b].float().reshape(kv, g * (b - a), d)  # head h = kv head h // g
        s = torch.matmul(qs, k[:, :cols].transpose(1, 2)).mul_(scale).view(kv, g, b - a, cols)
        if m is not None:
            s.add_(m[:, :cols])
        p = torch.softmax(s, dim=-1).sum(dim=(0, 1))  # [rows, cols]
        mass[:cols] += p.sum(0)
        if exclude_self:
            rows = torch.arange(b - a, device=q.device)
            own = rows + (keys - n + a)  # each query's own key
            mass.index_add_(0, own, -p[rows, own])
    return mass
