"""A request's prompt as prefix-tree items in storage order, and the work left once a prefix matched.

Linked (KVLink): ``[prefix tokens][doc keys...][link slots...][conversation tokens]`` in storage order
(positions ``[prefix][d1][L1]...[dN][LN][conversation]``, as :func:`kvlink_rag.linker.plan_layout`); the
prefix comes from the engine's prefix KV and documents from their stored caches (no forward), link slots
and conversation tokens are computed under the KVLink mask. Full prefill: every prompt token is an item,
computed causally. Generated tokens are appended as conversation items.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .link_prefill import PendingPrefill
from .linker import plan_layout, slot_link_embeds
from .mask import additive, allowed
from .model import LoadedModel
from .ragged import SequenceKV
from .rope import apply_rope, rope_cos_sin
from .types import DocumentKV, LayeredDocuments, PrefixKV, Segment


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
    """

    items: list = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    anchored: bool = False
    linked: bool = True

    @property
    def num_tokens(self) -> int:
        return sum(self.sizes)

    @property
    def next_position(self) -> int:
        """Position of the next token after the last item."""
        return self.positions[-1] + self.sizes[-1] if self.items else 0

    def append_text(self, token_id: int) -> None:
        """A generated (or fed) token after the last item."""
        self.positions.append(self.next_position)
        self.items.append(int(token_id))
        self.sizes.append(1)
        self.kinds.append("text")

    def storage_positions(self, n_items: int | None = None) -> torch.Tensor:
        """``[tokens]`` int64 position ids of the first ``n_items`` items' tokens in storage order."""
        parts = [torch.arange(p, p + s) for p, s in zip(self.positions[:n_items], self.sizes[:n_items])]
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)


def linked_layout(prefix_ids: list[int], doc_keys: list[str], doc_lens: list[int], num_links: int,
                  text_ids: list[int], anchored: bool) -> RequestLayout:
    """Layout of a linked prompt (lengths in tokens; ``text_ids`` is the question or conversation)."""
    segs = plan_layout(len(prefix_ids), doc_lens, num_links, len(text_ids))
    lay = RequestLayout(segments=segs, anchored=anchored, linked=True)
    for i, t in enumerate(prefix_ids):
        lay.items.append(int(t)), lay.sizes.append(1), lay.kinds.append("prefix"), lay.positions.append(i)
    docs = [s for s in segs if s.kind == "document"]
    links = [s for s in segs if s.kind == "link"]
    for key, s in zip(doc_keys, docs):
        lay.items.append(("doc", key)), lay.sizes.append(s.length), lay.kinds.append("doc"), lay.positions.append(s.start)
    for s in links:
        lay.items.append(("link", s.index)), lay.sizes.append(s.length), lay.kinds.append("link")
        lay.positions.append(s.start)
    start = segs[-1].start
    for i, t in enumerate(text_ids):
        lay.items.append(int(t)), lay.sizes.append(1), lay.kinds.append("text"), lay.positions.append(start + i)
    return lay


def full_layout(prompt_ids: list[int]) -> RequestLayout:
    """Layout of an ordinary causal prompt: every token computed."""
    lay = RequestLayout(segments=[Segment("question", -1, 0, len(prompt_ids))], linked=False)
    for i, t in enumerate(prompt_ids):
        lay.items.append(int(t)), lay.sizes.append(1), lay.kinds.append("text"), lay.positions.append(i)
    return lay


def _rotate_into(lm: LoadedModel, seq: SequenceKV, docs: list[DocumentKV] | LayeredDocuments,
                 positions: torch.Tensor) -> None:
    """Append stored documents' KV to ``seq``, keys rotated at ``positions`` (``[tokens]``), written layer by
    layer straight into its buffers (no intermediate copy of all layers)."""
    src = docs if isinstance(docs, LayeredDocuments) else LayeredDocuments.from_documents(docs)
    cos, sin = rope_cos_sin(lm.rotary_emb, positions.to(lm.device), torch.float32)
    n = int(positions.numel())
    seq.reserve(n)
    at = seq.length
    for i, (k_raw, v) in enumerate(src.layers):  # k_raw, v: [kv_heads, tokens, head_dim]
        seq.keys[i, :, at: at + n] = apply_rope(k_raw.to(lm.device).float(), cos, sin)
        seq.values[i, :, at: at + n] = v
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
        seq.append(prefix.keys[:, :, start:i].to(lm.device, lm.dtype), prefix.values[:, :, start:i].to(lm.device, lm.dtype))
    j = i
    while j < len(lay.items) and lay.kinds[j] == "doc":
        j += 1
    if j > i:
        _rotate_into(lm, seq, docs, lay.storage_positions(j)[lay.storage_positions(i).numel():])
    return j


@torch.inference_mode()
def pending_prefill(lm: LoadedModel, lay: RequestLayout, start: int, link_embeds: torch.Tensor | None,
                    adapter_embed) -> PendingPrefill:
    """The forward still needed for items ``start..``: link slots' embeddings, text tokens' embeddings,
    their positions and (linked) the KVLink mask over every key before and among them.

    Args:
        link_embeds: ``[K, hidden]`` or ``[S, K, hidden]`` link embeddings (None without link items).
        adapter_embed: ``lm.embed_tokens`` (the input embedding module).
    Raises:
        ValueError: nothing left to compute (the whole prompt matched: the caller keeps one item back).
    """
    if start >= len(lay.items):
        raise ValueError("nothing to compute: keep at least the last prompt token out of the match")
    n_slots = sum(k == "link" for k in lay.kinds)
    slots = slot_link_embeds(link_embeds.to(lm.device, lm.dtype), n_slots) if n_slots else []
    parts, ids, run = [], [], []
    for i in range(start, len(lay.items)):
        if lay.kinds[i] not in ("link", "text"):
            raise ValueError(f"item {i} ({lay.kinds[i]}) needs no forward; fill_cached first")
        if lay.kinds[i] == "link":
            if run:
                parts.append(adapter_embed(torch.tensor(run, device=lm.device)))
                run = []
            parts.append(slots[lay.items[i][1]])
        else:
            run.append(lay.items[i])
            ids.append(lay.items[i])
    if run:
        parts.append(adapter_embed(torch.tensor(run, device=lm.device)))
    embeds = torch.cat(parts)  # [new_tokens, hidden]
    key_pos = lay.storage_positions()
    new_pos = key_pos[lay.storage_positions(start).numel():]
    mask = None
    if lay.linked and any(k == "link" for k in lay.kinds[start:]):
        seg_list = _segments_with_text(lay)
        mask = additive(allowed(seg_list, lay.anchored, new_pos, key_pos), lm.dtype)[0, 0].to(lm.device)
    return PendingPrefill(embeds, new_pos, mask, ids)


def _segments_with_text(lay: RequestLayout) -> list[Segment]:
    """The layout's segments with the question segment grown to every text item (generated ones too)."""
    segs = list(lay.segments)
    q = segs[-1]
    end = lay.next_position
    segs[-1] = Segment(q.kind, q.index, q.start, end - q.start)
    return segs
