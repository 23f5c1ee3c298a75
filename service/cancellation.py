"""Cancelling a request whose client has gone: it leaves the scheduler's queue (or its batch), its front-end
thread and model slot are released at once, and the document loads it has not done yet are not done.

A front end binds a :class:`CancelScope` to the request (:func:`bind`, a context variable: it follows the
request into the threads that ``anyio.to_thread`` starts, and those started in a copy of its context) and calls
:meth:`CancelScope.cancel` when the client disconnects. The scheduled path registers the request's handle
with the scope (:func:`on_cancel`), and the scheduler reads the request's documents through
:class:`~kvlink_rag.runtime.cancel.CancellableCache`, which stops between documents (after keeping what it encoded) and between
layers of a stream once the request is cancelled.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable

from kvlink_rag.runtime.cancel import Cancelled
from service.errors import ServiceError

_scope: contextvars.ContextVar[CancelScope | None] = contextvars.ContextVar("kvlink_cancel_scope", default=None)


class RequestCancelled(ServiceError, Cancelled):
    """The client went away before the answer was ready (HTTP 499, nginx's "client closed request"); the
    service's form of the engine's :class:`~kvlink_rag.runtime.cancel.Cancelled`."""

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
