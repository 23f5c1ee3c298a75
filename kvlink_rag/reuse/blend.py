"""CacheBlend: reused document caches with a fraction of the document tokens recomputed in the joined context.

CacheBlend (Yao et al., EuroSys 2025, "CacheBlend: Fast Large Language Model Serving for RAG with Cached
Knowledge Fusion"; LMCache's blender, ``lmcache/v1/compute/blend``) needs no training: at a check layer
(layer 1, the first whose KV depends on other tokens) it computes fresh KV for every document token under
the joined context, picks the ``recompute_ratio`` fraction of document tokens whose reused KV deviates most
from the fresh one (high-KV-deviation tokens), and recomputes only those tokens, at every layer, their fresh
K/V overwriting the reused ones; every other document token keeps its reused (re-rotated) cache.

Here, in two forwards with explicit positions:

1. selection (:func:`select_recompute`): the document (and link) tokens run through layers ``0..check-1``
   causally after the prefix, adapters off; at the check layer their fresh values ``v_proj(h)`` are compared
   with the reused ones, squared L2 over heads and channels (as CacheBlend's reference code; LMCache v1
   compares keys). Layer 0's KV depends on the token alone, so reused and fresh agree there.
2. blend (:func:`blend`): one forward over ``[selected document tokens][link tokens][question]`` on top of
   the reused cache, every new token attending causally by position to all cache slots except the stale
   (reused) slots of the selected tokens, and to the new tokens before it. The selected tokens' fresh K/V
   then replace their stale slots, so the cache has the linker's layout.

``recompute_ratio`` 0 is the linker's output (naive reuse, or KVLink with link tokens); 1 is full prefill
of the same ids (with link tokens: the causal forward over prefix, documents, link tokens and question).
"""

from __future__ import annotations

import math
import time

import torch

from ..bounds import check_recompute_ratio  # noqa: F401 - re-exported: callers import it from here
from ..linking.context import LinkedContext, PrefixKV, Segment, Timings
from ..linking.kvcache import build_cache
from ..linking.linker import check_link_inputs, document_positions, plan_layout, rotate_documents, segment_link_embeds
from ..linking.mask import additive
from ..model.loader import LoadedModel
from ..model.lora import adapter_scope
from ..types import DocumentKV, LayeredDocuments

CHECK_LAYER = 1
"""Layer whose KV deviation picks the tokens to recompute (CacheBlend's and LMCache's ``check_layers=[1]``)."""


class _Stop(Exception):
    """Ends the selection forward once the check layer's values are captured."""


def recompute_count(tokens: int, ratio: float) -> int:
    """Document tokens recomputed at ``ratio``: ``floor(tokens * ratio)`` (as LMCache), all at ratio 1."""
    return min(tokens, int(math.floor(tokens * ratio + 1e-9)))


def kv_deviation(reused: torch.Tensor, fresh: torch.Tensor) -> torch.Tensor:
    """``[tokens]`` float32 squared L2 distance per token, summed over heads and channels.

    Args:
        reused, fresh: ``[kv_heads, tokens, head_dim]`` (any float dtype).
    """
    return ((fresh.float() - reused.float()) ** 2).sum(dim=(0, 2))


def _causal_mask(query_pos: torch.Tensor, key_pos: torch.Tensor, hidden: torch.Tensor | None = None) -> torch.Tensor:
    """``[queries, keys]`` bool: key position <= query position, and the key not in ``hidden`` (``[keys]`` bool)."""
    allowed = key_pos[None, :] <= query_pos[:, None]
    return allowed if hidden is None else allowed & ~hidden[None, :]


