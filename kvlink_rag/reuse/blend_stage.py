"""CacheBlend inside the batching scheduler: the recompute as a request's prefill, then the fresh KV in place.

The one-request :func:`kvlink_rag.reuse.blend.blend` runs selection and blend as two forwards of its own. Here a
request's stages are: admission loads the reused caches into its sequence (``[prefix][docs]``, as for
link tokens) and scores them (:func:`blend_prefill`: :func:`kvlink_rag.reuse.blend.fresh_check_values` at the check
layer, :func:`kvlink_rag.reuse.blend.select_recompute`); the prefill the scheduler then runs in its steps, chunked
like any other, is ``[selected document tokens][link tokens][question]`` under the causal-by-position mask with
the selected tokens' stale (reused) slots hidden, in position order (so its chunks are exact); once it is complete :meth:`BlendFixup.apply` writes the
selected tokens' fresh K/V over their stale slots and closes the gap, so the sequence has the linker's
layout ``[prefix][docs][links][question]`` and decoding sees every slot (the same cache as ``blend``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..linking.context import PrefixKV
from ..linking.linker import slot_link_embeds
from ..linking.mask import additive
from ..model.loader import LoadedModel
from ..runtime.ragged import SequenceKV
from ..runtime.request_layout import PendingPrefill, RequestLayout
from .blend import CHECK_LAYER, _causal_mask, fresh_check_values, recompute_count, select_recompute


@dataclass
class BlendFixup:
    """Where a blend prefill's fresh document KV goes once the prefill is complete.

    Attributes:
        stale: ``[selected]`` int64 own-buffer slots (storage order) of the reused KV being recomputed.
        first_new: own-buffer slot of the prefill's first token.
        is_selected: ``[prefill tokens]`` bool, in prefill (position) order: a recomputed document token
            (else a link or question token).
    """

    stale: torch.Tensor
    first_new: int
    is_selected: torch.Tensor

    def apply(self, seq: SequenceKV) -> None:
        """Overwrite the stale slots with the fresh KV and move the link and question KV down after the
        documents (every layer; ``seq``'s own length shrinks by the number of selected tokens)."""
        n_sel, a, n = int(self.stale.numel()), self.first_new, int(self.is_selected.numel())
        if n_sel == 0:
            return
        sel = self.is_selected.to(seq.device)
        lo = min(int(self.stale.min()), a)
        idx = self.stale.to(seq.device) - lo
        k, v = (t.clone() for t in seq.own_kv(lo, a + n))  # [layers, kv_heads, a + n - lo, head_dim]
        for buf in (k, v):
            new = buf[:, :, a - lo: a - lo + n].clone()
            buf.index_copy_(2, idx, new[:, :, sel])
            buf[:, :, a - lo: a - lo + n - n_sel] = new[:, :, ~sel]
        seq.put(lo, k, v)
        seq.length -= n_sel


def _doc_inputs(lm: LoadedModel, lay: RequestLayout, doc_ids: list[torch.Tensor], slots: list[torch.Tensor]):
    """Embeddings ``[n, hidden]``, positions ``[n]`` and ``is_doc [n]`` of the documents' held tokens and the
    link tokens in position order ``[d1][L1]...[dN][LN]`` (as :func:`kvlink_rag.reuse.blend._context_inputs`)."""
    docs = [i for i, k in enumerate(lay.kinds) if k == "doc"]
    links = {lay.items[i][1]: i for i, k in enumerate(lay.kinds) if k == "link"}  # slot -> its link item
    embeds, pos, is_doc = [], [], []
    for j, i in enumerate(docs):
        off = lay.offsets.get(i, torch.arange(lay.sizes[i]))
        embeds.append(lm.embed_tokens(doc_ids[j][off].to(lm.device)))
        pos.append(lay.positions[i] + off)
        is_doc.append(torch.ones(len(off), dtype=torch.bool))
        if slots and j in links:  # no link tokens after a chunk joined to the next
            li = links[j]
            embeds.append(slots[j])
            pos.append(torch.arange(lay.positions[li], lay.positions[li] + lay.sizes[li]))
            is_doc.append(torch.zeros(lay.sizes[li], dtype=torch.bool))
    return torch.cat(embeds), torch.cat(pos), torch.cat(is_doc)


@torch.inference_mode()
def blend_prefill(lm: LoadedModel, lay: RequestLayout, start: int, seq: SequenceKV, prefix: PrefixKV,
                  doc_ids: list[torch.Tensor], link_embeds: torch.Tensor | None, pending: PendingPrefill,
                  ratio: float) -> tuple[PendingPrefill, BlendFixup]:
    """The blend prefill replacing ``pending`` (the link and question tokens of items ``start..``), and its fixup.

    Args:
        lay: the linked layout; its ``doc`` items (all in ``seq`` 's own buffer, the last of its committed
            tokens: admission matched no document in the prefix tree) precede ``start``.
        seq: the request's KV, reused documents re-rotated in place.
        prefix: the anchor prefix KV (positions ``0..P-1``; the selection forward runs after it).
        doc_ids: per document slot ``[tokens]`` int64 ids as encoded.
        link_embeds: ``[K, hidden]`` or ``[S, K, hidden]`` link embeddings in use, or None.
        pending: the link-token prefill (:func:`kvlink_rag.runtime.request_layout.pending_prefill`).
        ratio: the fraction of held document tokens recomputed, in (0, 1].
    """
    doc_items = [i for i, k in enumerate(lay.kinds) if k == "doc"]
    n_doc = sum(lay.sizes[i] for i in doc_items)
    first_doc = seq.length - n_doc  # own-buffer slot of the first document token
    doc_pos = lay.storage_positions(doc_items[0], doc_items[-1] + 1)  # [n_doc] layout positions
    selected = torch.zeros(0, dtype=torch.long)
    if recompute_count(n_doc, ratio):
        slots = slot_link_embeds(link_embeds.to(lm.device, lm.dtype), len(doc_items)) if link_embeds is not None else []
        embeds, pos, is_doc = _doc_inputs(lm, lay, doc_ids, slots)
        check = min(CHECK_LAYER, lm.num_layers - 1)
        fresh = fresh_check_values(lm, list(prefix.keys.to(lm.device, lm.dtype)),
                                   list(prefix.values.to(lm.device, lm.dtype)), embeds, pos, check)
        reused = seq.own_kv(first_doc, first_doc + n_doc)[1][check]
        selected = select_recompute(reused, fresh[:, is_doc.to(fresh.device)], ratio)
    streamed = torch.cat([doc_ids[j][lay.offsets.get(i, torch.arange(lay.sizes[i]))] for j, i in enumerate(doc_items)])
    # position order: a selected token of a later document comes after the link tokens before it, so every
    # token attends only to tokens computed before it (or in its own chunk) and chunked prefill stays exact
    new_pos = torch.cat([doc_pos[selected], pending.positions])
    order = torch.argsort(new_pos, stable=True)
    new_pos = new_pos[order]
    key_pos = lay.storage_positions(0, start)  # every slot in the sequence before the prefill
    stale = torch.zeros(key_pos.numel() + new_pos.numel(), dtype=torch.bool)
    stale[key_pos.numel() - n_doc + selected] = True
    mask = additive(_causal_mask(new_pos, torch.cat([key_pos, new_pos]), stale), lm.dtype)[0, 0].to(lm.device)
    embeds = torch.cat([lm.embed_tokens(streamed[selected].to(lm.device)), pending.embeds])[order.to(lm.device)]
    fixup = BlendFixup(first_doc + selected, seq.length, order < int(selected.numel()))
    return PendingPrefill(embeds, new_pos, mask), fixup
