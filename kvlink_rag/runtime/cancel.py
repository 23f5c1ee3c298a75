"""Cancelling a request inside the engine: the error a cancelled request ends with, and the cache view that
stops loading its documents once it is cancelled (the service binds clients to requests:
:mod:`service.cancellation`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from ..cache import DocumentCache
from ..types import DocumentKV, LayeredDocuments, RetainedKV


class Cancelled(RuntimeError):
    """The request was cancelled (its client went away) before its answer was ready."""

    def __init__(self, what: str = "the request"):
        super().__init__(f"{what} was cancelled: the client closed the connection")
        self.what = what


class CancellableCache(DocumentCache):
    """A request's cache view that stops once ``cancelled()`` is true: before resolving, after storing an
    encoded document (kept: other requests use it) and before each streamed layer (the prefetch reader then
    stops too).

    Args:
        inner: the request's cache (a ``RecordingCache``); other attributes are read from it.
        cancelled: whether the request was cancelled.
    Raises (from its methods): Cancelled.
    """

    def __init__(self, inner: DocumentCache, cancelled: Callable[[], bool]) -> None:
        self.inner, self._cancelled = inner, cancelled

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def _check(self) -> None:
        if self._cancelled():
            raise Cancelled("the request's document loads")

    def key(self, fingerprint: str, text: str) -> str:
        return self.inner.key(fingerprint, text)

    def get(self, key: str) -> DocumentKV | None:
        self._check()
        return self.inner.get(key)

    def put(self, key: str, kv: DocumentKV) -> str | None:
        reason = self.inner.put(key, kv)
        self._check()
        return reason

    def resolve(self, keys: list[str], retention: float = 1.0, method: str = "importance"
                ) -> list[DocumentKV | RetainedKV | str | None]:
        self._check()
        return self.inner.resolve(keys, retention, method)

    def stream(self, items: list[DocumentKV | RetainedKV | str], retention: float = 1.0,
               method: str = "importance") -> LayeredDocuments:
        self._check()
        docs = self.inner.stream(items, retention, method)
        docs.layers = self._layers(docs.layers)
        return docs

    def _layers(self, layers: Iterator) -> Iterator:
        try:
            for layer in layers:
                self._check()
                yield layer
        finally:
            close = getattr(layers, "close", None)
            if close is not None:
                close()  # the prefetch reader stops before its next layer


def cancellable_engine(engine, cancelled: Callable[[], bool]):
    """A shallow copy of ``engine`` (a :class:`~kvlink_rag.engine.Engine`) whose cache is a
    :class:`CancellableCache` over its own: it stops loading once ``cancelled()`` is true. The engine a request's
    ``make_engine`` returns may be shared: it is not changed."""
    import copy

    view = copy.copy(engine)
    view.cache = CancellableCache(engine.cache, cancelled)
    return view
