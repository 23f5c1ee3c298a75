"""Several training examples in one forward: each example's linked layout padded into one batch.

Example ``i`` has ``n_i`` cached tokens (prefix and documents, RoPE re-applied at its layout) and ``q_i`` new
tokens (link tokens, question, answer without its last token), as :func:`kvlink_rag.linking.linker.link` builds
them. The batch holds the caches padded to ``max n_i`` and the new tokens padded to ``max q_i``; the additive
mask ``[B, 1, max q, max n + max q]`` is each example's own KVLink mask with every padded column masked
(a padded query row attends to column 0 only, and its output is never read), so each example's logits are
those of its own forward. The loss is the mean over examples of each one's mean answer cross-entropy -
the accumulated loss of :meth:`training.loop.Trainer.step` - in one forward and one backward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kvlink_rag.linking.context import PrefixKV
from kvlink_rag.linking.linker import (_new_token_inputs, check_link_inputs, document_positions, plan_layout,
                               rotate_documents, slot_link_embeds)
from kvlink_rag.model.loader import LoadedModel
from kvlink_rag.types import DocumentKV, LayeredDocuments


@dataclass
class PackItem:
    """One example: its documents (in slot order, or a retained layer stream), question ids ``[q]`` and
    answer ids ``[m + 1]`` (answer and end token) int64."""

    docs: list[DocumentKV] | LayeredDocuments
    question_ids: torch.Tensor
    answer_ids: torch.Tensor


@dataclass
class _Layout:
    keys: list[torch.Tensor]  # per layer [kv_heads, n, head_dim]
    values: list[torch.Tensor]
    embeds: torch.Tensor  # [q, hidden]
    positions: torch.Tensor  # [q] int64
    mask: torch.Tensor  # [q, n + q] additive


def _layout(lm: LoadedModel, prefix: PrefixKV | None, item: PackItem, link_embeds: torch.Tensor | None,
            anchored: bool) -> _Layout:
    docs = item.docs if isinstance(item.docs, LayeredDocuments) else LayeredDocuments.from_documents(item.docs)
    new_ids = torch.cat([item.question_ids, item.answer_ids[:-1]])
    num_links = check_link_inputs(lm, prefix, docs, link_embeds, new_ids, 0)
    p_len = prefix.num_tokens if prefix is not None else 0
    segments = plan_layout(p_len, docs.layout_lengths, num_links, int(new_ids.numel()))
    keys, values = rotate_documents(lm, docs, segments, prefix)
    slots = slot_link_embeds(link_embeds.to(lm.device, lm.dtype), len(docs.num_tokens)) if num_links else []
    embeds, pos, mask, _ = _new_token_inputs(lm, segments, slots, new_ids, anchored, document_positions(segments, docs))
    return _Layout(keys, values, embeds, pos, mask[0, 0])


def _pad(layouts: list[_Layout], dtype: torch.dtype, device) -> tuple:
    """Batched cache (per layer ``[B, kv_heads, N, head_dim]``), embeds ``[B, Q, hidden]``, positions ``[B, Q]``
    and the additive mask ``[B, 1, Q, N + Q]``."""
    n = [lay.keys[0].shape[1] for lay in layouts]
    q = [lay.embeds.shape[0] for lay in layouts]
    big_n, big_q, b = max(n), max(q), len(layouts)
    kv_heads, head_dim = layouts[0].keys[0].shape[0], layouts[0].keys[0].shape[2]
    keys, values = [], []
    for layer in range(len(layouts[0].keys)):
        k = torch.empty(b, kv_heads, big_n, head_dim, dtype=dtype, device=device)
        v = torch.empty_like(k)
        for i, lay in enumerate(layouts):
            k[i, :, : n[i]] = lay.keys[layer]
            v[i, :, : n[i]] = lay.values[layer]
            k[i, :, n[i]:] = 0  # masked columns: any finite value
            v[i, :, n[i]:] = 0
        keys.append(k)
        values.append(v)
    hidden = layouts[0].embeds.shape[1]
    embeds = torch.zeros(b, big_q, hidden, dtype=layouts[0].embeds.dtype, device=device)
    pos = torch.zeros(b, big_q, dtype=torch.long)
    mask = torch.full((b, 1, big_q, big_n + big_q), torch.finfo(dtype).min, dtype=dtype)
    for i, lay in enumerate(layouts):
        embeds[i, : q[i]] = lay.embeds
        pos[i, : q[i]] = lay.positions
        pos[i, q[i]:] = lay.positions[-1] + 1 + torch.arange(big_q - q[i])
        mask[i, 0, : q[i], : n[i]] = lay.mask[:, : n[i]]
        mask[i, 0, : q[i], big_n: big_n + q[i]] = lay.mask[:, n[i]:]
        mask[i, 0, q[i]:, 0] = 0  # padded rows: one allowed column, output unused
    return keys, values, embeds, pos.to(device), mask.to(device), q


def packed_loss(lm: LoadedModel, prefix: PrefixKV | None, items: list[PackItem], link_embeds: torch.Tensor | None,
                anchored: bool) -> torch.Tensor:
    """Mean over ``items`` of each example's mean answer cross-entropy (nats/token), one batched forward.

    Equals the mean of :func:`training.loop.example_loss` over the same examples (to float rounding); the
    graph reaches ``link_embeds`` and whatever adapter is active.

    Raises:
        ValueError, ContextTooLong: an example the linker would refuse (:func:`kvlink_rag.linking.linker.check_link_inputs`).
    """
    layouts = [_layout(lm, prefix, it, link_embeds, anchored) for it in items]
    keys, values, embeds, pos, mask, q = _pad(layouts, lm.dtype, lm.device)
    out = lm.decoder(inputs_embeds=embeds, position_ids=pos, attention_mask=mask,
                     cache=_batched_cache(keys, values), use_cache=True)
    hidden = out.last_hidden_state  # [B, Q, hidden]
    losses = []
    head = lm.family.lm_head(lm.model)
    for i, it in enumerate(items):
        m = int(it.answer_ids.numel())
        logits = head(hidden[i, q[i] - m: q[i]])
        losses.append(F.cross_entropy(logits.float(), it.answer_ids.to(logits.device)))
    return torch.stack(losses).mean()


def _batched_cache(keys: list[torch.Tensor], values: list[torch.Tensor]):
    from transformers import DynamicCache

    return DynamicCache(ddp_cache_data=list(zip(keys, values)))
