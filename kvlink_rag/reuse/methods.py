"""Reuse methods: how a request turns stored document caches into a context, behind one declared interface.

A method gets the engine's model and prefix, the documents' caches in slot order (keys before RoPE), their
ids, the link embeddings and the question, and returns the :class:`~kvlink_rag.linking.context.LinkedContext` to
decode from. Link tokens (KVLink: RoPE re-applied, K trained tokens after each document; Yang et al., 2025)
and CacheBlend recompute (Yao et al., 2024, arXiv 2405.16444: the most deviating document tokens
recomputed in the joined context, on top of the link tokens) are the first two; adding one is a class in
its own file and one entry in :data:`METHODS`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from ..linking.context import LinkedContext, PrefixKV
from ..model.loader import LoadedModel
from ..types import DocumentKV, LayeredDocuments


@dataclass(frozen=True)
class ReuseInputs:
    """What a reuse method gets.

    Attributes:
        lm: the model (the caller's adapter scope applies to every token the method computes).
        prefix: the anchor prefix KV, or None.
        docs: stored caches in slot order, in memory or streamed layer by layer.
        doc_ids: per document ``[tokens]`` int64 ids as encoded.
        link_embeds: ``[K, hidden]`` or ``[S, K, hidden]`` link embeddings, or None (naive reuse).
        question_ids: ``[question_tokens]`` int64.
        anchored: documents were encoded after the prefix.
        new_tokens: positions to keep free after the question.
    """

    lm: LoadedModel
    prefix: PrefixKV | None
    docs: list[DocumentKV] | LayeredDocuments
    doc_ids: list[torch.Tensor]
    link_embeds: torch.Tensor | None
    question_ids: torch.Tensor
    anchored: bool
    new_tokens: int = 1


class ReuseMethod(Protocol):
    """Builds a request's context from stored document caches."""

    def context(self, inputs: ReuseInputs) -> LinkedContext:
        """The context to decode from (see :class:`ReuseInputs`)."""


class LinkTokens:
    """KVLink: keys re-rotated at their new offsets, link tokens and question computed under the KVLink mask
    (:func:`kvlink_rag.linking.linker.link`)."""

    def context(self, inputs: ReuseInputs) -> LinkedContext:
        from ..linking.linker import link

        return link(inputs.lm, inputs.prefix, inputs.docs, inputs.link_embeds, inputs.question_ids,
                    anchored=inputs.anchored, new_tokens=inputs.new_tokens)


@dataclass(frozen=True)
class CacheBlend:
    """Link tokens plus CacheBlend's recompute of ``ratio`` of the document tokens (:func:`kvlink_rag.reuse.blend.blend`)."""

    ratio: float

    def context(self, inputs: ReuseInputs) -> LinkedContext:
        from .blend import blend

        return blend(inputs.lm, inputs.prefix, inputs.docs, inputs.doc_ids, inputs.link_embeds, inputs.question_ids,
                     recompute_ratio=self.ratio, new_tokens=inputs.new_tokens)


METHODS = {"link-tokens": lambda ratio: LinkTokens(), "cacheblend": lambda ratio: CacheBlend(ratio)}
"""Reuse methods by name; each maker takes the request's recompute ratio."""


def reuse_method(recompute_ratio: float) -> ReuseMethod:
    """The method a request's settings ask for: CacheBlend when some document tokens are recomputed
    (``recompute_ratio`` > 0), else link tokens."""
    return METHODS["cacheblend" if recompute_ratio > 0 else "link-tokens"](recompute_ratio)
