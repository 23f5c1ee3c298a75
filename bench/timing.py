"""Repeated timings reported as median and spread (machines here are shared and noisy)."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Timing:
    """Seconds over ``n`` repeats: median, min and max."""

    median: float
    low: float
    high: float
    n: int

    def as_dict(self) -> dict:
        return {"median_s": self.median, "min_s": self.low, "max_s": self.high, "n": self.n}


def measure(fn: Callable[[], object], repeats: int = 3, warmup: int = 1) -> Timing:
    """Run ``fn`` ``warmup`` times untimed, then ``repeats`` times timed with ``perf_counter``."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return Timing(statistics.median(times), min(times), max(times), repeats)


def pct(xs: list[float], p: float) -> float:
    """The ``p`` quantile (0..1) of ``xs``, nearest rank."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p * (len(xs) - 1))))]


def run_clients(n_clients: int, jobs: list, run) -> tuple[list, float]:
    """Run ``run(job)`` for ``jobs`` from ``n_clients`` threads; ``(results, wall seconds)``."""
    out, lock = [], threading.Lock()

    def client(k: int) -> None:
        for job in jobs[k::n_clients]:
            r = run(job)
            with lock:
                out.append(r)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(n_clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out, time.perf_counter() - t0
