"""Several training examples in one forward.

Example ``i`` has ``n_i`` cached tokens (prefix and documents, RoPE re-applied at its layout) and ``q_i`` new
tokens (link tokens, question, answer without its last token), as :func:`kvlink_rag.linking.linker.link` builds
them. On the training runner (:class:`training.train_forward.TrainForward`, what ``--pack`` runs) the new tokens
are packed as rows without padding and each example attends over its own cache and mask
(:class:`training.cached_attention.RaggedLayout`). Through transformers' decoder (the reference) the batch holds
the caches padded to ``max n_i`` and the new tokens padded to ``max q_i``; the additive mask
``[B, 1, max q, max n + max q]`` is each example's own KVLink mask with every padded column masked (a padded query
row attends to column 0 only, and its output is never read). Either way each example's logits are those of its
own forward, and the loss is the mean over examples of each one's mean answer cross-entropy - the accumulated
loss of :meth:`training.loop.Trainer.step` - in one forward and one backward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kvlink_rag.linking.context import PrefixKV
from kvlink_rag.linking.filled_kv import write_layers
from kvlink_rag.linking.rope import rope_cos_sin
from kvlink_rag.linking.linker import (_new_token_inputs, check_link_inputs, document_positions, plan_layout,
                               rotate_documents, segment_link_embeds)
from kvlink_rag.model.loader import LoadedModel
from kvlink_rag.types import DocumentKV, LayeredDocuments

from .cached_attention import RaggedLayout
from .train_forward import TrainForward


@dataclass
class PackItem:
    """One example: its documents (in slot order, or a retained layer stream), question ids ``[q]`` and
    answer ids ``[m + 1]`` (answer and end token) int64; ``joined``: per slot, no link tokens after it (chunks
    of one document, :meth:`kvlink_rag.engine_documents.EngineDocuments.joins`), None: after every slot."""

    docs: list[DocumentKV] | LayeredDocuments
    question_ids: torch.Tensor
    answer_ids: torch.Tensor
    joined: list[bool] | None = None


@dataclass
class _Layout:
    docs: LayeredDocuments  # the documents' layer stream (read once, by _fill_caches)
    segments: list  # the linker's layout (kvlink_rag.linking.linker.plan_layout)
    n: int  # cached tokens: prefix + streamed document tokens
    embeds: torch.Tensor  # [q, hidden]
    positions: torch.Tensor  # [q] int64
    mask: torch.Tensor  # [q, n + q] additive


def _layout(lm: LoadedModel, prefix: PrefixKV | None, item: PackItem, link_embeds: torch.Tensor | None,
            anchored: bool) -> _Layout:
    docs = item.docs if isinstance(item.docs, LayeredDocuments) else LayeredDocuments.from_documents(item.docs)
    new_ids = torch.cat([item.question_ids, item.answer_ids[:-1]])
    num_links = check_link_inputs(lm, prefix, docs, link_embeds, new_ids, 0, item.joined)
    p_len = prefix.num_tokens if prefix is not None else 0
    segments = plan_layout(p_len, docs.layout_lengths, num_links, int(new_ids.numel()), item.joined)
    slots = segment_link_embeds(link_embeds.to(lm.device, lm.dtype), segments) if num_links else []
    embeds, pos, mask, _ = _new_token_inputs(lm, segments, slots, new_ids, anchored, document_positions(segments, docs))
    return _Layout(docs, segments, p_len + sum(docs.num_tokens), embeds, pos, mask[0, 0])


def _fill_caches(lm: LoadedModel, prefix: PrefixKV | None, layouts: list[_Layout], k: list[list[torch.Tensor]],
                 v: list[list[torch.Tensor]], direct: bool) -> None:
    """Each example's cache, RoPE re-applied at its layout, into ``k[layer][i][:, :n_i]`` (and ``v``; each
    ``[kv_heads, >= n_i, head_dim]``). ``direct``: documents in CPU memory are written there straight from their
    stored rows, keys rotated on the way (:func:`kvlink_rag.linking.filled_kv.write_layers`: one pass, the bytes
    :func:`rotate_documents` would give)."""
    for i, lay in enumerate(layouts):
        n = lay.n
        if direct and lay.docs.fill is not None and lm.device.type == "cpu":
            cos, sin = rope_cos_sin(lm.rotary_emb, document_positions(lay.segments, lay.docs), torch.float32)
            write_layers(lm, lay.docs, cos, sin, prefix, lambda j: (k[j][i][:, :n], v[j][i][:, :n]))
        else:
            keys, values = rotate_documents(lm, lay.docs, lay.segments, prefix)
            for j in range(lm.num_layers):
                k[j][i][:, :n], v[j][i][:, :n] = keys[j], values[j]


def _pad_cache(lm: LoadedModel, prefix: PrefixKV | None, layouts: list[_Layout]
               ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The caches padded into one batch: per layer keys and values ``[B, kv_heads, N, head_dim]`` in the model's
    dtype (``N = max n_i``; padded columns zero)."""
    big_n, b = max(lay.n for lay in layouts), len(layouts)
    shape = (b, int(lm.config.num_key_value_heads), big_n, lm.head_dim)
    k = [torch.zeros(shape, dtype=lm.dtype, device=lm.device) for _ in range(lm.num_layers)]  # padding: zeros
    v = [torch.zeros(shape, dtype=lm.dtype, device=lm.device) for _ in range(lm.num_layers)]
    _fill_caches(lm, prefix, layouts, [list(t) for t in k], [list(t) for t in v], direct=False)
    return k, v


