"""Where request work waits: on the event loop, never in a parked thread.

There is one model. While it is busy, queries waiting for it must not hold the worker threads that
other endpoints (documents, health, metrics) need, so blocking work runs in worker threads under a
dedicated ``anyio.CapacityLimiter`` per kind of work, and a request waits for a token of its limiter
asynchronously, before any thread is taken:

* ``model``: running a query (JSON answer or stream); 1 token without the batching scheduler (only the
  query holding it has a thread), else as many as the scheduler holds (their threads wait for tokens).
* ``planning``: validation and document choice (text store reads, the Redis index, BM25).
* ``probes``: readiness checks and metrics collection; each probe also has a deadline.

Document routes stay synchronous and use Starlette's default thread pool, which queries no longer fill.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

import anyio
import anyio.to_thread

T = TypeVar("T")

PLANNING_THREADS = 8
PROBE_THREADS = 4


class ProbeTimeout(TimeoutError):
    """A probe did not finish within its deadline (its thread is abandoned, not killed)."""


class Gates:
    """The capacity limiters of one app. Created outside an event loop, each binds to the app's loop
    on first use.

    Args:
        planning: threads planning queries at once.
        model: queries running at once (1 without the batching scheduler; with it, what the scheduler can
            hold: :mod:`kvlink_rag.runtime.scheduler` batches them and refuses the rest).
        probes: threads running readiness checks or metrics collection at once.
    """

    def __init__(self, planning: int = PLANNING_THREADS, probes: int = PROBE_THREADS, model: int = 1):
        self.model = anyio.CapacityLimiter(model)
        self.planning = anyio.CapacityLimiter(planning)
        self.probes = anyio.CapacityLimiter(probes)

    async def run_model(self, fn: Callable[..., T], *args) -> T:
        """``fn(*args)`` in a thread once the model token is free (waiting on the event loop)."""
        return await anyio.to_thread.run_sync(fn, *args, limiter=self.model)

    async def run_planning(self, fn: Callable[..., T], *args) -> T:
        """``fn(*args)`` in a thread under the planning limiter."""
        return await anyio.to_thread.run_sync(fn, *args, limiter=self.planning)

    @asynccontextmanager
    async def model_slot(self) -> AsyncIterator[None]:
        """Hold the model token for a block (a stream, whose generator runs in its own thread).

        The token is held on behalf of a private object, so the block may end in another task than the
        one that started it (a stream closed by the server after the client left).
        """
        owner = object()
        await self.model.acquire_on_behalf_of(owner)
        try:
            yield
        finally:
            self.model.release_on_behalf_of(owner)

    async def probe(self, fn: Callable[..., T], *args, timeout: float) -> T:
        """``fn(*args)`` in a thread under the probe limiter, waiting at most ``timeout`` seconds in all.

        Raises:
            ProbeTimeout: no result within ``timeout`` (the thread is left to finish on its own).
        """
        with anyio.move_on_after(timeout):
            return await anyio.to_thread.run_sync(fn, *args, limiter=self.probes, abandon_on_cancel=True)
        raise ProbeTimeout(f"no answer within {timeout:g} s")
