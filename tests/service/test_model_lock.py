"""The model lock serves waiters in arrival order, so a thread that keeps re-taking it cannot starve others."""

from __future__ import annotations

import threading
import time

import pytest

from service.model_lock import FairLock


def test_waiters_get_the_lock_in_arrival_order_even_against_a_greedy_holder():
    lock, order, stop = FairLock(), [], threading.Event()

    def greedy():  # like the scheduler: release and take it again at once, step after step
        while not stop.is_set():
            with lock:
                time.sleep(0.001)
                order.append("step")

    t = threading.Thread(target=greedy)
    t.start()
    time.sleep(0.01)
    with lock:
        order.append("precompute chunk")
    stop.set()
    t.join()
    assert "precompute chunk" in order


def test_non_blocking_acquire_and_misuse():
    lock = FairLock()
    assert lock.acquire(blocking=False) and lock.locked()
    assert not lock.acquire(blocking=False)
    lock.release()
    assert not lock.locked()
    with pytest.raises(RuntimeError):
        lock.release()
    with pytest.raises(ValueError):
        lock.acquire(timeout=1)
