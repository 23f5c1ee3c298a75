"""Benchmark inputs: 10 NQ documents whose context totals a target number of tokens."""

from __future__ import annotations

from evaluation.nq import NQExample
from kvlink_rag.engine import Engine
from kvlink_rag.types import Document


def documents_for_budget(engine: Engine, examples: list[NQExample], n_docs: int, total_tokens: int,
                         start: int = 0) -> list[Document]:
    """``n_docs`` documents, each joining consecutive NQ passages and cut to ``total_tokens // n_docs``
    tokens (at a token boundary, decoded back to text), so the documents total ~``total_tokens`` and an
    8k budget still fits an 8k-position model with prefix, link tokens and question.

    Raises:
        ValueError: not enough passages in ``examples``.
    """
    per_doc = max(1, total_tokens // n_docs)
    docs, i = [], start
    for _ in range(n_docs):
        parts, tokens = [], 0
        while tokens < per_doc:
            if i >= len(examples):
                raise ValueError("not enough passages for the requested context length")
            text = examples[i].gold.text
            parts.append(text)
            tokens += engine.document_ids(Document(text)).numel()
            i += 1
        tok = engine.lm.tokenizer
        ids = tok(" ".join(parts), add_special_tokens=False)["input_ids"][:per_doc]
        docs.append(Document(tok.decode(ids).strip(), examples[i - 1].gold.title))
    return docs
