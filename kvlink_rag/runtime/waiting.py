"""The scheduler's waiting queue: requests submitted and not yet admitted, and which of them a step admits.

A step takes the waiting requests in the admission policy's order (:mod:`kvlink_rag.runtime.admission`; by
default starved ones first, then the oldest request's bucket, then the others) within the step's slot, prefill
token and adapter budgets (:class:`~kvlink_rag.runtime.limits.SchedulerLimits`). Of requests over the same
documents only the first is admitted in a step (SGLang's in-batch prefix sharing): the others take that prefill
from the prefix tree a step later instead of repeating it.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

from .admission import AdmissionPolicy, WaitingView
from .gen_request import RequestHandle
from .limits import QueueFull, SchedulerLimits

_COMPUTED_SETS = 4096  # document sets remembered as admitted (a bounded memory of recent ones)


@dataclass
class Waiting:
    """A submitted request: its handle, when it was queued (``perf_counter``), estimated prefill tokens, bucket."""

    handle: RequestHandle
    since: float
    tokens: int
    bucket: str


class WaitingQueue:
    """Waiting requests in arrival order; not thread-safe (the scheduler calls it under its condition).

    Args:
        limits: the queue's length and a step's budgets.
        policy: the admission order.
    Attributes:
        items: the waiting requests, oldest first.
    """

    def __init__(self, limits: SchedulerLimits, policy: AdmissionPolicy) -> None:
        self.limits, self.policy = limits, policy
        self.items: list[Waiting] = []
        self._computed: OrderedDict = OrderedDict()  # document sets admitted in earlier steps

    def __len__(self) -> int:
        return len(self.items)

    def add(self, handle: RequestHandle, tokens: int) -> None:
        """Queue ``handle`` with ``tokens`` estimated prefill tokens.

        Raises:
            QueueFull: ``max_waiting`` requests are already waiting.
        """
        if len(self.items) >= self.limits.max_waiting:
            raise QueueFull(len(self.items), max(1.0, self.limits.max_wait_s))
        self.items.append(Waiting(handle, time.perf_counter(), tokens, self.limits.bucket(tokens)))

    def queued_tokens(self) -> int:
        """Estimated prefill tokens of every waiting request."""
        return sum(w.tokens for w in self.items)

    def choose(self, running: list[tuple[RequestHandle, object]], max_tokens: int | None = None) -> list[Waiting]:
        """Take the requests to admit now beside ``running`` (``(handle, running request)``): cancelled ones
        dropped, then in the policy's order within the step's slot, token and adapter budget, one request per
        document set not yet computed (unless it is starved). ``max_tokens``: only requests of at most that many
        estimated prefill tokens (the short ones a long prompt's step lets in between its layers)."""
        self.items = [w for w in self.items if not w.handle.cancelled]
        slots = self.limits.max_running - len(running)
        if slots <= 0 or not self.items:
            return []
        now = time.perf_counter()
        views = [WaitingView(w.handle.request, w.tokens, w.bucket, now - w.since, now - w.since > self.limits.max_wait_s)
                 for w in self.items]
        order = [self.items[i] for i in self.policy.order(views, [h.request for h, _ in running])]
        chosen, tokens, prefixes = [], 0, set()
        adapters = {h.request.adapter for h, _ in running}
        for w in order:
            if max_tokens is not None and w.tokens > max_tokens:
                continue
            if len(chosen) == slots or (chosen and tokens + w.tokens > self.limits.max_prefill_tokens):
                break
            if w.handle.request.adapter not in adapters and len(adapters) >= self.limits.max_adapters:
                continue  # its adapter would unload one that running requests use
            key = w.handle.request.shared_prefix_key()
            if key in prefixes and key not in self._computed and now - w.since <= self.limits.max_wait_s:
                continue  # next step it finds this step's prefill of the same documents in the prefix tree
            prefixes.add(key)
            adapters.add(w.handle.request.adapter)
            chosen.append(w)
            tokens += w.tokens
        picked = {id(w) for w in chosen}
        self.items = [w for w in self.items if id(w) not in picked]
        self._remember(prefixes - {None})
        return chosen

    def _remember(self, keys: set) -> None:
        """``keys`` are computed from now on (the oldest forgotten past :data:`_COMPUTED_SETS`)."""
        for key in keys:
            self._computed[key] = None
            self._computed.move_to_end(key)
            if len(self._computed) > _COMPUTED_SETS:
                self._computed.popitem(last=False)

    def put_back(self, items: list[Waiting]) -> None:
        """Return ``items`` (chosen, not admitted) to the front of the queue, the cancelled ones dropped."""
        self.items[:0] = [w for w in items if not w.handle.cancelled]

    def drain(self) -> list[Waiting]:
        """Empty the queue; what was in it."""
        items, self.items = self.items, []
        return items
