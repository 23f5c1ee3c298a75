"""Position-free precompute of document KV caches (KVLink, arXiv 2502.16002, section 3.1).

A document is run through the model by itself (isolated) or right after the shared anchor prefix
(anchored: the shared-prefix idea of Prompt Cache, Gim et al. 2024, and APE, Yang et al. 2025). Its keys
are stored *before* RoPE, so that the linker can rotate them to any offset later.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from contextvars import ContextVar

import torch

from ..model.attention import capture_attention
from ..model.loader import LoadedModel
from ..model.lora import adapter_scope
from ..retention import ImportanceAccumulator
from ..types import DocumentKV, parse_dtype
from .context import PrefixKV
from .kvcache import build_cache, cache_tensors
from .rope import remove_rope, rope_cos_sin

ENCODINGS = ("isolated", "anchored")
FORMAT_VERSION = 1
CHUNK_TOKENS = 64
"""First chunk of a precompute that runs chunk by chunk (:data:`chunk_guard` set): the document is encoded
in chunks (the same K and V: each chunk attends to the cache of the ones before it). Without a guard a
document is one forward."""
CHUNK_SECONDS = 0.1
"""Target seconds per chunk: later chunks are resized (16-512 tokens) from the last one's time, since a
chunk costs more the further into the document it is (attention over the cache); a query arriving
meanwhile waits at most about this long. 0: fixed ``CHUNK_TOKENS``."""

chunk_guard: ContextVar[Callable[[], AbstractContextManager] | None] = ContextVar("chunk_guard", default=None)
"""In this context (thread), each chunk's forward runs inside ``chunk_guard()`` (the service: the model
lock, taken when the batching scheduler has a quiet moment): a long document then never stalls queries
for its whole encode, and nothing but the chunk's forward holds the model."""


def ids_hash(ids: torch.Tensor) -> str:
    """sha256 hex of int64 token ids."""
    return hashlib.sha256(ids.to(torch.int64).contiguous().numpy().tobytes()).hexdigest()


def encoding_fingerprint(model_fingerprint: str, encoding: str, prefix: PrefixKV | None, kv_dtype: str) -> str:
    """Identity of everything a stored document KV depends on.

    model fingerprint, encoding context (``isolated``, or ``anchored`` with the anchor prefix's ids hash),
    KV dtype and the cache format version. Any change turns old caches into misses.

    Raises:
        ValueError: unknown encoding, or anchored without a prefix.
    """
    if encoding not in ENCODINGS:
        raise ValueError(f"unknown encoding {encoding!r}; choose one of {', '.join(ENCODINGS)}")
    if encoding == "anchored" and prefix is None:
        raise ValueError("anchored encoding needs the anchor prefix")
    parse_dtype(kv_dtype)
    anchor = prefix.text_hash if encoding == "anchored" else "-"
    text = f"v{FORMAT_VERSION}|{model_fingerprint}|{encoding}|{anchor}|{kv_dtype}"
    return hashlib.sha256(text.encode()).hexdigest()


@torch.no_grad()
def encode_prefix(lm: LoadedModel, ids: torch.Tensor) -> PrefixKV:
    """KV of the anchor prefix at positions ``0..P-1`` (RoPE applied), in the compute dtype.

    Args:
        ids: ``[P]`` int64 prefix ids, ``P >= 1``.
    Raises:
        ValueError: empty prefix.
    """
    if ids.numel() == 0:
        raise ValueError("anchor prefix is empty")
    pos = torch.arange(ids.numel(), device=lm.device)[None]
    with adapter_scope(lm, None):
        out = lm.decoder(input_ids=ids.to(lm.device)[None], position_ids=pos, use_cache=True)
    k, v = cache_tensors(out.cache)
    return PrefixKV(keys=k, values=v, token_ids=ids.cpu(), text_hash=ids_hash(ids))


