"""Explained answers: a linked answer made under attention capture, and its per-document attribution.

The capture runs the eager attention kernel for the link forward and every decoding step
(:func:`kvlink_rag.model.attention.capture_attention`): SDPA returns no weights, so explaining costs the eager
kernel's extra time on those forwards only (documents are never re-encoded).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from ..decoding.answer import Answer
from ..encodable import normalize_text
from ..engine import Engine
from ..linking.context import LinkedContext
from ..model.attention import capture_attention
from ..text.prompt import user_text_offsets
from ..types import Document
from .attribution import AttentionMass, Attribution, DocumentAttribution, attribute, char_passages, top_spans


def link_rows(engine: Engine, n_docs: int, k: int | None = None) -> int:
    """Link-token rows of the link forward: ``n_docs`` times the link tokens per document in use (``k``
    overrides the loaded K; 0 = none)."""
    if engine.link_tokens is None or k == 0:
        return 0
    return n_docs * (engine.link_k if k is None else min(k, engine.link_k))


@contextmanager
def explaining(engine: Engine, n_docs: int | list[Document], k: int | None = None) -> Iterator[AttentionMass]:
    """Capture the attention of the question and answer tokens of the linked answer made in the block.

    ``n_docs``: the document slots, or the documents (a chunked one takes a slot per chunk)."""
    slots = n_docs if isinstance(n_docs, int) else len(engine.expand(n_docs))
    mass = AttentionMass(skip_rows=link_rows(engine, slots, k))
    with capture_attention(engine.lm, mass):
        yield mass


def attribution(engine: Engine, mass: AttentionMass, ctx: LinkedContext, docs: list[Document]) -> Attribution:
    """Shares of prefix and documents and each document's top passages (character offsets into its text,
    as normalised), from the mass captured while ``ctx`` was linked and decoded; a chunked document's
    chunks are summed into one entry (:func:`join_chunks`)."""
    lengths = [s.length for s in ctx.segments if s.kind == "document"]
    att = attribute(mass, ctx.segments, ctx.storage_positions, lengths)
    tok = engine.lm.tokenizer
    slots = engine.expand(docs)
    for doc, d in zip(slots, att.documents):
        framed = engine.document_text(doc)
        body = normalize_text(doc.text)
        try:
            offsets = user_text_offsets(tok, framed)
        except ValueError:
            continue
        if len(offsets) != d.token_mass.numel():
            continue
        d.passages = char_passages(top_spans(d.token_mass), offsets, framed.find(body), len(body))
    return join_chunks(engine, att, docs) if len(slots) > len(docs) else att


def join_chunks(engine: Engine, att: Attribution, docs: list[Document]) -> Attribution:
    """Per-slot attribution to per-document: a chunked document's share is its chunks' sum, its token mass
    their concatenation (``[sum of chunk tokens]``), its passages theirs at offsets into the whole text
    (most attended first, as many as its chunk with the most)."""
    out, i = [], 0
    for doc in docs:
        chunks = engine.chunks(doc)
        parts, i = att.documents[i : i + len(chunks)], i + len(chunks)
        passages, start = [], 0
        for c, p in zip(chunks, parts):
            lead = start + len(c.text) - len(c.text.lstrip())  # chunk texts concatenate to the normalised text
            passages += [(a + lead, b + lead, s * p.share) for a, b, s in p.passages]
            start += len(c.text)
        share = sum(p.share for p in parts)
        passages = sorted([(a, b, s / share if share else 0.0) for a, b, s in passages], key=lambda x: -x[2])
        out.append(DocumentAttribution(share, torch.cat([p.token_mass for p in parts]),
                                       passages[: max(len(p.passages) for p in parts)]))
    return Attribution(att.prefix, out)


def explain_answer(engine: Engine, question: str, docs: list[Document], k: int | None = None,
                   retention: float | None = None, **sampling) -> tuple[Answer, Attribution]:
    """:meth:`Engine.answer` with its :class:`Attribution`.

    Raises:
        as :meth:`Engine.link_context`.
    """
    t0 = time.perf_counter()
    with explaining(engine, docs, k) as mass:
        ctx, hits = engine.link_context(question, docs, k, retention)
        ans = engine.finish(ctx, engine.sampling(**sampling), t0, hits)
    return ans, attribution(engine, mass, ctx, docs)


def attribution_json(att: Attribution) -> dict:
    """``{"prefix": share, "documents": [{"share", "passages": [{"start", "end", "share"}]}]}`` (JSON-able)."""
    return {"prefix": round(att.prefix, 6), "documents": [
        {"share": round(d.share, 6),
         "passages": [{"start": a, "end": b, "share": round(s, 6)} for a, b, s in d.passages]}
        for d in att.documents]}
