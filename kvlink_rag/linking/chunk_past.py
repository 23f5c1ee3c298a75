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