@torch.no_grad()
def encode_document(
    lm: LoadedModel,
    ids: torch.Tensor,
    *,
    kv_dtype: str = "bfloat16",
    prefix: PrefixKV | None = None,
    fingerprint: str | None = None,
    importance: bool = False,
    context: torch.Tensor | None = None,
) -> DocumentKV:
    """Run the model over one document and return its position-free KV.

    Args:
        lm: the model.
        ids: ``[tokens]`` int64 ids of the document tokenised alone.
        kv_dtype: ``'float32' | 'bfloat16' | 'float16'``: dtype of the returned K and V.
        prefix: the anchor prefix for anchored encoding (document at positions ``P..P+n-1`` attending
            to the prefix), or ``None`` for isolated encoding (positions ``0..n-1``).
        fingerprint: encoding fingerprint to record; computed with :func:`encoding_fingerprint` if None.
        importance: also score each token's importance (H2O: attention received from later document tokens,
            summed over heads and layers; :class:`kvlink_rag.retention.ImportanceAccumulator`): from the runner's
            attention (:func:`on_runner`), in ``native`` from transformers' eager kernel
            (:mod:`kvlink_rag.model.attention`); K and V are the same up to kernel rounding (~1e-6 in float32).
        context: ``[c]`` int64 ids encoded right before the document (a chunk's previous chunk), which attends
            to them; only its own K, V and importance are returned (the context's first ids dropped to fit).
    Returns:
        ``DocumentKV`` with keys before RoPE and values, each ``[layers, kv_heads, tokens, head_dim]``, and
        ``importance`` ``[tokens]`` float32 when asked for (else None).
    Raises:
        ValueError: empty document, unknown dtype, or prefix + document longer than the model's context.
    """
    dtype = parse_dtype(kv_dtype)
    n = int(ids.numel())
    if n == 0:
        raise ValueError("document is empty (0 tokens)")
    start = prefix.num_tokens if prefix is not None else 0
    if start + n > lm.max_positions:
        raise ValueError(
            f"document has {n} tokens; with the {start}-token prefix that exceeds the model's context of "
            f"{lm.max_positions} tokens"
        )
    encoding = "anchored" if prefix is not None else "isolated"
    if fingerprint is None:
        fingerprint = encoding_fingerprint(lm.fingerprint, encoding, prefix, kv_dtype)
    ctx = context_ids(context, lm.max_positions - start - n)
    c = int(ctx.numel())
    # the context's ids, then the document's, at start..start+c+n-1; the document keeps the last n slots
    pos = torch.arange(start, start + c + n, device=lm.device)
    scores = ImportanceAccumulator(c + n, start) if importance else None
    k, v = _forward(lm, torch.cat([ctx.to(ids.device), ids]), pos, prefix, scores)
    cos, sin = rope_cos_sin(lm.rotary_emb, pos[c:], torch.float32)
    k_raw = remove_rope(k[:, :, c:].float(), cos, sin)
    return DocumentKV(
        keys=k_raw.to(dtype).contiguous(),
        values=v[:, :, c:].to(dtype).contiguous(),
        token_ids=ids.detach().to(torch.long).cpu(),
        fingerprint=fingerprint,
        encoding=encoding,
        importance=scores.scores[c:].contiguous() if scores is not None else None,
    )


def context_ids(context: torch.Tensor | None, room: int) -> torch.Tensor:
    """``[c]`` int64 ids of ``context`` that fit ``room`` positions (its last ones; none when ``room <= 0``),
    on the CPU; empty for None."""
    if context is None or room <= 0:
        return torch.zeros(0, dtype=torch.long)
    return context.detach().to(torch.long).cpu()[-room:]


def _next_chunk(size: int, took_s: float) -> int:
    """Tokens of the next chunk so that it takes about :data:`CHUNK_SECONDS` (``size`` took ``took_s``)."""
    if CHUNK_SECONDS <= 0:
        return size
    return max(16, min(512, int(size * CHUNK_SECONDS / max(took_s, 1e-4))))


