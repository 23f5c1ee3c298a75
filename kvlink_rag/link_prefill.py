"""A linked request prepared for a packed (ragged) forward: documents re-rotated into the request's KV,
and the new tokens (link tokens, then the question) with their positions and KVLink mask.

The same layout, rotation and mask as :func:`kvlink_rag.linker.link` (KVLink, Yang et al., 2025,
arXiv 2502.16002): only the forward differs (one row of a :class:`~kvlink_rag.ragged.RaggedBatch`
instead of a batch-1 call), so the logits agree with the single-request path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .linker import _positions, check_link_inputs, plan_layout, rotate_documents, slot_link_embeds
from .mask import additive, allowed
from .model import LoadedModel
from .ragged import KVChunk, SequenceKV
from .types import LayeredDocuments, PrefixKV, Segment


@dataclass
class PendingPrefill:
    """New tokens waiting for their forward.

    Attributes:
        embeds: ``[n, hidden]`` input embeddings (compute dtype).
        positions: ``[n]`` int64 position ids.
        mask: additive ``[n, keys + n]`` over the sequence's keys and the new tokens (storage order), or
            None for plain causal continuation.
        token_ids: the ids of the new tokens that are text (empty for link tokens), in order.
    """

    embeds: torch.Tensor
    positions: torch.Tensor
    mask: torch.Tensor | None
    token_ids: list[int]

    @property
    def num_tokens(self) -> int:
        return int(self.embeds.shape[0])


def new_sequence(lm: LoadedModel, chunks: list[KVChunk], capacity: int) -> SequenceKV:
    """An empty request KV after ``chunks`` shaped for ``lm`` (compute dtype, model device)."""
    cfg = lm.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return SequenceKV(chunks, lm.num_layers, cfg.num_key_value_heads, head_dim, lm.dtype, lm.device, capacity)


@torch.inference_mode()
def prepare_linked(lm: LoadedModel, seq: SequenceKV, prefix: PrefixKV | None, docs: LayeredDocuments,
                   link_embeds: torch.Tensor | None, question_ids: torch.Tensor, anchored: bool,
                   new_tokens: int = 1) -> tuple[PendingPrefill, list[Segment]]:
    """Append the prefix and re-rotated documents to ``seq`` and return the link+question prefill.

    Args:
        seq: an empty sequence (no chunks, no tokens).
        prefix, docs, link_embeds, question_ids, anchored: as :func:`kvlink_rag.linker.link`.
    Returns:
        the pending prefill and the segment layout.
    Raises:
        ValueError, ContextTooLong: as :func:`kvlink_rag.linker.check_link_inputs`.
    """
    num_links = check_link_inputs(lm, prefix, docs, link_embeds, question_ids, new_tokens)
    p_len = prefix.num_tokens if prefix is not None else 0
    segments = plan_layout(p_len, docs.num_tokens, num_links, int(question_ids.numel()))
    keys, values = rotate_documents(lm, docs, segments, prefix)  # per layer [kv_heads, p + docs, head_dim]
    seq.reserve(keys[0].shape[1] + num_links * len(docs.num_tokens) + int(question_ids.numel()) + new_tokens)
    seq.append(torch.stack(keys), torch.stack(values))
    cached_pos = torch.cat([torch.arange(p_len), _positions(segments, ("document",))])
    new_pos = torch.cat([_positions(segments, ("link",)), _positions(segments, ("question",))])
    mask = additive(allowed(segments, anchored, new_pos, torch.cat([cached_pos, new_pos])), lm.dtype)[0, 0]
    slots = slot_link_embeds(link_embeds.to(lm.device, lm.dtype), len(docs.num_tokens)) if num_links else []
    embeds = torch.cat(slots + [lm.embed_tokens(question_ids.to(lm.device))], dim=0)  # [N*K + q, hidden]
    return PendingPrefill(embeds, new_pos, mask.to(lm.device), question_ids.tolist()), segments


@torch.inference_mode()
def prepare_tokens(lm: LoadedModel, token_ids: list[int], first_position: int) -> PendingPrefill:
    """Plain causal continuation: ``token_ids`` at positions ``first_position..`` (chat turns, decode)."""
    ids = torch.tensor(token_ids, dtype=torch.long, device=lm.device)
    pos = torch.arange(first_position, first_position + len(token_ids))
    return PendingPrefill(lm.embed_tokens(ids), pos, None, list(token_ids))
