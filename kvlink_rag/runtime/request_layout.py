"""A request's prompt as prefix-tree items in storage order, its KV, and the work left once a prefix matched.

Linked (KVLink): ``[prefix tokens][doc keys...][link slots...][conversation tokens]`` in storage order
(positions ``[prefix][d1][L1]...[dN][LN][conversation]``, as :func:`kvlink_rag.linking.linker.plan_layout`); the
prefix comes from the engine's prefix KV and documents from their stored caches (no forward), link slots
and conversation tokens are computed under the KVLink mask. Full prefill: every prompt token is an item,
computed causally. Generated tokens are appended as conversation items.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..linking.context import PrefixKV, Segment
from ..linking.linker import plan_layout, slot_link_embeds
from ..linking.mask import additive, allowed
from ..linking.rope import apply_rope, rope_cos_sin
from ..linking.rope_rows import block_writers
from ..model.loader import LoadedModel
from ..types import DocumentKV, LayeredDocuments
from .block_pool import kv_pool
from .kv_sequence import KVChunk, SequenceKV


@dataclass
class PendingPrefill:
    """New tokens waiting for their forward.

    Attributes:
        embeds: ``[n, hidden]`` input embeddings (compute dtype).
        positions: ``[n]`` int64 position ids.
        mask: additive ``[n, keys + n]`` over the sequence's keys and the new tokens (storage order), or
            None for plain causal continuation.
    """

    embeds: torch.Tensor
    positions: torch.Tensor
    mask: torch.Tensor | None

    @property
    def num_tokens(self) -> int:
        return int(self.embeds.shape[0])


COPY_SHARED_TOKENS = 256
"""Shared prefix-tree chunks of at most this many tokens in all (a system prompt, an anchor prefix) are copied
into the request's own KV: its decode steps then attend over one contiguous piece (one fused SDPA call per
layer) instead of a piece per chunk (bfloat16 on this CPU: ~4x slower per layer at 1,400 tokens); longer
matches (a conversation's history, documents seen before) stay shared, so what they save in memory stays
saved."""


def new_sequence(lm: LoadedModel, chunks: list[KVChunk], capacity: int) -> SequenceKV:
    """A request KV after ``chunks`` shaped for ``lm`` (``lm.kv_dtype``, model device) in ``lm``'s block pool
    (:func:`~kvlink_rag.runtime.block_pool.kv_pool`), with blocks for ``capacity`` own tokens; chunks of at
    most :data:`COPY_SHARED_TOKENS` tokens are copied in as its first own tokens (its ``shared_tokens`` is then
    0 and its ``length`` theirs).

    Raises:
        PoolExhausted: the pool has no room for ``capacity`` tokens.
    """
    cfg = lm.config
    shared = sum(c.num_tokens for c in chunks)
    copy = 0 < shared <= COPY_SHARED_TOKENS
    seq = SequenceKV([] if copy else chunks, lm.num_layers, cfg.num_key_value_heads, lm.head_dim, lm.kv_dtype,
                     lm.device, capacity + (shared if copy else 0), pool=kv_pool(lm))
    if copy:
        for c in chunks:
            seq.append(c.keys.to(lm.device), c.values.to(lm.device))
    return seq


@torch.inference_mode()
def prepare_tokens(lm: LoadedModel, token_ids: list[int], first_position: int) -> PendingPrefill:
    """Plain causal continuation: ``token_ids`` at positions ``first_position..`` (decode)."""
    ids = torch.tensor(token_ids, dtype=torch.long, device=lm.device)
    pos = torch.arange(first_position, first_position + len(token_ids))
    return PendingPrefill(lm.embed_tokens(ids), pos, None)


@dataclass
class RequestLayout:
    """Items, their token counts and positions, in storage order.

    Attributes:
        items: hashable items (int token ids, ``("doc", key)``, ``("link", slot)``).
        sizes: tokens per item.
        kinds: per item ``'prefix' | 'doc' | 'link' | 'text'``.
        positions: per item, the position id of its first token.
        segments: the KVLink layout (linked) or one question segment (full).
        anchored: documents were encoded after the prefix.
        linked: False for full prefill (every item computed causally).
        offsets: per ``doc`` item not held as ``0..n-1``, ``[n]`` int64 offsets within its slot of the tokens it
            holds, in storage order: kept only in part (retention below 1, sorted; the others' positions stay
            empty), or streamed in its record's stored order (:attr:`LayeredDocuments.positions`). Every query row
            sees a document's keys alike (link tokens, question and answer attend to whole documents before
            them; document tokens are never query rows here), so the order of a document's keys is free and a
            prefix-tree match may hold them in another order than this layout names.
    """

    items: list = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    anchored: bool = False
    linked: bool = True
    offsets: dict[int, torch.Tensor] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return sum(self.sizes)

    @property
    def next_position(self) -> int:
        """Position of the next token after the last item."""
        return self.positions[-1] + self.sizes[-1] if self.items else 0

    def add(self, item, size: int, kind: str, position: int) -> None:
        """Append ``item`` of ``size`` tokens and ``kind``, its first token at ``position``."""
        self.items.append(item)
        self.sizes.append(size)
        self.kinds.append(kind)
        self.positions.append(position)

    def append_text(self, token_id: int) -> None:
        """A generated (or fed) token after the last item."""
        self.add(int(token_id), 1, "text", self.next_position)

    def storage_positions(self, start: int = 0, end: int | None = None) -> torch.Tensor:
        """``[tokens]`` int64 position ids of the tokens of items ``start..end`` in storage order."""
        stop = len(self.items) if end is None else end
        parts = [self.positions[i] + self.offsets[i] if i in self.offsets
                 else torch.arange(self.positions[i], self.positions[i] + self.sizes[i]) for i in range(start, stop)]
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)


def linked_layout(prefix_ids: list[int], doc_keys: list[str], doc_lens: list[int], num_links: int,
                  text_ids: list[int], anchored: bool, kept: list[torch.Tensor] | None = None,
                  joined: list[bool] | None = None) -> RequestLayout:
    """Layout of a linked prompt (lengths in tokens; ``text_ids`` is the question or conversation).

    Args:
        kept: per document the ``[kept]`` int64 offsets of the tokens retention keeps (None: every token);
            a document's slot spans its whole length either way (dropped tokens keep their positions).
        joined: per document, no link tokens after it (:func:`~kvlink_rag.linking.linker.plan_layout`).
    """
    segs = plan_layout(len(prefix_ids), doc_lens, num_links, len(text_ids), joined)
    lay = RequestLayout(segments=segs, anchored=anchored, linked=True)
    for i, t in enumerate(prefix_ids):
        lay.add(int(t), 1, "prefix", i)
    for j, (key, s) in enumerate(zip(doc_keys, [s for s in segs if s.kind == "document"])):
        if kept is not None and int(kept[j].numel()) < s.length:
            lay.offsets[len(lay.items)] = kept[j].cpu()
            lay.add(("doc", key), int(kept[j].numel()), "doc", s.start)
        else:
            lay.add(("doc", key), s.length, "doc", s.start)
    for s in segs:
        if s.kind == "link":
            lay.add(("link", s.index), s.length, "link", s.start)
    for i, t in enumerate(text_ids, start=segs[-1].start):
        lay.add(int(t), 1, "text", i)
    return lay


def full_layout(prompt_ids: list[int]) -> RequestLayout:
    """Layout of an ordinary causal prompt: every token computed."""
    lay = RequestLayout(segments=[Segment("question", -1, 0, len(prompt_ids))], linked=False)
    for i, t in enumerate(prompt_ids):
        lay.add(int(t), 1, "text", i)
    return lay


def _rotate_into(lm: LoadedModel, seq: SequenceKV, docs: list[DocumentKV] | LayeredDocuments,
                 positions: torch.Tensor) -> None:
    """Append stored documents' KV to ``seq``, keys rotated at ``positions`` (``[tokens]``), written layer by
    layer straight into its blocks: a source that can write into them (:attr:`LayeredDocuments.fill`: the store
    read on this thread, or documents in memory) writes each layer's keys rotated on the way and its values there
    (:func:`~kvlink_rag.linking.rope_rows.block_writers`: one pass over the stored bytes); otherwise each layer
    arrives as tensors and is rotated into the blocks."""
    src = docs if isinstance(docs, LayeredDocuments) else LayeredDocuments.from_documents(docs)
    cos, sin = rope_cos_sin(lm.rotary_emb, positions.to(lm.device), torch.float32)
    n = int(positions.numel())
    seq.reserve(n)
    runs = seq.own_runs(seq.length, n)
    if src.fill is not None and len(runs) == 1 and seq.device.type == "cpu":
        run_k, run_v = runs[0]  # [layers, kv_heads, n, head_dim] views of the blocks
        keys, values = block_writers(cos, sin)  # keys rotated on their way into the blocks: one pass
        for i in range(lm.num_layers):
            src.fill(i, run_k[i], run_v[i], keys, values)
    else:
        for i, (k_raw, v) in enumerate(src.layers):  # k_raw, v: [kv_heads, tokens, head_dim], into the blocks
            seq.write(i, apply_rope(k_raw.to(lm.device).float(), cos, sin), v)
    seq.commit(n)


@torch.inference_mode()
def fill_cached(lm: LoadedModel, lay: RequestLayout, start: int, seq: SequenceKV, prefix: PrefixKV | None,
                docs: list[DocumentKV] | LayeredDocuments | None) -> int:
    """Append to ``seq`` the KV of the items from ``start`` that need no forward (prefix tokens from the
    prefix KV, documents re-rotated at their positions); returns the index of the first item to compute.

    Args:
        docs: the caches of the layout's ``doc`` items from ``start`` on, in order (None if there are none).
    """
    i = start
    while i < len(lay.items) and lay.kinds[i] == "prefix":
        i += 1
    if i > start:
        seq.append(prefix.keys[:, :, start:i].to(lm.device, seq.dtype),
                   prefix.values[:, :, start:i].to(lm.device, seq.dtype))
    j = i
    while j < len(lay.items) and lay.kinds[j] == "doc":
        j += 1
    if j > i:
        if isinstance(docs, LayeredDocuments) and docs.positions is not None:  # the order the KV arrives in
            for n, item in enumerate(range(i, j)):
                lay.offsets[item] = docs.offsets(n)
        _rotate_into(lm, seq, docs, lay.storage_positions(i, j))
    return j


@torch.inference_mode()
def pending_prefill(lm: LoadedModel, lay: RequestLayout, start: int, link_embeds: torch.Tensor | None
                    ) -> PendingPrefill:
    """The forward still needed for items ``start..``: link slots' embeddings, text tokens' embeddings,
    their positions and (linked) the KVLink mask over every key before and among them.

    Args:
        link_embeds: ``[K, hidden]`` or ``[S, K, hidden]`` link embeddings (None without link items).
    Raises:
        ValueError: nothing left to compute (the whole prompt matched: the caller keeps one item back).
    """
    if start >= len(lay.items):
        raise ValueError("nothing to compute: keep at least the last prompt token out of the match")
    n_slots = 1 + max((it[1] for it, k in zip(lay.items, lay.kinds) if k == "link"), default=-1)
    slots = slot_link_embeds(link_embeds.to(lm.device, lm.dtype), n_slots) if n_slots else []
    parts, run = [], []
    for i in range(start, len(lay.items)):
        if lay.kinds[i] not in ("link", "text"):
            raise ValueError(f"item {i} ({lay.kinds[i]}) needs no forward; fill_cached first")
        if lay.kinds[i] == "link":
            if run:
                parts.append(lm.embed_tokens(torch.tensor(run, device=lm.device)))
                run = []
            parts.append(slots[lay.items[i][1]])
        else:
            run.append(lay.items[i])
    if run:
        parts.append(lm.embed_tokens(torch.tensor(run, device=lm.device)))
    embeds = torch.cat(parts)  # [new_tokens, hidden]
    key_pos = lay.storage_positions()
    new_pos = lay.storage_positions(start)
    mask = None
    if lay.linked and any(k == "link" for k in lay.kinds[start:]):
        seg_list = _segments_with_text(lay)
        mask = additive(allowed(seg_list, lay.anchored, new_pos, key_pos), lm.dtype)[0, 0].to(lm.device)
    return PendingPrefill(embeds, new_pos, mask)


def _segments_with_text(lay: RequestLayout) -> list[Segment]:
    """The layout's segments with the question segment grown to every text item (generated ones too)."""
    segs = list(lay.segments)
    q = segs[-1]
    end = lay.next_position
    segs[-1] = Segment(q.kind, q.index, q.start, end - q.start)
    return segs