def on_runner(lm: LoadedModel) -> bool:
    """Whether documents are encoded by the model runner: in every format but ``native`` (the runner's formats,
    bfloat16 prefill or the model's float32 weights: ``int4-f32``, ``q4q8-f32`` on CPUs without native bfloat16),
    with no gradient wanted. ``native`` keeps transformers' forward, the reference the stored caches' exactness
    tests compare with. With importance scores the runner's forward is what keeps them cheap: transformers' takes
    its eager attention over every key (a 7.9k-token block 248.6 s against 66.9 s without scores on an AVX2 EPYC,
    ``docs/bench/importance-lse-2026-12-07``)."""
    from ..runtime.hf_cache import runs_on_runner

    return lm.weight_format != "native" and runs_on_runner()


def _in_chunks(n: int, forward: Callable[[int, int], None]) -> None:
    """``forward(c0, c1)`` over tokens ``0..n``: at once without :data:`chunk_guard`, else in chunks of
    :data:`CHUNK_TOKENS` resized toward :data:`CHUNK_SECONDS` (:func:`_next_chunk`), each inside the guard."""
    guard = chunk_guard.get()
    size, c0 = (CHUNK_TOKENS if guard is not None else n), 0
    while c0 < n:
        c1 = min(n, c0 + size)
        with guard() if guard is not None else nullcontext():
            t0 = time.perf_counter()
            forward(c0, c1)
            took = time.perf_counter() - t0
        size, c0 = (_next_chunk(size, took) if guard is not None else size), c1


def _forward(lm: LoadedModel, ids: torch.Tensor, pos: torch.Tensor, prefix: PrefixKV | None,
             scores: ImportanceAccumulator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The base model over the document at ``pos`` (after the prefix's KV, if any), attention captured into
    ``scores`` when given; returns the document's own K (rotated) and V, ``[layers, kv_heads, n, head_dim]``."""
    if on_runner(lm):
        return _runner_forward(lm, ids, pos, prefix, scores)
    cache = [None if prefix is None else build_cache(list(prefix.keys.to(lm.device)), list(prefix.values.to(lm.device)))]

    def forward(c0: int, c1: int) -> None:
        with adapter_scope(lm, None), (capture_attention(lm, scores) if scores is not None else nullcontext()):
            # documents are always encoded by the base model
            out = lm.decoder(input_ids=ids[c0:c1].to(lm.device)[None], position_ids=pos[None, c0:c1],
                             cache=cache[0], use_cache=True)
        cache[0] = out.cache

    _in_chunks(int(ids.numel()), forward)
    k, v = cache_tensors(cache[0])
    # k, v: [layers, kv_heads, start + n, head_dim]; keep the document's own slots.
    start = prefix.num_tokens if prefix is not None else 0
    return k[:, :, start:], v[:, :, start:]


def _runner_forward(lm: LoadedModel, ids: torch.Tensor, pos: torch.Tensor, prefix: PrefixKV | None,
                    scores: ImportanceAccumulator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_forward` through the model runner: the document's own KV in a sequence after the prefix's
    (a shared chunk), in the chunks :data:`chunk_guard` asks for, importance from the runner's attention
    probabilities (:func:`~kvlink_rag.runtime.attention_probs.attention_mass` without each query's own key)."""
    from ..runtime.model_runner import forward_ragged
    from ..runtime.ragged import KVChunk, RaggedBatch, SequenceKV

    n, cfg = int(ids.numel()), lm.config
    chunks = [] if prefix is None else [KVChunk(prefix.keys.to(lm.device, lm.dtype), prefix.values.to(lm.device, lm.dtype))]
    seq = SequenceKV(chunks, lm.num_layers, cfg.num_key_value_heads, lm.head_dim, lm.dtype, lm.device, n)

    def forward(c0: int, c1: int) -> None:
        with adapter_scope(lm, None):  # documents are always encoded by the base model
            batch = RaggedBatch()
            batch.add(seq, c1 - c0, attention=scores)
            forward_ragged(lm, batch, lm.embed_tokens(ids[c0:c1].to(lm.device)), pos[c0:c1])

    _in_chunks(n, forward)
    # own KV: [layers, kv_heads, n, head_dim], keys after RoPE
    return seq.own_kv(0, n)
