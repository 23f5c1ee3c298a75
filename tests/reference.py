"""Reference forward passes with transformers itself, under explicitly built 4-D masks.

The masks here are written out independently of ``kvlink_rag.linking.mask`` so that the tests check the
linker against the definition, not against itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvlink_rag.linking.kvcache import cache_tensors


@dataclass
class Piece:
    """A span of the reference sequence.

    kind: prefix | document | link | question | prefix-copy | answer; ``ids`` or ``embeds`` give its
    content; ``positions`` its position ids; ``owner`` ties a prefix copy to its document; ``visible``
    (``[len]`` bool, documents) which of its tokens later link, question and answer tokens may see (the
    kept tokens of a partly retained document; None: all).
    """

    kind: str
    positions: torch.Tensor
    ids: torch.Tensor | None = None
    embeds: torch.Tensor | None = None
    owner: int = -1
    visible: torch.Tensor | None = None


def reference_mask(pieces: list[Piece]) -> torch.Tensor:
    """``[T, T]`` bool in sequence order.

    Documents see themselves causally (and their prefix copy, if any); prefix and prefix copies see
    themselves causally; link, question and answer tokens see every earlier piece except prefix copies.
    """
    spans, t = [], 0
    for p in pieces:
        spans.append((t, t + len(p.positions)))
        t += len(p.positions)
    m = torch.zeros(t, t, dtype=torch.bool)
    for i, (p, (a, b)) in enumerate(zip(pieces, spans)):
        m[a:b, a:b] = torch.tril(torch.ones(b - a, b - a, dtype=torch.bool))
        for j, (q, (c, d)) in enumerate(zip(pieces[:i], spans[:i])):
            if p.kind in ("link", "question", "answer") and q.kind != "prefix-copy":
                m[a:b, c:d] = True if q.visible is None else q.visible[None, :]
            if p.kind == "document" and q.kind == "prefix-copy" and q.owner == i:
                m[a:b, c:d] = True
    return m


@torch.no_grad()
def reference_forward(lm, pieces: list[Piece]):
    """One transformers forward over ``pieces`` with :func:`reference_mask`.

    Returns:
        ``(logits [T, vocab] float32, keys, values [layers, kv_heads, T, head_dim], positions [T])``.
    """
    embeds = torch.cat([p.embeds if p.embeds is not None else lm.embed_tokens(p.ids) for p in pieces])[None]
    pos = torch.cat([p.positions for p in pieces])
    allowed = reference_mask(pieces)
    mask = torch.zeros(allowed.shape, dtype=lm.dtype, device=lm.device).masked_fill(
        ~allowed.to(lm.device), torch.finfo(lm.dtype).min)
    out = lm.model(inputs_embeds=embeds, position_ids=pos[None], attention_mask=mask[None, None], use_cache=True)
    k, v = cache_tensors(out.cache)
    return out.logits[0].float(), k, v, pos


def kv_by_position(keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor, wanted: torch.Tensor):
    """Select the ``[layers, kv_heads, len(wanted), head_dim]`` slots whose position ids are ``wanted``.

    Raises:
        AssertionError: a wanted position is missing or ambiguous.
    """
    idx = []
    for p in wanted.tolist():
        hits = (positions == p).nonzero().flatten()
        assert len(hits) == 1, f"position {p} found {len(hits)} times"
        idx.append(int(hits[0]))
    idx_t = torch.tensor(idx)
    return keys[:, :, idx_t], values[:, :, idx_t]
