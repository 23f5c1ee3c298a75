"""Long documents as linked chunks: content-defined split of a document's text into chunks of at most
``chunk_tokens`` tokens, each a document (and a cache) of its own.

A document whose framed ids (:meth:`kvlink_rag.text.prompt.PromptTemplate.document_ids`) fit ``chunk_tokens``
is left whole. A longer one is split into *units* (paragraphs, each with the blank lines after it; a
paragraph over the budget into sentences; a sentence over it at whitespace, else characters), then the
units are grouped into *runs* by a content-defined rule, and each run into chunks:

- a run ends after unit ``u`` when ``sha256(head(u)) / 2**64 < tokens(u) / (chunk_tokens / 2)``, ``head``
  being the unit's first :data:`HEAD_CHARS` characters: whether a unit closes a run depends on that unit
  alone (a run holds ``chunk_tokens / 2`` tokens on average), never on the text before it (the idea of
  content-defined chunking, as in LBFS, Muthitacharoen et al., SOSP 2001, here over paragraphs rather than
  bytes). Hashing the head rather than the whole unit keeps the decision through an edit further into the
  paragraph (it flips only if the token count crosses the threshold): with the whole unit hashed, a third
  of one-paragraph edits of an 8k-token NQ document changed two chunks, not one;
- a run that fits the budget is one chunk; a longer run is packed greedily (units in order while the
  framed chunk fits).

So editing one paragraph changes the chunk(s) of its own run only: one chunk, unless the run is packed
into several (a changed length can move a cut inside that run) or the edit flips whether the paragraph
closes its run (the neighbouring run is then merged or split). Chunks elsewhere keep their exact text,
hence their cache key, and stay cache hits.

The chunk texts concatenate to the document's normalised text. Each chunk is framed like any document
(``Document (Title: t) <chunk>``). With ``context`` (the engine's ``chunk_context``, default 1) each chunk
after the first carries the text of the chunk(s) before it in :attr:`~kvlink_rag.types.Document.context`: it is
encoded right after that text and keyed by both texts, so an edit also changes the keys of the chunks after the
edited one whose context holds it; without it a chunk's cache is that of a document with its text.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace

from ..encodable import normalize_text
from ..types import Document

_PARAGRAPH_END = re.compile(r"\n[ \t]*\n\s*")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_SPACE = re.compile(r"\s+")
MIN_CHUNK_TOKENS = 64
"""Smallest ``chunk_tokens`` accepted: the frame (``Document (Title: ...)``) must leave room for text."""

HEAD_CHARS = 64
"""Characters at the start of a unit whose hash decides whether it closes its run."""

Count = Callable[[str], int]
"""Tokens of a chunk text as framed in the prompt (title included)."""


def split_after(text: str, pattern: re.Pattern) -> list[str]:
    """``text`` cut after every match of ``pattern`` (the match stays with the piece before it); the
    pieces concatenate to ``text``; no empty piece."""
    pieces, pos = [], 0
    for m in pattern.finditer(text):
        if m.end() > pos:
            pieces.append(text[pos : m.end()])
            pos = m.end()
    if pos < len(text):
        pieces.append(text[pos:])
    return pieces


def _longest_prefix(text: str, cuts: list[int], count: Count, budget: int) -> int:
    """The largest cut in ``cuts`` (ascending char offsets) whose prefix of ``text`` fits ``budget``
    (binary search; ``count`` grows with the prefix), or 0 if none does."""
    lo, hi, best = 0, len(cuts) - 1, 0
    while lo <= hi:
        mid = (lo + hi) // 2
        if count(text[: cuts[mid]]) <= budget:
            best, lo = cuts[mid], mid + 1
        else:
            hi = mid - 1
    return best


def split_long(text: str, count: Count, budget: int) -> list[str]:
    """A sentence over ``budget``: pieces that fit, cut after whitespace where possible, else between
    characters. Concatenate to ``text``.

    Raises:
        ValueError: not even one character fits ``budget`` (the frame alone is too long).
    """
    pieces = []
    while text and count(text) > budget:
        cut = _longest_prefix(text, [m.end() for m in _SPACE.finditer(text) if m.end() < len(text)], count, budget)
        if cut == 0:
            cut = _longest_prefix(text, list(range(1, len(text))), count, budget)
        if cut == 0:
            raise ValueError(f"chunk_tokens={budget} leaves no room for text after the document frame")
        pieces.append(text[:cut])
        text = text[cut:]
    return pieces + ([text] if text else [])


def split_units(text: str, count: Count, budget: int) -> list[str]:
    """Paragraphs (blank-line separated, separator kept at the end) of ``text``; a paragraph over
    ``budget`` split into sentences, a sentence over it by :func:`split_long`. Concatenate to ``text``."""
    units = []
    for para in split_after(text, _PARAGRAPH_END):
        if count(para) <= budget:
            units.append(para)
            continue
        for sentence in split_after(para, _SENTENCE_END):
            units.extend([sentence] if count(sentence) <= budget else split_long(sentence, count, budget))
    return units


def closes_run(unit: str, tokens: int, chunk_tokens: int) -> bool:
    """Whether ``unit`` (of ``tokens`` tokens) ends its run: the hash of its first :data:`HEAD_CHARS`
    characters (normalised) below ``tokens / (chunk_tokens / 2)`` (the content-defined rule; depends on this
    unit alone)."""
    head = normalize_text(unit)[:HEAD_CHARS]
    h = int.from_bytes(hashlib.sha256(head.encode("utf-8")).digest()[:8], "big") / 2.0**64
    return h < 2.0 * tokens / chunk_tokens


def runs(units: list[str], count: Count, chunk_tokens: int) -> list[list[str]]:
    """``units`` grouped into runs, each closed by a unit for which :func:`closes_run` holds (the last run
    may end without one)."""
    out, cur = [], []
    for u in units:
        cur.append(u)
        if closes_run(u, count(u), chunk_tokens):
            out.append(cur)
            cur = []
    return out + ([cur] if cur else [])


def pack(run: list[str], count: Count, budget: int) -> list[str]:
    """Chunk texts of one run: the whole run if it fits ``budget``, else units packed greedily in order
    (a unit that does not fit the chunk so far starts the next)."""
    chunks, cur = [], ""
    for u in run:
        if cur and count(cur + u) > budget:
            chunks.append(cur)
            cur = ""
        cur += u
    return chunks + ([cur] if cur else [])


def chunk_text(text: str, count: Count, chunk_tokens: int) -> list[str]:
    """``text`` (normalised) as chunk texts of at most ``chunk_tokens`` tokens each by ``count`` (see the
    module notes); ``[text]`` when it fits. The chunks concatenate to ``text``; deterministic.

    Raises:
        ValueError: ``chunk_tokens`` below :data:`MIN_CHUNK_TOKENS`, or too small for one character.
    """
    if chunk_tokens < MIN_CHUNK_TOKENS:
        raise ValueError(f"chunk_tokens must be at least {MIN_CHUNK_TOKENS} (or 0 for no chunking), got {chunk_tokens}")
    if count(text) <= chunk_tokens:
        return [text]
    units = split_units(text, count, chunk_tokens)
    return [c for run in runs(units, count, chunk_tokens) for c in pack(run, count, chunk_tokens)]


def continues(before: Document, after: Document) -> bool:
    """Whether ``after`` is the chunk that follows ``before`` in one document and was encoded in its context
    (:attr:`Document.context` ends with ``before``'s text, same title, next chunk index): placed right after
    ``before``, its cache sits where it was computed, so no link tokens are needed between them."""
    return (after.context is not None and before.chunk is not None and after.chunk == before.chunk + 1
            and after.title == before.title and after.context.endswith(before.text))


def chunks_before(doc: Document) -> list[Document]:
    """The chunks before chunk ``doc`` of its document, in order (its :attr:`Document.previous` chain).

    Raises:
        ValueError: the chain does not reach the document's first chunk (a chunk not made by a :class:`Chunker`).
    """
    chain, d = [], doc.previous
    while d is not None:
        chain.append(d)
        d = d.previous
    chain.reverse()
    if [c.chunk for c in chain] != list(range(doc.chunk or 0)):
        raise ValueError(f"chunk {doc.chunk} of {doc.title!r} does not carry the chunks before it "
                         "(KVLINK_RAG_CHUNK_CONTEXT_FROM=cache reads them): make chunks with the engine's chunker")
    return chain


class Chunker:
    """A document's chunks as :class:`Document` values (same title, ``chunk`` = index), remembered for the
    last ``memo`` documents (queries ask about the same documents again and again; safe across threads).

    Args:
        count: framed tokens of a text under a title: ``count(text, title) -> int``.
        chunk_tokens: largest chunk (framed tokens); 0 = never chunk.
        context: each chunk after the first carries the text of up to this many chunks before it as its
            ``context`` (encoded after it: an edit then re-encodes its own chunk(s) and the ``context`` after);
            0: none.
    Raises:
        ValueError: ``chunk_tokens`` neither 0 nor at least :data:`MIN_CHUNK_TOKENS`.
    """

    def __init__(self, count: Callable[[str, str | None], int], chunk_tokens: int, memo: int = 4096,
                 context: int = 0):
        if chunk_tokens and chunk_tokens < MIN_CHUNK_TOKENS:
            raise ValueError(f"chunk_tokens must be 0 or at least {MIN_CHUNK_TOKENS}, got {chunk_tokens}")
        self.count, self.chunk_tokens, self.memo, self.context = count, chunk_tokens, memo, context
        self._seen: OrderedDict[tuple[str, str | None], list[Document]] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, doc: Document) -> list[Document]:
        """``[doc]`` when chunking is off, ``doc`` is already a chunk or it fits; else its chunks in order.

        Raises:
            ValueError: empty document text.
        """
        if not self.chunk_tokens or doc.chunk is not None:
            return [doc]
        key = (doc.text, doc.title)
        with self._lock:
            if key in self._seen:
                self._seen.move_to_end(key)
                return self._seen[key]
        texts = chunk_text(normalize_text(doc.text), lambda t: self.count(t, doc.title), self.chunk_tokens)
        w = max(0, int(self.context))
        before = [("".join(texts[max(0, i - w):i]) or None) if w else None for i in range(len(texts))]
        out = [doc]  # a document that fits stays whole
        if len(texts) > 1:  # chunks, each carrying the one before it (Document.previous)
            out = []
            for i, (t, b) in enumerate(zip(texts, before)):
                out.append(replace(doc, text=t, chunk=i, context=b, previous=out[-1] if out else None))
        with self._lock:
            self._seen[key] = out
            if len(self._seen) > self.memo:
                self._seen.popitem(last=False)
        return out
