"""Document-side adapters: documents encoded with the artifact's LoRA adapter on, an upper bound of the
query-side restriction.

KVLink (Yang et al., 2025, arXiv 2502.16002) fine-tunes the whole model, so its document caches are made
by the fine-tuned weights. A *document-side* artifact (``metadata["doc_side"] = true``) does the same with
its LoRA adapter: documents are still encoded separately and position-free, re-rotated and linked exactly
as at serving time, but with the adapter active for the document tokens too. Such caches depend on the
adapter, so their fingerprint carries the adapter's identity (:func:`doc_side_fingerprint`): they never mix
with base caches, and retraining the adapter invalidates them. Only ``kvlink-rag eval`` (and training)
use them; serving refuses such artifacts (:func:`check_query_side`).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Protocol

import torch

from ..linking.context import PrefixKV
from ..linking.document_prefill import context_ids, encoding_fingerprint
from ..linking.kvcache import build_cache, cache_tensors
from ..linking.link_tokens import LinkTokens, LinkTokensMismatch
from ..linking.rope import remove_rope, rope_cos_sin
from ..model.loader import LoadedModel
from ..model.lora import adapter_scope
from ..types import DocumentKV, parse_dtype

if TYPE_CHECKING:
    from ..settings import EngineSettings


class EncodingEngine(Protocol):
    """What :func:`document_adapter` reads of its engine (``kvlink_rag.engine.Engine``, which imports this
    module: a protocol, so that the two never import each other)."""

    @property
    def settings(self) -> EngineSettings: ...
    @property
    def lm(self) -> LoadedModel: ...
    @property
    def prefix(self) -> PrefixKV | None: ...
    @property
    def adapter(self) -> str | None: ...
    @property
    def link_tokens(self) -> LinkTokens | None: ...


def is_doc_side(lt: LinkTokens | None) -> bool:
    """Whether ``lt`` is a document-side artifact (trained with its adapter on for document tokens)."""
    return bool(lt is not None and lt.lora and lt.metadata.get("doc_side"))


def check_query_side(lt: LinkTokens | None, source: str) -> None:
    """Refuse a document-side artifact where only query-side ones are served.

    Raises:
        LinkTokensMismatch: ``lt`` is document-side (the message names ``source``).
    """
    if is_doc_side(lt):
        raise LinkTokensMismatch(
            f"{source} is a document-side artifact (its documents must be encoded with its adapter, in caches of "
            "their own); serving takes query-side artifacts only; evaluate it with `kvlink-rag eval --modes "
            "linked-query-lora --adapter FILE`")


def doc_side_fingerprint(encoding_fp: str, adapter_identity: str) -> str:
    """Fingerprint of caches encoded with an adapter: the base encoding fingerprint and the adapter's
    content hash (:meth:`LinkTokens.identity`), hashed together (sha256 hex)."""
    return hashlib.sha256(f"{encoding_fp}|doc-adapter|{adapter_identity}".encode()).hexdigest()


def document_adapter(engine: EncodingEngine) -> tuple[str | None, str]:
    """``(adapter that encodes documents, encoding fingerprint)`` for ``engine``'s link tokens and adapter:
    ``(None, base fingerprint)`` unless they are a loaded document-side artifact."""
    s = engine.settings
    base = encoding_fingerprint(engine.lm.fingerprint, s.encoding, engine.prefix, s.kv_dtype)
    if engine.adapter is None or not is_doc_side(engine.link_tokens):
        return None, base
    return engine.adapter, doc_side_fingerprint(base, engine.link_tokens.identity())


def encode_with_adapter(lm: LoadedModel, ids: torch.Tensor, adapter: str | None, *, prefix: PrefixKV | None,
                        kv_dtype: str, fingerprint: str, context: torch.Tensor | None = None) -> DocumentKV:
    """Position-free KV of one document encoded with ``adapter`` on (``None``: the base model), in one forward.

    Unlike :func:`kvlink_rag.linking.document_prefill.encode_document` it does not turn gradients off: under grad
    mode the result keeps the graph, so a loss on the linked context reaches the adapter through the
    document tokens (training). No importance scores, no chunking.

    Args:
        ids: ``[tokens]`` int64 ids of the document tokenised alone.
        prefix: the anchor prefix (anchored encoding, document at ``P..P+n-1``, prefix KV of the base
            model), or None (isolated, ``0..n-1``).
        kv_dtype: dtype of the returned K and V.
        fingerprint: recorded on the result.
        context: ``[c]`` int64 ids encoded right before the document (a chunk's previous chunk; see
            :func:`~kvlink_rag.linking.document_prefill.encode_document`); only the document's KV is returned.
    Returns:
        ``DocumentKV``: keys before RoPE and values ``[layers, kv_heads, tokens, head_dim]``.
    Raises:
        ValueError: empty document or unknown dtype. KeyError: ``adapter`` not loaded.
    """
    dtype, n = parse_dtype(kv_dtype), int(ids.numel())
    if n == 0:
        raise ValueError("document is empty (0 tokens)")
    start = prefix.num_tokens if prefix is not None else 0
    ctx = context_ids(context, lm.max_positions - start - n)
    at = start + int(ctx.numel())  # the document's first slot
    pos = torch.arange(start, at + n, device=lm.device)
    cache = None if prefix is None else build_cache(list(prefix.keys.to(lm.device)), list(prefix.values.to(lm.device)))
    with adapter_scope(lm, adapter):
        out = lm.decoder(input_ids=torch.cat([ctx, ids.cpu()]).to(lm.device)[None], position_ids=pos[None],
                         cache=cache, use_cache=True)
    k, v = cache_tensors(out.cache)  # k, v: [layers, kv_heads, at + n, head_dim], keys rotated
    cos, sin = rope_cos_sin(lm.rotary_emb, pos[at - start:], torch.float32)
    k_raw = remove_rope(k[:, :, at:].float(), cos, sin)
    return DocumentKV(keys=k_raw.to(dtype).contiguous(), values=v[:, :, at:].to(dtype).contiguous(),
                      token_ids=ids.detach().to(torch.long).cpu(), fingerprint=fingerprint,
                      encoding="anchored" if prefix is not None else "isolated")


def encode_batch_with_adapter(lm: LoadedModel, ids: list[torch.Tensor], adapter: str | None, *,
                              prefix: PrefixKV | None, kv_dtype: str, fingerprint: str) -> list[DocumentKV]:
    """:func:`encode_with_adapter` of several documents in one batched forward (training: one launch of every
    kernel for all of an example's documents instead of one per document).

    Each document is still encoded alone: rows are right-padded, so under the causal mask a document's
    tokens never see padding or another document (pad positions follow its last token and are dropped).
    K and V equal the one-by-one encodes up to the kernels' batched rounding.

    Args:
        ids: per document ``[tokens_i]`` int64 ids (each non-empty).
    Returns:
        one ``DocumentKV`` per document, keys before RoPE and values ``[layers, kv_heads, tokens_i, head_dim]``.
    Raises:
        ValueError: no documents, an empty one, or unknown dtype.
    """
    from transformers import DynamicCache

    lengths = [int(x.numel()) for x in ids]
    if not lengths or min(lengths) == 0:
        raise ValueError("encode_batch_with_adapter needs documents of at least one token")
    dtype, n_max, b = parse_dtype(kv_dtype), max(lengths), len(ids)
    start = prefix.num_tokens if prefix is not None else 0
    batch = torch.zeros(b, n_max, dtype=torch.long)
    for i, x in enumerate(ids):
        batch[i, : lengths[i]] = x
    pos = torch.arange(start, start + n_max, device=lm.device)
    cache = None
    if prefix is not None:  # the prefix KV repeated per row: [b, kv_heads, P, head_dim] per layer
        cache = DynamicCache(ddp_cache_data=[(k.to(lm.device)[None].expand(b, -1, -1, -1),
                                              v.to(lm.device)[None].expand(b, -1, -1, -1))
                                             for k, v in zip(prefix.keys, prefix.values)])
    with adapter_scope(lm, adapter):
        out = lm.decoder(input_ids=batch.to(lm.device), position_ids=pos[None].expand(b, -1), cache=cache,
                         use_cache=True)
    k = torch.stack([layer.keys for layer in out.cache.layers], dim=1)  # [b, layers, kv_heads, P + n_max, hd]
    v = torch.stack([layer.values for layer in out.cache.layers], dim=1)
    cos, sin = rope_cos_sin(lm.rotary_emb, pos, torch.float32)
    k_raw = remove_rope(k[..., start:, :].float(), cos, sin)  # [b, layers, kv_heads, n_max, head_dim]
    return [DocumentKV(keys=k_raw[i, :, :, : lengths[i]].to(dtype).contiguous(),
                       values=v[i, :, :, start: start + lengths[i]].to(dtype).contiguous(),
                       token_ids=ids[i].detach().to(torch.long).cpu(), fingerprint=fingerprint,
                       encoding="anchored" if prefix is not None else "isolated") for i in range(b)]
