"""Long documents built from NQ passages: the gold passage among distractors, as paragraphs of ONE document
(the accuracy test and the edit benchmark of chunked documents, :mod:`kvlink_rag.text.chunking`)."""

from __future__ import annotations

from .nq import NQExample, build_documents
from kvlink_rag.types import Document


def join_passages(passages: list[Document]) -> Document:
    """One untitled document whose paragraphs (blank-line separated) are ``passages``, each as
    ``"<title>\\n<text>"`` (just the text when untitled), in order."""
    paras = [f"{p.title}\n{p.text.strip()}" if p.title else p.text.strip() for p in passages]
    return Document("\n\n".join(paras))


def long_document(examples: list[NQExample], index: int, n_passages: int, gold_position: str = "random",
                  seed: int = 0) -> tuple[Document, int]:
    """``(document, gold paragraph index)``: ``examples[index]``'s gold passage among ``n_passages - 1``
    distractors (:func:`evaluation.nq.build_documents`, same seed rule) joined into one document.

    Raises:
        ValueError: as :func:`evaluation.nq.build_documents`.
    """
    docs, slot = build_documents(examples, index, n_passages, gold_position, seed)
    return join_passages(docs), slot
