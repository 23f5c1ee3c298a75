"""The linked layout's own types: the anchor prefix's KV, the layout's segments, stage timings and the
linked context a decode starts from (what the linker, the reuse methods and decoding pass between them).

KV shapes follow ``[layers, kv_heads, tokens, head_dim]`` (:mod:`kvlink_rag.types`). Importing this module
does not import torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from transformers import DynamicCache


@dataclass(frozen=True)
class PrefixKV:
    """KV of the shared anchor prefix (system prompt and user-turn header), with RoPE applied.

    Attributes:
        keys/values: ``[layers, kv_heads, tokens, head_dim]``, keys rotated at positions ``0..tokens-1``,
            in the model's compute dtype.
        token_ids: ``[tokens]`` int64.
        text_hash: sha256 of the prefix ids; part of the anchored encoding fingerprint.
    """

    keys: torch.Tensor
    values: torch.Tensor
    token_ids: torch.Tensor
    text_hash: str

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.numel())


@dataclass(frozen=True)
class Segment:
    """One contiguous span of the linked layout.

    Attributes:
        kind: ``'prefix' | 'document' | 'link' | 'question'``.
        index: document slot for ``document``/``link`` segments, else -1.
        start: first position id (tokens).
        length: number of tokens.
    """

    kind: str
    index: int
    start: int
    length: int

    @property
    def end(self) -> int:
        return self.start + self.length


@dataclass
class Timings:
    """Wall-clock seconds of the stages of one linked query."""

    load_s: float = 0.0
    rope_s: float = 0.0
    link_forward_s: float = 0.0


@dataclass
class LinkedContext:
    """The KV cache of a linked prompt, ready for decoding.

    Attributes:
        cache: a ``transformers.DynamicCache`` holding prefix, documents, link tokens and question.
            Storage order is ``[prefix][doc 1..N][links 1..N][question]``; attention is order-free,
            the RoPE positions are those of ``segments``.
        segments: the layout in position order ``[prefix][d1][L1]...[dN][LN][question]``.
        storage_positions: ``[total_tokens]`` int64 position id of each cache slot, in storage order.
        next_position: position id of the first generated token.
        last_logits: ``[vocab]`` float32 logits after the last question token.
        timings: stage timings in seconds.
        logits: ``[kept, vocab]`` logits of the last ``logits_to_keep`` new tokens (training), else None.
        finish_reason: set by ``generate.decode`` when it ends: ``'stop'`` (a stop token) or ``'length'``
            (``max_new_tokens`` or the model's context end); None before.
    """

    cache: DynamicCache
    segments: list[Segment]
    storage_positions: torch.Tensor
    next_position: int
    last_logits: torch.Tensor
    timings: Timings
    logits: torch.Tensor | None = None
    finish_reason: str | None = None
