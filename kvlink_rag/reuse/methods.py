"""Reuse methods: how a request turns stored document caches into a context, behind one declared interface.

A method gets the engine's model and prefix, the documents' caches in slot order (keys before RoPE), their
ids, the link embeddings and the question, and returns the :class:`~kvlink_rag.linking.context.LinkedContext` to
decode from (:meth:`ReuseMethod.context`, the one-request reference); inside the batching scheduler it gets the
admitted request's layout and loaded KV and returns the prefill the scheduler runs for it, chunked like any
other, with what to do once that prefill is complete (:meth:`ReuseMethod.scheduled`). Link tokens (KVLink: RoPE re-applied, K trained tokens after each document; Yang et al., 2025)
and CacheBlend recompute (Yao et al., 2024, arXiv 2405.16444: the most deviating document tokens
recomputed in the joined context, on top of the link tokens) are the first two; adding one is a class in
its own file and one entry in :data:`METHODS`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from ..home import registered
from ..linking.context import LinkedContext, PrefixKV
from ..model.loader import LoadedModel
from ..runtime.kv_sequence import SequenceKV
from ..runtime.request_layout import PendingPrefill, RequestLayout
from ..types import Document, DocumentKV, LayeredDocuments


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
        joined: per slot, no link tokens after it (:func:`kvlink_rag.linking.linker.plan_layout`); None: after each.
    """

    lm: LoadedModel
    prefix: PrefixKV | None
    docs: list[DocumentKV] | LayeredDocuments
    doc_ids: list[torch.Tensor]
    link_embeds: torch.Tensor | None
    question_ids: torch.Tensor
    anchored: bool
    new_tokens: int = 1
    joined: list[bool] | None = None


@dataclass(frozen=True)
class ScheduledInputs:
    """What a reuse method gets inside the batching scheduler (:func:`kvlink_rag.runtime.admit.admit`).

    Attributes:
        lm: the model.
        layout: the request's linked layout; items before ``start`` are in ``seq`` already.
        start: the first item to compute (link tokens, question).
        seq: the request's KV (prefix, then its documents re-rotated in its own blocks).
        prefix: the anchor prefix KV, or None.
        docs: the request's documents in slot order; ``document_ids(doc)`` gives a document's ``[tokens]`` ids.
        link_embeds: ``[K, hidden]`` or ``[S, K, hidden]`` link embeddings in use, or None.
        pending: the link-token prefill of items ``start..`` under the KVLink mask.
    """

    lm: LoadedModel
    layout: RequestLayout
    start: int
    seq: SequenceKV
    prefix: PrefixKV | None
    docs: list[Document]
    document_ids: Callable[[Document], torch.Tensor]
    link_embeds: torch.Tensor | None
    pending: PendingPrefill


class Fixup(Protocol):
    """What a method does to a request's KV once its scheduled prefill is complete."""

    def apply(self, seq: SequenceKV) -> None:
        """Change ``seq`` in place (before the first token is sampled)."""


class ReuseMethod(Protocol):
    """Builds a request's context from stored document caches."""

    def context(self, inputs: ReuseInputs) -> LinkedContext:
        """The context to decode from (see :class:`ReuseInputs`)."""

    def scheduled(self, inputs: ScheduledInputs) -> tuple[PendingPrefill, Fixup | None]:
        """The prefill the scheduler runs for the request and the fixup applied after it (or None)."""


class LinkTokens:
    """KVLink: keys re-rotated at their new offsets, link tokens and question computed under the KVLink mask
    (:func:`kvlink_rag.linking.linker.link`)."""

    def context(self, inputs: ReuseInputs) -> LinkedContext:
        from ..linking.linker import link

        return link(inputs.lm, inputs.prefix, inputs.docs, inputs.link_embeds, inputs.question_ids,
                    anchored=inputs.anchored, new_tokens=inputs.new_tokens, joined=inputs.joined)

    def scheduled(self, inputs: ScheduledInputs) -> tuple[PendingPrefill, Fixup | None]:
        return inputs.pending, None  # admission already laid out the link tokens and question


@dataclass(frozen=True)
class CacheBlend:
    """Link tokens plus CacheBlend's recompute of ``ratio`` of the document tokens (:func:`kvlink_rag.reuse.blend.blend`)."""

    ratio: float

    def context(self, inputs: ReuseInputs) -> LinkedContext:
        from .blend import blend

        return blend(inputs.lm, inputs.prefix, inputs.docs, inputs.doc_ids, inputs.link_embeds, inputs.question_ids,
                     recompute_ratio=self.ratio, new_tokens=inputs.new_tokens, joined=inputs.joined)

    def scheduled(self, inputs: ScheduledInputs) -> tuple[PendingPrefill, Fixup | None]:
        """The selected document tokens join the link-and-question prefill (:func:`kvlink_rag.reuse.blend_stage.blend_prefill`)."""
        from .blend_stage import blend_prefill

        ids = [inputs.document_ids(d) for d in inputs.docs]
        return blend_prefill(inputs.lm, inputs.layout, inputs.start, inputs.seq, inputs.prefix, ids,
                             inputs.link_embeds, inputs.pending, self.ratio)


METHODS = {"link-tokens": lambda ratio: LinkTokens(), "cacheblend": lambda ratio: CacheBlend(ratio)}
"""Reuse methods by name; each maker takes the request's recompute ratio."""


def default_method(recompute_ratio: float) -> str:
    """The name of the method a request gets when it names none: ``'cacheblend'`` when some document tokens are
    recomputed (``recompute_ratio`` > 0), else ``'link-tokens'``."""
    return "cacheblend" if recompute_ratio > 0 else "link-tokens"


def reuse_method(recompute_ratio: float, name: str | None = None) -> ReuseMethod:
    """The method called ``name`` in :data:`METHODS`, made for ``recompute_ratio``; without a name, the one
    :func:`default_method` picks.

    Raises:
        ValueError: ``name`` is not registered.
    """
    name = default_method(recompute_ratio) if name is None else name
    return METHODS[registered("reuse method", name, sorted(METHODS))](recompute_ratio)
