"""Run a blocking generator in its own thread and consume it asynchronously (for server-sent events).

The generator runs entirely in one thread (so locks it takes are released by that thread), items are
handed to the event loop as they come, and when the consumer stops early (client disconnected) the
generator is closed before its next item. The thread runs in a copy of the consumer's context (the request's
:class:`~service.cancellation.CancelScope`), and a consumer that stops early cancels that scope, which wakes a
thread still waiting for its first item (a query waiting for the scheduler) at once. The consumer returns
only once that thread has ended, so a capacity token held around the iteration
(``api.concurrency.Gates.model_slot``) covers the whole run.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import AsyncIterator, Callable, Generator

import anyio

from service.cancellation import current as current_scope

_END = object()


class _Raised:
    def __init__(self, exc: BaseException):
        self.exc = exc


async def iterate_in_thread(make: Callable[[], Generator]) -> AsyncIterator:
    """Yield the items of the generator ``make()`` (called in a new thread; closed when the consumer stops
    or it ends); its exceptions are re-raised here."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    stop = threading.Event()
    ended = asyncio.Event()

    def emit(item) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # the loop is gone
            stop.set()

    def run() -> None:
        gen = None
        try:
            gen = make()
            for item in gen:
                if stop.is_set():
                    break
                emit(item)
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            emit(_Raised(e))
        finally:
            try:
                if gen is not None:
                    gen.close()
            finally:
                emit(_END)
                try:
                    loop.call_soon_threadsafe(ended.set)
                except RuntimeError:  # the loop is gone
                    pass

    threading.Thread(target=contextvars.copy_context().run, args=(run,), name="stream", daemon=True).start()
    finished = False
    try:
        while True:
            item = await queue.get()
            if item is _END:
                finished = True
                return
            if isinstance(item, _Raised):
                finished = True
                raise item.exc
            yield item
    finally:
        stop.set()
        scope = current_scope()
        if not finished and scope is not None:
            scope.cancel()  # the client left: the request stops waiting for the model
        with anyio.CancelScope(shield=True):  # the thread stops before its next item (and releases its locks)
            await ended.wait()


async def started(items: AsyncIterator) -> AsyncIterator:
    """``items`` once its first item is there: what fails before it (a full queue, a prompt too long for the
    context) raises here, while the caller can still answer with an HTTP status, not inside a started
    stream. The iterator returned yields that first item, then the rest; closing it closes ``items``."""
    try:
        first = await items.__anext__()
    except StopAsyncIteration:
        first = _END
    except BaseException:
        await items.aclose()
        raise

    async def rest() -> AsyncIterator:
        try:
            if first is not _END:
                yield first
            async for item in items:
                yield item
        finally:
            await items.aclose()

    return rest()


async def query_stream(state, plan) -> AsyncIterator:
    """``("token", piece)`` ... ``("done", QueryResult)`` of ``state.queries.stream(plan)``, run in its own
    thread once the model is free (``state.gates.model_slot``); its failures raise here."""
    async with state.gates.model_slot():
        async for item in iterate_in_thread(lambda: state.queries.stream(plan)):
            yield item
