"""What a one-paragraph edit of a long document re-encodes: chunked (:mod:`kvlink_rag.text.chunking`) vs one block.

A document of NQ passages (one paragraph each) of about ``target_tokens`` tokens is encoded, one paragraph
in the middle is edited (a sentence appended), and the edited document is made ready again: chunked, only
the chunks whose text changed are encoded; as one block, all of it. Reported: chunks and tokens
re-encoded, KV bytes written (K and V in the engine's ``kv_dtype``) and encode seconds, and over every
paragraph edited in turn (tokenizer only) how many chunks each edit changes.
"""

from __future__ import annotations

import time

from evaluation.long_docs import join_passages
from evaluation.nq import NQExample
from kvlink_rag.cache import MemoryCache
from kvlink_rag.engine import Engine
from kvlink_rag.types import Document, DocumentKV

EDIT = " This paragraph was edited after the document was first stored."


class CountingCache(MemoryCache):
    """A memory cache that counts the documents put into it and their KV bytes."""

    def __init__(self):
        super().__init__()
        self.puts, self.bytes, self.tokens = 0, 0, 0

    def put(self, key: str, kv: DocumentKV) -> None:
        self.puts, self.bytes, self.tokens = self.puts + 1, self.bytes + kv.nbytes, self.tokens + kv.num_tokens
        super().put(key, kv)


def long_text(engine: Engine, examples: list[NQExample], target_tokens: int) -> Document:
    """NQ gold passages joined one per paragraph until the document has about ``target_tokens`` framed
    tokens (never more than :meth:`Engine.max_document_tokens`, so that it can be one block)."""
    limit = min(target_tokens, engine.max_document_tokens())
    passages, doc = [], None
    for ex in examples:
        cand = join_passages(passages + [ex.gold])
        if engine.document_ids(cand).numel() > limit:
            break
        passages.append(ex.gold)
        doc = cand
    return doc


def edit_paragraph(doc: Document, i: int) -> Document:
    """``doc`` with :data:`EDIT` appended to paragraph ``i`` (paragraphs: blank-line separated)."""
    paras = doc.text.split("\n\n")
    paras[i] += EDIT
    return Document("\n\n".join(paras), doc.title)


def _ready(engine: Engine, doc: Document) -> dict:
    """Encode what ``doc`` lacks in ``engine``'s (counting) cache: ``{chunks, encoded, tokens, bytes, s}``."""
    cache: CountingCache = engine.cache
    puts, nbytes, tokens = cache.puts, cache.bytes, cache.tokens
    t0 = time.perf_counter()
    engine.warm(doc)
    return {"chunks": len(engine.chunks(doc)), "encoded": cache.puts - puts, "tokens": cache.tokens - tokens,
            "bytes": cache.bytes - nbytes, "s": time.perf_counter() - t0}


def edit_stability(engine: Engine, doc: Document) -> dict:
    """Every paragraph edited in turn (chunking only, nothing encoded): ``{"edits", "changed": {n: count},
    "mean_changed"}`` where n is how many of the edited document's chunk caches are not among the original's
    (by cache key: with ``chunk_context`` a chunk after a changed one changes key too)."""
    before = set(engine.cache_keys(doc))
    n_paras = len(doc.text.split("\n\n"))
    changed: dict[int, int] = {}
    for i in range(n_paras):
        n = sum(k not in before for k in engine.cache_keys(edit_paragraph(doc, i)))
        changed[n] = changed.get(n, 0) + 1
    return {"edits": n_paras, "changed": dict(sorted(changed.items())),
            "mean_changed": sum(n * c for n, c in changed.items()) / n_paras}


