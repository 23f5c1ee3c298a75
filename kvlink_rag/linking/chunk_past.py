"""The chunks before a chunk as a KV prefix: a chunk encoded after the stored caches of its document's earlier chunks.

With ``KVLINK_RAG_CHUNK_CONTEXT_FROM=cache`` a chunk of a long document is encoded as the next tokens of its document:
its forward attends to the KV of every chunk before it, read from their caches (each itself encoded the same way)
rather than recomputed from their text. The chunks' caches then chain like the blocks of a prefix cache (vLLM's
automatic prefix caching keys a block by the hash of everything before it; here a chunk's key holds the text before
it, :meth:`kvlink_rag.engine_documents.EngineDocuments.cache_key`): the first encode of a document costs one forward
over its tokens, as one block does, and laid out in order the chunks hold what that one forward would (up to the
frames and the token at each boundary), where ``CHUNK_CONTEXT=1`` re-runs one chunk's text and sees no further back.
An edit re-encodes the edited chunk and every chunk after it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

from ..model.loader import LoadedModel
from ..types import DocumentKV
from .context import PrefixKV
from .document_prefill import ids_hash
from .rope import apply_rope, rope_cos_sin


def fitting(before: list[DocumentKV], room: int) -> list[DocumentKV]:
    """The last of ``before`` (in document order) whose tokens together fit ``room`` positions (whole chunks: the
    earliest are dropped first; none when even the last does not fit)."""
    kept, total = [], 0
    for kv in reversed(before):
        total += kv.num_tokens
        if total > room:
            break
        kept.append(kv)
    return kept[::-1]


@torch.no_grad()
def past_prefix(lm: LoadedModel, prefix: PrefixKV | None, before: list[DocumentKV]) -> PrefixKV | None:
    """The anchor prefix followed by the chunks ``before`` a chunk, as the prefix its encode attends to.

    Args:
        lm: the model (its rotary embedding and compute dtype).
        prefix: the anchor prefix (anchored encoding: RoPE'd at ``0..P-1``) or None (isolated: ``P = 0``).
        before: position-free caches of the chunks before, in document order (keys before RoPE, each
            ``[layers, kv_heads, n_j, head_dim]``).
    Returns:
        ``prefix`` unchanged when ``before`` is empty; else a :class:`PrefixKV` whose keys and values are
        ``[layers, kv_heads, P + c, head_dim]`` in the compute dtype (``c = sum n_j``), the chunks' keys rotated at
        positions ``P..P+c-1``, and ``token_ids`` ``[P + c]`` int64 (the encode then places the chunk at ``P + c``).
    """
    if not before:
        return prefix
    # k, v: [layers, kv_heads, c, head_dim] position-free, in the compute dtype
    k = torch.cat([kv.keys.to(lm.device, lm.dtype) for kv in before], dim=2)
    v = torch.cat([kv.values.to(lm.device, lm.dtype) for kv in before], dim=2)
    start = prefix.num_tokens if prefix is not None else 0
    cos, sin = rope_cos_sin(lm.rotary_emb, torch.arange(start, start + k.shape[2]), torch.float32, lm.device)
    k = apply_rope(k, cos, sin)
    ids = torch.cat([kv.token_ids.to(torch.long).cpu() for kv in before])
    if prefix is not None:
        k, v = torch.cat([prefix.keys, k], dim=2), torch.cat([prefix.values, v], dim=2)
        ids = torch.cat([prefix.token_ids, ids])
    return PrefixKV(keys=k, values=v, token_ids=ids, text_hash=ids_hash(ids))


class GrowingPast:
    """One document's chunk walk: the prefix of :func:`past_prefix`, grown one chunk at a time.

    Encoding a document's chunks in order asks for the past of chunk 1, then of chunks 1-2, 1-3, ...: built anew each
    time (:func:`past_prefix`) that is quadratic in the chunks (a 7.9k-token document in 33 chunks, importance scores
    off: first encode 24.0 s rebuilt, 18.0 s grown, ``docs/bench/chunk-walk-2026-12-06i``). Here each chunk's
    keys are rotated once, at the positions it holds, into one buffer (grown by doubling) after the anchor prefix, and
    each past is a view of that buffer's first ``P + c`` tokens: the same values as :func:`past_prefix` (RoPE is
    elementwise in the positions), a view never written again (growing copies into a new buffer; a walk that does not
    continue the last one starts a new buffer).

    A past continues the last one when it has the same model and anchor prefix and its chunks start with the last
    one's chunks (the same objects: :func:`service.precompute._before` hands each encode the caches it encoded or
    read once, the engine reads them through :meth:`read`; chunks read anew each time start a new buffer, as
    :func:`past_prefix` would cost).
    """

    def __init__(self) -> None:
        self._key: tuple | None = None  # (the model, the anchor prefix) the buffer was started with
        self._chunks: list[DocumentKV] = []
        self._k = self._v = None  # [layers, kv_heads, capacity, head_dim] in the compute dtype
        self._ids: list[torch.Tensor] = []
        self._len = 0
        self._read: dict[str, DocumentKV] = {}

    def read(self, key: str, load: Callable[[], DocumentKV]) -> DocumentKV:
        """The cache under ``key``, loaded (``load()``: read from a store, or encoded) once a walk: the same object
        each time, so that a store's chunks continue this walk's past instead of starting a new one."""
        if key not in self._read:
            self._read[key] = load()
        return self._read[key]

    @torch.no_grad()
    def prefix(self, lm: LoadedModel, prefix: PrefixKV | None, before: list[DocumentKV]) -> PrefixKV | None:
        """What :func:`past_prefix` returns for ``before`` (keys and values views of this walk's buffer; detached, as
        :func:`past_prefix` builds them under no_grad)."""
        if not before:
            return prefix
        if (self._key is None or self._key[0] is not lm or self._key[1] is not prefix
                or len(before) < len(self._chunks) or any(a is not b for a, b in zip(self._chunks, before))):
            self._start(lm, prefix)
        for kv in before[len(self._chunks):]:
            self._append(lm, kv)
        ids = torch.cat(self._ids)
        return PrefixKV(keys=self._k[:, :, : self._len], values=self._v[:, :, : self._len], token_ids=ids,
                        text_hash=ids_hash(ids))

    def _start(self, lm: LoadedModel, prefix: PrefixKV | None) -> None:
        self._key, self._chunks, self._k, self._v, self._len = (lm, prefix), [], None, None, 0
        self._ids = [] if prefix is None else [prefix.token_ids]
        if prefix is not None:
            self._grow(prefix.keys.shape, prefix.num_tokens, lm)
            self._write(prefix.keys, prefix.values)

    def _append(self, lm: LoadedModel, kv: DocumentKV) -> None:
        # k, v: [layers, kv_heads, n, head_dim]; keys rotated at the positions the chunk holds
        k, v = kv.keys.to(lm.device, lm.dtype), kv.values.to(lm.device, lm.dtype)
        cos, sin = rope_cos_sin(lm.rotary_emb, torch.arange(self._len, self._len + k.shape[2]), torch.float32,
                                lm.device)
        self._grow(k.shape, self._len + k.shape[2], lm)
        self._write(apply_rope(k, cos, sin), v)
        self._chunks.append(kv)
        self._ids.append(kv.token_ids.to(torch.long).cpu())

    def _grow(self, shape: torch.Size, tokens: int, lm: LoadedModel) -> None:
        """Room for ``tokens`` in the buffer (a new one, twice as long, holding the tokens so far, when short)."""
        if self._k is not None and self._k.shape[2] >= tokens:
            return
        cap = max(tokens, 2 * (self._k.shape[2] if self._k is not None else 0))
        k = torch.empty(shape[0], shape[1], cap, shape[3], dtype=lm.dtype, device=lm.device)
        v = torch.empty_like(k)
        if self._k is not None:
            k[:, :, : self._len], v[:, :, : self._len] = self._k[:, :, : self._len], self._v[:, :, : self._len]
        self._k, self._v = k, v

    def _write(self, k: torch.Tensor, v: torch.Tensor) -> None:
        n = k.shape[2]
        self._k[:, :, self._len: self._len + n], self._v[:, :, self._len: self._len + n] = k, v
        self._len += n


_WALK: ContextVar[GrowingPast | None] = ContextVar("chunk_walk", default=None)


@contextmanager
def chunk_walk() -> Iterator[GrowingPast]:
    """Within the block (this thread or task), :func:`chunk_past` grows one :class:`GrowingPast` instead of building
    each past anew; its buffer is let go at the end (a 7.9k-token document's past is ~360 MB in float32)."""
    if (walk := _WALK.get()) is not None:  # within a walk already (a chunk's encode reading the chunks before it)
        yield walk
        return
    walk = GrowingPast()
    token = _WALK.set(walk)
    try:
        yield walk
    finally:
        _WALK.reset(token)


def chunk_past(lm: LoadedModel, prefix: PrefixKV | None, before: list[DocumentKV]) -> PrefixKV | None:
    """:func:`past_prefix`, through the open :func:`chunk_walk` if any."""
    walk = _WALK.get()
    return past_prefix(lm, prefix, before) if walk is None else walk.prefix(lm, prefix, before)
