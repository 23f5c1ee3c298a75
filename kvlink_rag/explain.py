"""Explained answers: a linked answer made under attention capture, and its per-document attribution.

The capture runs the eager attention kernel for the link forward and every decoding step
(:func:`kvlink_rag.attention.capture_attention`): SDPA returns no weights, so explaining costs the eager
kernel's extra time on those forwards only (documents are never re-encoded).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from .answer import Answer
from .attention import capture_attention
from .attribution import AttentionMass, Attribution, attribute, char_passages, top_spans
from .engine import Engine
from .prompt import normalize_text, user_text_offsets
from .types import Document, LinkedContext


def link_rows(engine: Engine, n_docs: int, k: int | None = None) -> int:
    """Link-token rows of the link forward: ``n_docs`` times the link tokens per document in use (``k``
    overrides the loaded K; 0 = none)."""
    if engine.link_tokens is None or k == 0:
        return 0
    return n_docs * (engine.link_k if k is None else min(k, engine.link_k))


@contextmanager
def explaining(engine: Engine, n_docs: int, k: int | None = None) -> Iterator[AttentionMass]:
    """Capture the attention of the question and answer tokens of the linked answer made in the block."""
    mass = AttentionMass(skip_rows=link_rows(engine, n_docs, k))
    with capture_attention(engine.lm, mass):
        yield mass


def attribution(engine: Engine, mass: AttentionMass, ctx: LinkedContext, docs: list[Document]) -> Attribution:
    """Shares of prefix and documents and each document's top passages (character offsets into its text,
    as normalised), from the mass captured while ``ctx`` was linked and decoded."""
    lengths = [s.length for s in ctx.segments if s.kind == "document"]
    att = attribute(mass, ctx.segments, ctx.storage_positions, lengths)
    tok = engine.lm.tokenizer
    for doc, d in zip(docs, att.documents):
        framed = engine.template.document_text(doc.text, doc.title)
        body = normalize_text(doc.text)
        try:
            offsets = user_text_offsets(tok, framed)
        except ValueError:
            continue
        if len(offsets) != d.token_mass.numel():
            continue
        d.passages = char_passages(top_spans(d.token_mass), offsets, framed.find(body), len(body))
    return att


def explain_answer(engine: Engine, question: str, docs: list[Document], k: int | None = None,
                   retention: float | None = None, **sampling) -> tuple[Answer, Attribution]:
    """:meth:`Engine.answer` with its :class:`Attribution`.

    Raises:
        as :meth:`Engine.link_context`.
    """
    t0 = time.perf_counter()
    with explaining(engine, len(docs), k) as mass:
        ctx, hits = engine.link_context(question, docs, k, retention)
        ans = engine.finish(ctx, engine.sampling(**sampling), t0, hits)
    return ans, attribution(engine, mass, ctx, docs)


def attribution_json(att: Attribution) -> dict:
    """``{"prefix": share, "documents": [{"share", "passages": [{"start", "end", "share"}]}]}`` (JSON-able)."""
    return {"prefix": round(att.prefix, 6), "documents": [
        {"share": round(d.share, 6),
         "passages": [{"start": a, "end": b, "share": round(s, 6)} for a, b, s in d.passages]}
        for d in att.documents]}
