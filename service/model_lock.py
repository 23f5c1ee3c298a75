"""The model lock: a first-come, first-served mutex shared by every user of the one model.

The batching scheduler takes it for each step, embedded precompute for each chunk of a document, query
bookkeeping for a moment. A plain ``threading.Lock`` is not fair: the scheduler, releasing and taking it
again between steps, would keep a waiting precompute (or a query's bookkeeping) out for as long as
requests keep coming. Tickets served in order (a ticket lock; Mellor-Crummey and Scott, 1991) make every
waiter run at the next step boundary.
"""

from __future__ import annotations

import threading


class FairLock:
    """A FIFO mutex with the ``threading.Lock`` interface used here (``with``, ``acquire``, ``release``,
    ``locked``). Not reentrant.

    Raises:
        ValueError: ``acquire`` with a timeout (not supported).
        RuntimeError: ``release`` of an unlocked lock.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._next = 0  # next ticket to hand out
        self._serving = 0  # ticket allowed to hold the lock

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Wait for this caller's turn (``blocking``), or take the lock only if it is free now."""
        if timeout != -1:
            raise ValueError("FairLock.acquire does not take a timeout")
        with self._cond:
            if not blocking and self._serving != self._next:
                return False
            ticket = self._next
            self._next += 1
            while ticket != self._serving:
                self._cond.wait()
            return True

    def release(self) -> None:
        """Hand the lock to the next ticket."""
        with self._cond:
            if self._serving == self._next:
                raise RuntimeError("release of an unlocked FairLock")
            self._serving += 1
            self._cond.notify_all()

    def locked(self) -> bool:
        """Whether a caller holds the lock."""
        with self._cond:
            return self._serving != self._next

    def __enter__(self) -> FairLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
