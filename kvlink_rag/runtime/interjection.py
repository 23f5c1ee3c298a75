"""What runs between the decoder layers of a long prompt's forward: the scheduler's layer-level preemption.

A step that computes a chunk of a long prompt (more tokens than a step's budget: a full-mode request, a long
question or chat history) is the slowest step there is (~140 ms at 3k keys on the 2-core development CPU, against
~50 ms for a cached query's whole prefill). The model runner calls back between its layers
(:meth:`~kvlink_rag.runtime.model_runner.ModelRunner.forward`'s ``between_layers``); there the scheduler runs, in
forwards of their own over other sequences:

- **new short requests** (at most a step's budget of prefill tokens), at once: a query sent while a long prompt is
  prefilled waits for one layer of that step instead of the rest of it;
- **decode steps of the requests already generating** (not in the paused forward), once the paused forward has run
  for as long as the interjected work before it took: the long prompt and the others share the time half and half,
  so their tokens keep coming while it runs (each would otherwise wait for a whole step of it).

The paused forward's rows are untouched: their KV is written layer by layer into their own blocks and committed
when the forward ends; interjections are not nested. Iteration-level preemption is what vLLM and Sarathi-Serve do
between steps; this is the same at the granularity of one decoder layer.
"""

from __future__ import annotations

import time
from collections.abc import Iterable


class LayerSlices:
    """The state of the forward in flight that yields between its layers (see module docstring).

    Attributes:
        active: an interjection is running (no nesting).
    """

    def __init__(self) -> None:
        self.active = False
        self._paused: frozenset[int] = frozenset()
        self._resumed = 0.0  # perf_counter when the paused forward last resumed
        self._owed = 0.0  # seconds the paused forward runs before the others' decode steps are due

    def pause(self, members: Iterable[object], owed_s: float) -> None:
        """A forward over ``members`` (running requests) starts and may yield; the decode steps of the others are
        due once it has run ``owed_s`` seconds (what this step spent on them before it)."""
        self._paused = frozenset(id(rr) for rr in members)
        self._resumed, self._owed = time.perf_counter(), owed_s

    def clear(self) -> None:
        """The yielding forward ended."""
        self._paused, self._owed = frozenset(), 0.0

    def decode_due(self, running: list[tuple[object, object]]) -> list[tuple[object, object]]:
        """``(handle, request)`` of the running requests outside the paused forward with one token to feed (decoding),
        when their turn has come; else []."""
        if time.perf_counter() - self._resumed < self._owed:
            return []
        return [(h, rr) for h, rr in running if id(rr) not in self._paused and rr.pending_left == 1]

    def ran(self, seconds: float) -> None:
        """An interjection took ``seconds``: the paused forward resumes and runs that long before the next is due."""
        self._resumed, self._owed = time.perf_counter(), seconds