def _ragged(lm: LoadedModel, prefix: PrefixKV | None, layouts: list[_Layout], forward: TrainForward) -> tuple:
    """The own forward's inputs, no padding: ``forward``'s flat KV buffers with each example's cache, the new
    tokens' embeds ``[T, hidden]`` and positions ``[T]`` packed, and the :class:`RaggedLayout`."""
    layout = RaggedLayout(tuple(int(lay.embeds.shape[0]) for lay in layouts), tuple(lay.n for lay in layouts),
                          tuple(lay.mask.to(lm.device, torch.float32).contiguous() for lay in layouts))
    kv, hd = int(lm.config.num_key_value_heads), lm.head_dim
    k, v = forward.kv_buffers(layout.kv_size(kv, hd), lm.device)
    _fill_caches(lm, prefix, layouts, [layout.kv_views(t, kv, hd) for t in k], [layout.kv_views(t, kv, hd) for t in v],
                 direct=True)
    embeds = torch.cat([lay.embeds for lay in layouts]).to(lm.device)
    pos = torch.cat([lay.positions for lay in layouts]).to(lm.device)
    return k, v, embeds, pos, layout


def _pad_new(layouts: list[_Layout], big_n: int, dtype: torch.dtype, device) -> tuple:
    """Embeds ``[B, Q, hidden]``, positions ``[B, Q]``, the additive mask ``[B, 1, Q, N + Q]`` (``dtype``) and each
    example's number of new tokens."""
    n = [lay.n for lay in layouts]
    q = [lay.embeds.shape[0] for lay in layouts]
    big_q, b = max(q), len(layouts)
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
    return embeds, pos.to(device), mask.to(device), q


def _pad(lm: LoadedModel, prefix: PrefixKV | None, layouts: list[_Layout]) -> tuple:
    """Batched cache (per layer ``[B, kv_heads, N, head_dim]``), embeds ``[B, Q, hidden]``, positions ``[B, Q]``
    and the additive mask ``[B, 1, Q, N + Q]``, in the model's dtype."""
    keys, values = _pad_cache(lm, prefix, layouts)
    return keys, values, *_pad_new(layouts, keys[0].shape[2], lm.dtype, lm.device)


def packed_loss(lm: LoadedModel, prefix: PrefixKV | None, items: list[PackItem], link_embeds: torch.Tensor | None,
                anchored: bool, forward: TrainForward | None = None, adapter: str | None = None) -> torch.Tensor:
    """Mean over ``items`` of each example's mean answer cross-entropy (nats/token), one batched forward.

    Equals the mean of :func:`training.loop.example_loss` over the same examples (to float rounding); the
    graph reaches ``link_embeds`` and the adapter: with ``forward`` None, whatever adapter is active in
    transformers' decoder (the examples padded into one batch); else ``adapter`` (None: none) through ``forward``
    (:class:`training.train_forward.TrainForward`, the examples' new tokens packed without padding).

    Raises:
        ValueError, ContextTooLong: an example the linker would refuse (:func:`kvlink_rag.linking.linker.check_link_inputs`).
    """
    layouts = [_layout(lm, prefix, it, link_embeds, anchored) for it in items]
    if forward is None:
        keys, values, embeds, pos, mask, q = _pad(lm, prefix, layouts)
        out = lm.decoder(inputs_embeds=embeds, position_ids=pos, attention_mask=mask,
                         cache=_batched_cache(keys, values), use_cache=True)
        hidden = out.last_hidden_state  # [B, Q, hidden]
        rows = [hidden[i, : q[i]] for i in range(len(items))]
    else:
        keys, values, embeds, pos, layout = _ragged(lm, prefix, layouts, forward)
        packed = forward(adapter, embeds, pos, keys, values, layout)  # [T, hidden]
        rows = [packed[r0: r0 + n] for r0, n in zip(layout.starts, layout.new)]
    losses = []
    head = lm.family.lm_head(lm.model) if forward is None else forward.logits
    for r, it in zip(rows, items):
        m = int(it.answer_ids.numel())
        logits = head(r[-m:])
        losses.append(F.cross_entropy(logits.float(), it.answer_ids.to(logits.device)))
    return torch.stack(losses).mean()


def _batched_cache(keys: list[torch.Tensor], values: list[torch.Tensor]):
    from transformers import DynamicCache

    return DynamicCache(ddp_cache_data=list(zip(keys, values)))