def _context_inputs(lm: LoadedModel, segments: list[Segment], docs: LayeredDocuments, doc_ids: list[torch.Tensor],
                    slots: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Embeddings and positions of the streamed document tokens and link tokens in layout order (``slots``: per
    link segment ``[K, hidden]``, :func:`~kvlink_rag.linking.linker.segment_link_embeds`).

    Returns:
        ``embeds [n, hidden]`` (compute dtype), ``pos [n]`` int64 and ``is_doc [n]`` bool.
    """
    embeds, pos, is_doc = [], [], []
    doc_starts = [s for s in segments if s.kind == "document"]
    links = {s.index: (s, e) for s, e in zip([s for s in segments if s.kind == "link"], slots)}
    for j, seg in enumerate(doc_starts):
        off = docs.offsets(j)
        embeds.append(lm.embed_tokens(doc_ids[j][off].to(lm.device)))
        pos.append(seg.start + off)
        is_doc.append(torch.ones(len(off), dtype=torch.bool))
        if j in links:
            link, e = links[j]
            embeds.append(e)
            pos.append(torch.arange(link.start, link.end))
            is_doc.append(torch.zeros(link.length, dtype=torch.bool))
    return torch.cat(embeds), torch.cat(pos), torch.cat(is_doc)


@torch.no_grad()
def fresh_check_values(lm: LoadedModel, prefix_k: list[torch.Tensor], prefix_v: list[torch.Tensor],
                       embeds: torch.Tensor, positions: torch.Tensor, check_layer: int = CHECK_LAYER) -> torch.Tensor:
    """Values of ``embeds`` at ``check_layer`` in a causal forward after the prefix (layers after it never run).

    Args:
        prefix_k, prefix_v: per layer ``[kv_heads, P, head_dim]`` prefix KV at positions ``0..P-1`` (P may be 0).
        embeds: ``[n, hidden]`` input embeddings; positions: ``[n]`` int64, all ``>= P``.
    Returns:
        ``[kv_heads, n, head_dim]`` fresh values (``v_proj`` output) in the compute dtype.
    """
    p_len = int(prefix_k[0].shape[1]) if prefix_k else 0
    key_pos = torch.cat([torch.arange(p_len), positions])
    mask = additive(_causal_mask(positions, key_pos), lm.dtype).to(lm.device)
    cache = build_cache(prefix_k, prefix_v) if p_len else None
    got: list[torch.Tensor] = []

    def capture(_module, _inputs, output):
        got.append(output)
        raise _Stop

    fam = lm.family
    handle = fam.parts(fam.layers(lm.model)[check_layer]).v.register_forward_hook(capture)
    try:
        with adapter_scope(lm, None):  # documents are encoded adapter-free; deviation is the context's alone
            lm.decoder(inputs_embeds=embeds[None], position_ids=positions.to(lm.device)[None],
                       attention_mask=mask, cache=cache, use_cache=cache is not None)
    except _Stop:
        pass
    finally:
        handle.remove()
    kv_heads = lm.config.num_key_value_heads
    return got[0][0].view(-1, kv_heads, lm.head_dim).transpose(0, 1)  # [kv_heads, n, head_dim]


def select_recompute(reused_v: torch.Tensor, fresh_v: torch.Tensor, ratio: float) -> torch.Tensor:
    """Indices (sorted, int64) of the ``recompute_count(tokens, ratio)`` tokens whose values deviate most.

    Args:
        reused_v, fresh_v: ``[kv_heads, tokens, head_dim]`` values of the document tokens at the check layer.
    """
    n = recompute_count(int(reused_v.shape[1]), ratio)
    if n == 0:
        return torch.zeros(0, dtype=torch.long)
    dev = kv_deviation(reused_v, fresh_v)
    return torch.sort(torch.topk(dev, n).indices.cpu()).values


@torch.no_grad()
def blend(lm: LoadedModel, prefix: PrefixKV | None, docs: list[DocumentKV] | LayeredDocuments,
          doc_ids: list[torch.Tensor], link_embeds: torch.Tensor | None, question_ids: torch.Tensor, *,
          recompute_ratio: float, new_tokens: int = 0, joined: list[bool] | None = None) -> LinkedContext:
    """The linked (or, without link tokens, naive) context with ``recompute_ratio`` of document tokens recomputed.

    Args:
        lm: the model (the caller's adapter scope applies to link, question and recomputed tokens).
        prefix: anchor prefix KV, or None.
        docs: stored document caches in slot order (keys before RoPE), in memory or streamed.
        doc_ids: per document ``[tokens]`` int64 ids as encoded (every token; kept offsets are taken from them).
        link_embeds: ``[K, hidden]`` or ``[S, K, hidden]`` link embeddings, or None (naive layout).
        question_ids: ``[question_tokens]`` int64.
        recompute_ratio: fraction of the (streamed) document tokens recomputed, in [0, 1].
        new_tokens: positions to keep free after the question.
        joined: per slot, no link tokens after it (:func:`kvlink_rag.linking.linker.plan_layout`).
    Returns:
        ``LinkedContext`` with the linker's layout ``[prefix][docs][links][question]``;
        ``timings.link_forward_s`` covers selection and blend forwards.
    Raises:
        ValueError: ratio outside [0, 1], ``doc_ids`` not one per document of the stored length, and as
            :func:`kvlink_rag.linking.linker.check_link_inputs`. ContextTooLong: the prompt does not fit.
    """
    ratio = check_recompute_ratio(recompute_ratio)
    if not isinstance(docs, LayeredDocuments):
        docs = LayeredDocuments.from_documents(docs) if docs else LayeredDocuments([], "", iter(()))
    num_links = check_link_inputs(lm, prefix, docs, link_embeds, question_ids, new_tokens, joined)
    if [int(i.numel()) for i in doc_ids] != list(docs.layout_lengths):
        raise ValueError(f"doc_ids lengths {[int(i.numel()) for i in doc_ids]} differ from the cached documents' "
                         f"{list(docs.layout_lengths)}")
    timings = Timings()
    p_len = prefix.num_tokens if prefix is not None else 0
    segments = plan_layout(p_len, docs.layout_lengths, num_links, int(question_ids.numel()), joined)
    t0 = time.perf_counter()
    keys, values = rotate_documents(lm, docs, segments, prefix)  # per layer [kv_heads, P + doc_tokens, head_dim]
    timings.load_s = docs.wait_s
    timings.rope_s = time.perf_counter() - t0 - docs.wait_s

    t0 = time.perf_counter()
    slots = segment_link_embeds(link_embeds.to(lm.device, lm.dtype), segments) if num_links else []
    doc_pos = document_positions(segments, docs)  # [doc_tokens] layout positions, storage order
    selected = torch.zeros(0, dtype=torch.long)
    if recompute_count(int(doc_pos.numel()), ratio):
        embeds, pos, is_doc = _context_inputs(lm, segments, docs, doc_ids, slots)
        check = min(CHECK_LAYER, lm.num_layers - 1)
        fresh = fresh_check_values(lm, [k[:, :p_len] for k in keys], [v[:, :p_len] for v in values], embeds, pos,
                                   check)
        selected = select_recompute(values[check][:, p_len:], fresh[:, is_doc.to(fresh.device)], ratio)
    cache, storage_pos, logits = _blend_forward(lm, keys, values, segments, slots, question_ids, doc_ids, docs,
                                                p_len, doc_pos, selected)
    timings.link_forward_s = time.perf_counter() - t0
    return LinkedContext(cache=cache, segments=segments, storage_positions=storage_pos,
                         next_position=segments[-1].end, last_logits=logits, timings=timings)


def _selected_ids(doc_ids: list[torch.Tensor], docs: LayeredDocuments, selected: torch.Tensor) -> torch.Tensor:
    """``[selected]`` int64 ids of the selected streamed document tokens (storage indices ``selected``)."""
    streamed = torch.cat([doc_ids[j][docs.offsets(j)] for j in range(len(doc_ids))])
    return streamed[selected]


def _blend_forward(lm: LoadedModel, keys: list[torch.Tensor], values: list[torch.Tensor], segments: list[Segment],
                   slots: list[torch.Tensor], question_ids: torch.Tensor, doc_ids: list[torch.Tensor],
                   docs: LayeredDocuments, p_len: int, doc_pos: torch.Tensor, selected: torch.Tensor):
    """One forward over ``[selected doc tokens][links][question]`` on the reused cache with the selected
    tokens' stale slots hidden; their fresh K/V then overwrite those slots.

    Returns:
        the cache (``[prefix][docs][links][question]``), ``[total]`` int64 storage positions and the
        ``[vocab]`` float32 logits after the question.
    """
    cached_pos = torch.cat([torch.arange(p_len), doc_pos])
    link_pos = [torch.arange(s.start, s.end) for s in segments if s.kind == "link"]
    q_seg = segments[-1]
    tail_pos = torch.cat(link_pos + [torch.arange(q_seg.start, q_seg.end)])
    sel_pos = doc_pos[selected]
    new_pos = torch.cat([sel_pos, tail_pos])
    stale = torch.zeros(cached_pos.numel() + new_pos.numel(), dtype=torch.bool)
    stale[p_len + selected] = True  # [cached + new]: the reused slots being recomputed
    mask = additive(_causal_mask(new_pos, torch.cat([cached_pos, new_pos]), stale), lm.dtype).to(lm.device)
    sel_embeds = lm.embed_tokens(_selected_ids(doc_ids, docs, selected).to(lm.device))
    q_embeds = lm.embed_tokens(question_ids.to(lm.device))
    embeds = torch.cat([sel_embeds] + slots + [q_embeds], dim=0)[None]  # [1, sel + N*K + q, hidden]
    out = lm.model(inputs_embeds=embeds, position_ids=new_pos.to(lm.device)[None], attention_mask=mask,
                   cache=build_cache(keys, values), use_cache=True, logits_to_keep=1)
    n_cached, n_sel = int(cached_pos.numel()), int(selected.numel())
    idx = (p_len + selected).to(lm.device)
    out_k, out_v = [], []
    for layer in out.cache.layers:
        k, v = layer.keys[0], layer.values[0]  # [kv_heads, cached + new, head_dim]
        kc = k[:, :n_cached].index_copy(1, idx, k[:, n_cached:n_cached + n_sel])
        vc = v[:, :n_cached].index_copy(1, idx, v[:, n_cached:n_cached + n_sel])
        out_k.append(torch.cat([kc, k[:, n_cached + n_sel:]], dim=1))
        out_v.append(torch.cat([vc, v[:, n_cached + n_sel:]], dim=1))
    storage_pos = torch.cat([cached_pos, tail_pos])
    return build_cache(out_k, out_v), storage_pos, out.logits[0, -1].float()
