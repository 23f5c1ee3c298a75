"""The scheduler's limits: batch size, queue length, step token budget, buckets, adapters; and the error of a
full queue."""

from __future__ import annotations

from dataclasses import dataclass

BUCKETS = ("short", "medium", "long")


class QueueFull(RuntimeError):
    """The scheduler holds its maximum of waiting requests; retry after ``retry_after_s`` seconds."""

    def __init__(self, waiting: int, retry_after_s: float):
        super().__init__(f"{waiting} requests are waiting for the model (the limit); retry in {retry_after_s:.0f} s")
        self.retry_after_s = retry_after_s


@dataclass
class SchedulerLimits:
    """Scheduling limits (tokens, requests, seconds).

    Attributes:
        max_running: requests generating at once (the batch size).
        max_waiting: requests queued before new ones get :class:`QueueFull`.
        max_prefill_tokens: prefill tokens admitted into one step.
        max_wait_s: a request waiting longer is admitted first, whatever its bucket.
        bucket_bounds: prefill lengths (tokens) ending the short and medium buckets.
        max_adapters: distinct adapters among running requests (``KVLINK_RAG_MAX_LOADED_ADAPTERS``: one more
            would unload an adapter in use); a request for another waits until one is free.
        max_step_tokens: tokens one step computes (chunked prefill): every decode token, then prefill chunks,
            shortest remaining prefill first, in the room left (:func:`kvlink_rag.runtime.step_budget.allot`).
        long_prefill_budget: token-equivalents a long prefill computes a step (tokens weighted by the attention
            over the keys before them, :func:`~kvlink_rag.runtime.step_budget.key_weight`); 0: no cap. Off by
            default: a long prompt's forward yields between its layers (:mod:`~kvlink_rag.runtime.interjection`),
            so its step's length no longer delays anyone, and the cap's extra steps cost the long prompt ~28%.
    """

    max_running: int = 16
    max_waiting: int = 256
    max_prefill_tokens: int = 2048
    max_wait_s: float = 2.0
    bucket_bounds: tuple[int, int] = (64, 256)
    max_adapters: int = 4
    max_step_tokens: int = 256
    long_prefill_budget: int = 0

    def bucket(self, tokens: int) -> str:
        """``short`` / ``medium`` / ``long`` for a prefill of ``tokens``."""
        return BUCKETS[0] if tokens < self.bucket_bounds[0] else BUCKETS[1] if tokens < self.bucket_bounds[1] else BUCKETS[2]
