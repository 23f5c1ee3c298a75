"""The engine's documents: a document's ids, cache keys and chunks, the token budget a document may take,
its encoding, and the resolution of a request's documents to cached or fresh KV (what the linker and the
batching scheduler read). :class:`~kvlink_rag.engine.Engine` is built on it; it holds no state of its own but
a memo of documents' token ids.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from .cache import DocumentCache
from .linking.chunk_past import chunk_past, chunk_walk, fitting
from .linking.document_prefill import encode_document
from .linking.linker import link_count
from .reuse.doc_side import encode_with_adapter
from .text.chunking import chunks_before, continues
from .text.prompt import has_special_text
from .types import ContextTooLong, Document, DocumentKV, LayeredDocuments, RetainedKV

if TYPE_CHECKING:
    from .linking.context import PrefixKV
    from .linking.link_tokens import LinkTokens
    from .model.loader import LoadedModel
    from .settings import EngineSettings
    from .text.chunking import Chunker
    from .text.prompt import PromptTemplate


class EngineDocuments:
    """Documents of one engine (set up by :class:`~kvlink_rag.engine.Engine`'s constructor).

    Attributes:
        settings, lm, template, prefix, anchored, fingerprint, link_tokens, doc_adapter, min_question_tokens,
        cache, chunker: see :class:`~kvlink_rag.engine.Engine`.
    """

    settings: EngineSettings
    lm: LoadedModel
    template: PromptTemplate
    prefix: PrefixKV
    anchored: bool
    fingerprint: str
    link_tokens: LinkTokens | None
    doc_adapter: str | None
    min_question_tokens: int
    cache: DocumentCache
    chunker: Chunker
    token_memo: Callable[[str, str | None, bool], torch.Tensor]

    def document_ids(self, doc: Document) -> torch.Tensor:
        """``[tokens]`` int64 ids of ``doc`` tokenised alone (memoised per text and title: a request's documents
        were tokenised twice at admission, for the fit check and the layout, and again by the chunker; callers
        must not modify the tensor). Raises ValueError if empty."""
        return self.token_memo(doc.text, doc.title, self.framed(doc))

    def framed(self, doc: Document) -> bool:
        """Whether ``doc`` carries the document frame: all but a chunk encoded in context past its document's first
        when ``chunk_frames`` is 'first' (that chunk is its bare text)."""
        return not (self.settings.chunk_frames == "first" and doc.context is not None and bool(doc.chunk))

    def document_text(self, doc: Document) -> str:
        """``doc`` as it appears in the prompt (:meth:`~kvlink_rag.text.prompt.PromptTemplate.document_text`)."""
        return self.template.document_text(doc.text, doc.title, self.framed(doc))

    def _context_framed(self, doc: Document) -> bool:
        """Whether the text ``doc`` is encoded after carries the frame: always, but with ``chunk_frames`` 'first'
        only where that text starts at the document's first chunk (chunk index <= ``chunk_context``)."""
        return self.settings.chunk_frames != "first" or (doc.chunk or 0) <= self.settings.chunk_window

    def context_ids(self, doc: Document) -> torch.Tensor | None:
        """``[tokens]`` int64 ids of the text ``doc`` is encoded after (its :attr:`Document.context`, framed as it
        sits in the prompt), or None for a document encoded alone."""
        return None if doc.context is None else self.token_memo(doc.context, doc.title, self._context_framed(doc))

    def cache_key(self, doc: Document, cache: DocumentCache | None = None) -> str:
        """Exact key of a document's cache: encoding fingerprint and the hash of its exact prompt text.

        Args:
            cache: the cache whose keys to make (e.g. one tenant's view of the store); default this
                engine's cache.

        A chunk encoded in context (``doc.context``) is salted with the hash of the text before it (and with whether it
        read that text's caches, ``chunk_context_from``). A text
        holding a special token's string gets a salted key: its ids changed when user text stopped
        being parsed for special tokens, so a cache stored before must not be reused.
        """
        text = self.document_text(doc)
        salt = "|plain-user-text" if has_special_text(self.lm.tokenizer, text) else ""
        if doc.context is not None:  # a chunk encoded after the one before it: keyed by both texts
            before = self.template.document_text(doc.context, doc.title, self._context_framed(doc))
            past = "|after-cache:" if self.settings.chunk_context_from == "cache" else "|after:"  # its caches, or text
            salt += past + hashlib.sha256(before.encode()).hexdigest()
        return (cache if cache is not None else self.cache).key(self.fingerprint + salt, text)

    def chunks(self, doc: Document) -> list[Document]:
        """``doc``'s chunks in order (:mod:`kvlink_rag.text.chunking`): ``[doc]`` when it fits ``chunk_tokens`` (or
        chunking is off), else pieces of at most ``chunk_tokens`` framed tokens, each cached under its own key.

        Raises:
            ValueError: empty document.
        """
        return self.chunker(doc)

    def expand(self, docs: list[Document]) -> list[Document]:
        """The slots of ``docs``: each document's :meth:`chunks` in order (link tokens follow each slot not joined to
        the next, :meth:`joins`)."""
        return [c for d in docs for c in self.chunks(d)]

    def joins(self, slots: list[Document]) -> list[bool] | None:
        """Per slot, True where the next slot continues it with no link tokens between (``chunk_links`` 'last':
        a chunk encoded in the context of the one before it, :func:`~kvlink_rag.text.chunking.continues`); None
        where link tokens follow every slot (the linker's :func:`~kvlink_rag.linking.linker.plan_layout`)."""
        if self.settings.chunk_links != "last":
            return None
        out = [continues(a, b) for a, b in zip(slots, slots[1:])] + [False]
        return out if any(out) else None

    def cache_keys(self, doc: Document, cache: DocumentCache | None = None) -> list[str]:
        """The keys of ``doc``'s chunk caches (one key, :meth:`cache_key`, for a document that is not chunked)."""
        return [self.cache_key(c, cache) for c in self.chunks(doc)]

    def linked_tokens(self, doc: Document) -> int:
        """Positions ``doc`` takes in a linked prompt before its last K link tokens: its framed ids, or for a
        chunked document its chunks' ids and the K link tokens between them (none between joined chunks,
        :meth:`joins`; compare with :meth:`max_document_tokens`). Raises ValueError: empty document."""
        chunks = self.chunks(doc)
        links = link_count(len(chunks), self.joins(chunks)) - 1  # the last chunk's K are not counted here
        return sum(int(self.document_ids(c).numel()) for c in chunks) + self.link_k * links

    def warm(self, doc: Document) -> bool:
        """Encode and cache whichever of ``doc``'s chunks are not cached; True when all were cached already.

        Asks the cache where each chunk is (:meth:`DocumentCache.resolve`: in memory, stored, or nowhere)
        without reading a stored one, so warming documents a store holds already costs a key lookup each
        (a resumed ``train-links --preencode`` re-read 5,223 stored documents in 226 s before)."""
        chunks = self.chunks(doc)
        found = self.cache.resolve([self.cache_key(c) for c in chunks])
        missing = [c for c, f in zip(chunks, found) if f is None]
        with chunk_walk():  # a chunk's past continues the one before it
            for c in missing:
                self.cache.put(self.cache_key(c), self.encode(c))
        return not missing

    def max_document_tokens(self) -> int:
        """Longest document (tokens, framing included) that can still be asked about alone.

        The model's context (``max_position_embeddings``) less the anchor prefix, the K link tokens after
        the document, the shortest question with the assistant header and one new token. At most 0 when
        nothing fits.
        """
        return self.lm.max_positions - self.prefix.num_tokens - self.link_k - self.min_question_tokens - 1

    @property
    def link_k(self) -> int:
        """Link tokens per document (0 without link tokens)."""
        return self.link_tokens.k if self.link_tokens is not None else 0

    def document_budget_text(self) -> str:
        """How :meth:`max_document_tokens` is made up, for error messages."""
        return (f"the model's context of {self.lm.max_positions} positions less the {self.prefix.num_tokens}-token "
                f"prefix, {self.link_k} link tokens, a question of at least {self.min_question_tokens} tokens and "
                "1 new token")

    def check_document_tokens(self, n: int) -> None:
        """Raises ContextTooLong when a document of ``n`` tokens can never be asked about."""
        limit = self.max_document_tokens()
        if n > limit:
            raise ContextTooLong(f"document has {n} tokens; the longest this model can answer over is {limit} "
                                 f"({self.document_budget_text()})")

    def check_fits(self, docs: list[Document], text_tokens: int, k: int | None = None, new_tokens: int = 1) -> None:
        """Raise when a linked prompt over ``docs`` cannot fit the model's context, counted from token ids alone
        (tokenising is cheap, encoding is not): the check to run before any of ``docs`` is encoded or stored.

        The count is the linker's (:func:`kvlink_rag.linking.linker.check_link_inputs`): the prefix, every chunk
        (:meth:`chunks`) of every document with ``k`` link tokens after each chunk not joined to the next
        (:meth:`joins`), ``text_tokens`` and
        ``new_tokens``; retention and CacheBlend keep every position, so they change nothing.

        Args:
            docs: the request's documents, whole (a long document is counted as its chunks).
            text_tokens: the question's (or conversation's) ids with the assistant header.
            k: link tokens per chunk (0: naive reuse); None: the loaded K (:attr:`link_k`).
            new_tokens: positions that must stay free after the prompt.
        Raises:
            ValueError: an empty document.
            ContextTooLong: the tokens by part (documents counted as documents), the largest document's tokens
                and chunks, and the context, in tokens.
        """
        k = self.link_k if k is None else k
        chunks = [self.chunks(d) for d in docs]
        sizes = [[int(self.document_ids(c).numel()) for c in cs] for cs in chunks]
        slots = [c for cs in chunks for c in cs]
        doc_tokens, links = sum(map(sum, sizes)), link_count(len(slots), self.joins(slots))
        total = self.prefix.num_tokens + doc_tokens + k * links + text_tokens
        if total + new_tokens > self.lm.max_positions:
            raise ContextTooLong(
                f"the prompt needs {total} tokens (prefix {self.prefix.num_tokens}, {_documents(len(docs))} "
                f"{doc_tokens}, link tokens {k * links}, question {text_tokens}) plus {new_tokens} new token(s); "
                f"the model's context holds {self.lm.max_positions} tokens{_largest(docs, sizes)}")

    def encode(self, doc: Document, before: list[DocumentKV] | None = None) -> DocumentKV:
        """Precompute ``doc``'s position-free KV (a chunk with ``context``: after the text before it, or with
        ``chunk_context_from`` 'cache' after the caches of the chunks before it: ``before`` in order, else read
        through :meth:`get_or_encode`).

        Runs under no_grad (not inference mode) so that training can attend to the result.

        Raises:
            ValueError: empty document. ContextTooLong: longer than :meth:`max_document_tokens`.
        """
        ids = self.document_ids(doc)
        self.check_document_tokens(int(ids.numel()))
        prefix = self.prefix if self.anchored else None
        if self.settings.chunk_context_from == "cache" and doc.context is not None:
            with chunk_walk() as walk:  # the chunks before, each encoded after those before it, in one growing past
                if before is None:
                    before = [walk.read(self.cache_key(d), lambda d=d: self.get_or_encode(d)[0])
                              for d in chunks_before(doc)]
                prefix, context = self.past(doc, before), None
        else:  # a chunk in context: encoded right after the framed text before it (its last ids, where they fit)
            context = self.context_ids(doc)
        if self.doc_adapter is not None:
            with torch.no_grad():
                return encode_with_adapter(self.lm, ids, self.doc_adapter, prefix=prefix, context=context,
                                           kv_dtype=self.settings.kv_dtype, fingerprint=self.fingerprint)
        return encode_document(self.lm, ids, kv_dtype=self.settings.kv_dtype, prefix=prefix, context=context,
                               fingerprint=self.fingerprint, importance=self.settings.importance_scores)

    def past(self, doc: Document, before: list[DocumentKV]) -> PrefixKV | None:
        """The prefix chunk ``doc`` is encoded after with ``chunk_context_from`` 'cache': the anchor prefix (anchored
        encoding) and the caches ``before`` of the chunks before it, in order, the earliest dropped whole where they
        do not fit the model's context beside ``doc`` (:func:`~kvlink_rag.linking.chunk_past.chunk_past`)."""
        prefix = self.prefix if self.anchored else None
        room = self.lm.max_positions - (prefix.num_tokens if prefix is not None else 0) - len(self.document_ids(doc))
        return chunk_past(self.lm, prefix, fitting(before, room))

    def get_or_encode(self, doc: Document) -> tuple[DocumentKV, bool]:
        """The cached KV of ``doc`` (hit=True) or a fresh encoding stored in the cache (hit=False)."""
        key = self.cache_key(doc)
        kv = self.cache.get(key)
        if kv is not None and kv.fingerprint == self.fingerprint:
            return kv, True
        kv = self.encode(doc)
        self.cache.put(key, kv)
        return kv, False

    def resolve_documents(self, docs: list[Document], retention: float = 1.0, method: str = "importance"
                          ) -> tuple[list[DocumentKV] | LayeredDocuments, list[bool]]:
        """Documents as a link source at ``retention`` (slot order) and, per document, whether it was a cache
        hit (:meth:`DocumentCache.resolve`); the linker's and the batching scheduler's way to the caches.

        Documents in memory are used in place, stored ones (e.g. only in LMDB) are streamed layer by layer
        (prefetch overlapping the linker), and missing ones (or cached under another fingerprint) are
        encoded now, once per key, and put in the cache. A memory tier holding a document at a lower retention
        (the cold tier) serves it only when it holds every token ``retention`` keeps; else it is read as stored.
        """
        keys = [self.cache_key(d) for d in docs]
        items = [None if isinstance(it, (DocumentKV, RetainedKV)) and it.fingerprint != self.fingerprint else it
                 for it in self.cache.resolve(keys, retention, method)]
        hits = [it is not None for it in items]
        encoded: dict[str, DocumentKV] = {}
        with chunk_walk():  # a document's missing chunks in order: each past continues the one before
            for i, (d, it) in enumerate(zip(docs, items)):
                if it is None:
                    if keys[i] not in encoded:
                        encoded[keys[i]] = self.encode(d)
                        self.cache.put(keys[i], encoded[keys[i]])
                    items[i] = encoded[keys[i]]
        if any(isinstance(it, str) for it in items):
            try:
                return self.cache.stream(items, retention, method), hits
            except LookupError:
                items, hits = [self.get_or_encode(d)[0] for d in docs], [False] * len(docs)
        if retention < 1.0:
            return LayeredDocuments.from_documents(items, retention, method), hits
        return items, hits


def _documents(n: int) -> str:
    return f"{n} document{'s' * (n != 1)}"


def _largest(docs: list[Document], sizes: list[list[int]]) -> str:
    """`` (document 'a' has 900 tokens in 3 chunks)``: the largest of ``docs`` (``sizes``: its chunks' tokens), or
    of several `` (the longest, 'a', has ...)``; a document without a title by its place (``#2``)."""
    if not docs:
        return ""
    i = max(range(len(docs)), key=lambda j: sum(sizes[j]))
    name = repr(docs[i].title) if docs[i].title else f"#{i + 1}"
    chunks = f" in {len(sizes[i])} chunks" if len(sizes[i]) > 1 else ""
    who = f"document {name}" if len(docs) == 1 else f"the longest, {name},"
    return f" ({who} has {sum(sizes[i])} tokens{chunks})"
