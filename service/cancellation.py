"""Cancelling a request whose client has gone: it leaves the scheduler's queue (or its batch), its front-end
thread and model slot are released at once, and the document loads it has not done yet are not done.

A front end binds a :class:`CancelScope` to the request (:func:`bind`, a context variable: it follows the
request into the threads that ``anyio.to_thread`` starts, and those started in a copy of its context) and calls
:meth:`CancelScope.cancel` when the client disconnects. The scheduled path registers the request's handle
with the scope (:func:`on_cancel`), and the scheduler reads the request's documents through
:class:`CancellableCache`, which stops between documents (after keeping what it encoded) and between
layers of a stream once the request is cancelled.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Iterator

from kvlink_rag.cache import DocumentCache
from kvlink_rag.types import DocumentKV, LayeredDocuments, RetainedKV
from service.errors import ServiceError

_scope: contextvars.ContextVar[CancelScope | None] = contextvars.ContextVar("kvlink_cancel_scope", default=None)


class RequestCancelled(ServiceError):
    """The client went away before the answer was ready (HTTP 499, nginx's "client closed request")."""

    def __init__(self, what: str = "the request"):
        super().__init__(499, "cancelled", f"{what} was cancelled: the client closed the connection")


class CancelScope:
    """Whether a request was cancelled, and what to call when it is (each callback once)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []
        self.cancelled = False

    def cancel(self) -> None:
        """Mark cancelled and run the callbacks registered so far (later ones run when registered)."""
        with self._lock:
            if self.cancelled:
                return
            self.cancelled = True
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            fn()

    def add(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` when the scope is cancelled (at once if it already is)."""
        with self._lock:
            if not self.cancelled:
                self._callbacks.append(fn)
                return
        fn()


def bind(scope: CancelScope | None) -> contextvars.Token:
    """Make ``scope`` the current request's (returns the token to reset it with)."""
    return _scope.set(scope)


def unbind(token: contextvars.Token) -> None:
    """Undo :func:`bind`."""
    _scope.reset(token)


def current() -> CancelScope | None:
    """The current request's scope, if a front end bound one."""
    return _scope.get()


def on_cancel(fn: Callable[[], None]) -> None:
    """Call ``fn`` when the current request is cancelled (nothing without a scope)."""
    scope = _scope.get()
    if scope is not None:
        scope.add(fn)


def check_cancelled(what: str = "the request") -> None:
    """Raise :class:`RequestCancelled` if the current request is cancelled."""
    scope = _scope.get()
    if scope is not None and scope.cancelled:
        raise RequestCancelled(what)


class CancellableCache(DocumentCache):
    """A request's cache view that stops once ``cancelled()`` is true: before resolving, after storing an
    encoded document (kept: other requests use it) and before each streamed layer (the prefetch reader then
    stops too).

    Args:
        inner: the request's cache (a ``RecordingCache``); other attributes are read from it.
        cancelled: whether the request was cancelled.
    Raises (from its methods): RequestCancelled.
    """

    def __init__(self, inner: DocumentCache, cancelled: Callable[[], bool]) -> None:
        self.inner, self._cancelled = inner, cancelled

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def _check(self) -> None:
        if self._cancelled():
            raise RequestCancelled("the request's document loads")

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