def measure(engine: Engine, examples: list[NQExample], target_tokens: int = 8000, chunk_tokens: int = 512,
            log=print, parts: tuple[str, ...] = ("chunked", "block")) -> dict:
    """Chunked vs one block after a one-paragraph edit of a ~``target_tokens`` document (see module notes);
    ``parts`` picks which of the two to encode (one block of 8k tokens takes minutes on a CPU)."""
    doc = long_text(engine, examples, target_tokens)
    mid = len(doc.text.split("\n\n")) // 2
    edited = edit_paragraph(doc, mid)
    chunked = engine.with_chunk_tokens(chunk_tokens)
    chunked.cache = CountingCache()
    block = engine.with_chunk_tokens(0)
    block.cache = CountingCache()
    out = {"document_tokens": int(engine.document_ids(doc).numel()), "paragraphs": len(doc.text.split("\n\n")),
           "chunk_tokens": chunk_tokens, "linked_tokens_chunked": chunked.linked_tokens(doc),
           "kv_dtype": engine.settings.kv_dtype, "chunk_context": engine.settings.chunk_context,
           "chunk_context_from": engine.settings.chunk_context_from}
    log(f"document: {out['document_tokens']} tokens, {out['paragraphs']} paragraphs; editing paragraph {mid}")
    if "chunked" in parts:
        out["chunked_first"] = _ready(chunked, doc)
        log(f"chunked, first encode: {out['chunked_first']}")
        out["chunked_edit"] = _ready(chunked, edited)
        log(f"chunked, after the edit: {out['chunked_edit']}")
    if "block" in parts:
        out["one_block_edit"] = _ready(block, edited)  # the first encode costs the same: all of it is re-encoded
        log(f"one block, after the edit: {out['one_block_edit']}")
    out["stability"] = edit_stability(chunked, doc)
    log(f"every paragraph edited in turn: {out['stability']}")
    return out


def markdown(r: dict) -> str:
    """The BENCHMARKS.md table of a :func:`measure` result (parts not measured show as -)."""
    none = {"chunks": "-", "encoded": "-", "tokens": "-", "bytes": float("nan"), "s": float("nan")}
    c, b, f = (r.get(p, none) for p in ("chunked_edit", "one_block_edit", "chunked_first"))
    mib = lambda n: "-" if n != n else f"{n / 2**20:.1f} MiB"  # noqa: E731 - a part not measured (nan): "-"
    sec = lambda t: "-" if t != t else f"{t:.2f}"  # noqa: E731
    st = r["stability"]
    return "\n".join([
        f"Document of {r['document_tokens']} tokens ({r['paragraphs']} NQ passages, one per paragraph), "
        f"{r['kv_dtype']} KV; one paragraph in the middle edited (a sentence appended)"
        + _context_note(r), "",
        "| after the edit | caches encoded | tokens encoded | KV bytes written | encode s |", "|---|---|---|---|---|",
        f"| one block | 1 of 1 | {b['tokens']} | {mib(b['bytes'])} | {sec(b['s'])} |",
        f"| chunks of <= {r['chunk_tokens']} tokens | {c['encoded']} of {c['chunks']} | {c['tokens']} | "
        f"{mib(c['bytes'])} | {sec(c['s'])} |", "",
        f"The chunked document's first encode: {f['encoded']} chunks, {f['tokens']} tokens, {mib(f['bytes'])}, "
        f"{sec(f['s'])} s; linked it takes {r['linked_tokens_chunked']} positions before its last link tokens. "
        f"Every paragraph edited in turn ({st['edits']} edits): chunks changed per edit {st['changed']} "
        f"(mean {st['mean_changed']:.2f}).", ""])


def _context_note(r: dict) -> str:
    """How the result's chunks were encoded, as a sentence's end (nothing about chunks when none were encoded)."""
    if "chunked_first" not in r:
        return "."
    if not r.get("chunk_context"):
        return "; chunks encoded alone."
    if r.get("chunk_context_from") == "cache":
        return "; each chunk encoded after the stored caches of every chunk before it (read, not recomputed)."
    return "; chunks encoded in context (each after the chunk before it, which runs through the model again but is not stored)."
