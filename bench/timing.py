"""Repeated timings reported as median and spread (machines here are shared and noisy)."""

from __future__ import annotations

import statistics
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
