"""Admission policies: the order in which the scheduler admits waiting requests, as one declared interface.

The scheduler hands a policy what it knows of every waiting request before admitting any
(:class:`WaitingView`: its documents, mode, adapter, estimated prefill tokens, length bucket and wait)
and of the running ones; the policy returns the order it prefers. The scheduler then admits in that
order within its slot, token and adapter limits. :class:`BucketPolicy` is the scheduler's S/M/L rule;
:class:`CacheAwarePolicy` puts first the requests whose documents the running ones already hold (their
prefix-tree paths and stored caches are warm: SGLang's cache-aware scheduling, over document sets);
:class:`FifoPolicy` is arrival order (the baseline); ``fair`` (:mod:`kvlink_rag.runtime.fair_admission`) shares the
model across tenants by virtual token counters. A policy that also has a ``served(request, prompt_tokens,
output_tokens)`` method (:class:`ServedTokens`) is told what each request was served.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .gen_request import GenRequest


@dataclass(frozen=True)
class WaitingView:
    """One waiting request as a policy sees it.

    Attributes:
        request: the request (documents in prompt order, mode, adapter, text ids).
        tokens: estimated prefill tokens; bucket: ``short`` / ``medium`` / ``long``.
        waited_s: seconds in the queue; starved: waited past the scheduler's ``max_wait_s``.
    """

    request: GenRequest
    tokens: int
    bucket: str
    waited_s: float
    starved: bool

    @property
    def documents(self) -> frozenset:
        """The request's documents as ``(text, title)`` pairs."""
        return frozenset((d.text, d.title) for d in self.request.docs)


class AdmissionPolicy(Protocol):
    """Orders waiting requests for admission."""

    def order(self, waiting: list[WaitingView], running: list[GenRequest]) -> list[int]:
        """Indexes into ``waiting``, most preferred first (each once)."""


class ServedTokens(Protocol):
    """Optional for a policy: the scheduler reports each admission (``prompt_tokens``: the request's estimated
    prefill tokens, ``output_tokens`` 0) and each generated token (``prompt_tokens`` 0, ``output_tokens`` 1),
    from its own thread (the one that calls :meth:`AdmissionPolicy.order`)."""

    def served(self, request: GenRequest, prompt_tokens: int, output_tokens: int) -> None:
        """Charge ``request`` (its tenant) with what it was just served."""


class FifoPolicy:
    """Arrival order, nothing else (the baseline of the fairness benchmark)."""

    def order(self, waiting: list[WaitingView], running: list[GenRequest]) -> list[int]:
        return list(range(len(waiting)))


class BucketPolicy:
    """Starved requests first, then the oldest request's length bucket, then the rest; arrival order within
    each (so a step's prefills are of similar cost and nothing starves)."""

    def order(self, waiting: list[WaitingView], running: list[GenRequest]) -> list[int]:
        if not waiting:
            return []
        first = waiting[0].bucket
        rank = [0 if w.starved else 1 if w.bucket == first else 2 for w in waiting]
        return sorted(range(len(waiting)), key=lambda i: rank[i])


class CacheAwarePolicy:
    """Starved requests first; then the most documents in common with the running requests (and with the
    requests preferred so far), then the oldest."""

    def order(self, waiting: list[WaitingView], running: list[GenRequest]) -> list[int]:
        warm = {(d.text, d.title) for r in running for d in r.docs}
        order = [i for i, w in enumerate(waiting) if w.starved]
        rest = [i for i, w in enumerate(waiting) if not w.starved]
        while rest:
            best = max(rest, key=lambda i: (len(waiting[i].documents & warm), -i))
            order.append(best)
            rest.remove(best)
            warm |= waiting[best].documents
        return order
