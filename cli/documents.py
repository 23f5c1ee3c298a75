"""Documents from files, as ``ask --doc`` and ``ingest`` read them."""

from __future__ import annotations

from pathlib import Path

from cli.common import fail
from kvlink_rag.nq import DataFormatError, iter_jsonl


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
