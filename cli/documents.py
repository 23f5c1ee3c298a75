"""Documents from files, as ``ask --doc`` and ``ingest`` read them, and the inputs of ``ask``/``explain``, and
whether they fit the model's context before any is encoded."""

from __future__ import annotations

from pathlib import Path

from cli.common import fail
from evaluation.nq import DataFormatError, iter_jsonl


def read_documents(paths: list[Path]) -> list[dict]:
    """Documents from text files (one each: id = file name, title = stem) and JSONL(.gz) files (one
    object per line with ``text`` and optional ``id``, ``title``, ``metadata``). Exits on bad input."""
    docs: list[dict] = []
    for p in paths:
        if not p.exists():
            fail(f"{p} does not exist")
        if p.is_dir():
            fail(f"{p} is a folder; pass the files")
        name = p.name.lower()
        if name.endswith((".jsonl", ".jsonl.gz")):
            try:
                for n, obj in iter_jsonl(p):
                    if not isinstance(obj, dict) or not isinstance(obj.get("text"), str) or not obj["text"].strip():
                        fail(f"{p}:{n}: each line needs a non-empty string 'text'")
                    docs.append({"id": str(obj["id"]) if obj.get("id") is not None else f"{p.stem}-{n}",
                                 "text": obj["text"], "title": str(obj.get("title") or ""),
                                 "metadata": obj.get("metadata") or {}})
            except DataFormatError as e:
                fail(str(e))
            continue
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            fail(f"{p} is not UTF-8 text")
        if not text.strip():
            fail(f"{p} is empty")
        docs.append({"id": p.name, "text": text, "title": p.stem, "metadata": {}})
    if not docs:
        fail("no documents found in the given files")
    return docs


def _read_docs(paths: list[Path]):
    """Documents from files (text files, or JSONL with a ``text`` field); exits on bad input."""
    from kvlink_rag.types import Document

    return [Document(text=d["text"], title=d["title"] or None) for d in read_documents(paths)]


def ask_inputs(question, doc, nq, index, docs, gold_position):
    """``(question, documents, gold answers)`` of ``ask``, read and checked before the model loads."""
    from evaluation.nq import DataFormatError, build_documents, load_nq

    if nq is None:
        if not question or not question.strip():
            fail("give a question (or --nq FILE)")
        if not doc:
            fail("give at least one --doc FILE (a question alone has no documents)")
        return question, _read_docs(doc), []
    try:
        examples = load_nq(nq)
        documents, _ = build_documents(examples, index, docs, gold_position)
    except (DataFormatError, ValueError) as e:
        fail(str(e))
    return examples[index].question, documents, list(examples[index].answers)


FIT_HINT = ("ask over fewer or shorter documents (one alone can take at most {limit} tokens, its chunks' link tokens "
            "included), or split a long file into such parts, `kvlink-rag ingest` them and ask with `kvlink-rag "
            "query`, which links only the chunks the question retrieves")
"""How ``ask``/``explain`` documents can fit (``limit``: the engine's ``max_document_tokens``)."""
NQ_HINT = "use fewer --docs"
"""How an NQ question's documents (``--nq``) can fit."""


def check_fits(engine, question: str, documents, hint: str = FIT_HINT) -> None:
    """Exit with one line when the linked prompt of ``question`` over ``documents`` cannot fit the model's
    context: counted from token ids (``Engine.check_fits``), before any document is encoded or stored. ``hint``
    ends the line (``{limit}`` in it: the longest document the model can take alone, in tokens)."""
    from kvlink_rag.types import ContextTooLong

    try:
        engine.check_fits(documents, int(engine.template.question_ids(engine.lm.tokenizer, question).numel()))
    except ContextTooLong as e:
        fail(f"{e}; {hint.format(limit=engine.max_document_tokens())}")
    except ValueError as e:  # an empty question or document
        fail(str(e))
