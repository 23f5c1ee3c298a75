"""Fair admission across tenants: virtual token counters (VTC), with length buckets and cache locality.

Each tenant has a counter of the tokens it has been served: ``prompt_weight`` per prefill token when one of
its requests is admitted (the scheduler's estimate, :meth:`GenRequest.estimated_new_tokens`: tokens the
prefill computes, documents served from their caches not counted) and ``output_weight`` per generated token
(Sheng et al., "Fairness in Serving Large Language Models", OSDI 2024: weights 1 and 2). The next request
admitted is one of the tenant with the smallest counter among those waiting, so a tenant sending only long
requests is charged a long request's tokens at once and another tenant's short ones go first until it has
been served as much. A tenant that starts sending (none of its requests waiting a moment ago) has its counter
lifted to the smallest of the waiting tenants' (or, with none waiting, to the last one's to leave the queue):
idle time is no credit to spend later in a burst.

Within a tenant: its starved requests first (waited past ``max_wait_s``), then those in the bucket of this
step's first pick (a step's prefills of similar cost, as :class:`~kvlink_rag.runtime.admission.BucketPolicy`), then the
most documents in common with the running requests and recently admitted ones (their prefix-tree paths and
caches are warm, as :class:`~kvlink_rag.runtime.admission.CacheAwarePolicy`), then arrival. Across tenants a request
whose documents are all warm gets ``locality_bonus`` tokens off its tenant's counter (a fraction of it for
some of them): among tenants served about alike the warm one goes first; the unfairness it allows is bounded
by the bonus. Equal counters: the earliest arrival.
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # .admission registers this policy by name
    from .admission import WaitingView
    from .gen_request import GenRequest


class FairPolicy:
    """VTC admission (see the module docstring); the scheduler reports served tokens through :meth:`served`.

    Args:
        prompt_weight, output_weight: counter increment per prefill token admitted and per token generated.
        locality_bonus: tokens taken off a tenant's counter, in the comparison across tenants, for a request
            whose documents are all warm (proportionally for some).
        memory: documents of recently admitted requests remembered as warm (beside the running ones).
        depth: requests ordered this way per call (a step admits at most its free slots); the rest follow in
            arrival order (each pick scans the waiting requests: the order costs depth x waiting).
    """

    def __init__(self, prompt_weight: float = 1.0, output_weight: float = 2.0, locality_bonus: float = 128.0,
                 memory: int = 256, depth: int = 64):
        self.prompt_weight, self.output_weight = prompt_weight, output_weight
        self.locality_bonus, self.memory, self.depth = locality_bonus, memory, depth
        self.counters: dict[str, float] = {}
        self._queued: dict[int, GenRequest] = {}  # id -> request of those waiting at the last order() (kept alive)
        self._last_left = 0.0
        self._recent: OrderedDict = OrderedDict()  # (text, title) of recently admitted requests' documents

    # -- what the scheduler calls -----------------------------------------------------------------
    def order(self, waiting: list[WaitingView], running: list[GenRequest]) -> list[int]:
        """Indexes into ``waiting``: the smallest (simulated) counter's tenant's best request, repeatedly."""
        self._lift(waiting)
        warm = {(d.text, d.title) for r in running for d in r.docs} | set(self._recent)
        by_tenant: dict[str, list[int]] = defaultdict(list)
        for i, w in enumerate(waiting):
            by_tenant[w.request.tenant].append(i)
        counter = {t: self.counters.get(t, 0.0) for t in by_tenant}
        order: list[int] = []
        anchor = None
        while by_tenant and len(order) < self.depth:
            picks = {t: self._best(idxs, waiting, warm, anchor) for t, idxs in by_tenant.items()}
            tenant = min(picks, key=lambda t: (counter[t] - self._bonus(waiting[picks[t]], warm), picks[t]))
            i = picks[tenant]
            order.append(i)
            by_tenant[tenant].remove(i)
            if not by_tenant[tenant]:
                del by_tenant[tenant]
            counter[tenant] += self.prompt_weight * waiting[i].tokens
            warm |= waiting[i].documents
            anchor = anchor or waiting[i].bucket
        picked = set(order)
        return order + [i for i in range(len(waiting)) if i not in picked]

    def served(self, request: GenRequest, prompt_tokens: int, output_tokens: int) -> None:
        """Charge ``request``'s tenant: at admission (``prompt_tokens``: its estimated prefill) and per
        generated token (``output_tokens``)."""
        t = request.tenant
        self.counters[t] = (self.counters.get(t, 0.0) + self.prompt_weight * prompt_tokens
                            + self.output_weight * output_tokens)
        if prompt_tokens:
            for d in request.docs:
                self._recent[(d.text, d.title)] = None
                self._recent.move_to_end((d.text, d.title))
            while len(self._recent) > self.memory:
                self._recent.popitem(last=False)

    # -- helpers -----------------------------------------------------------------------------------
    def _lift(self, waiting: list[WaitingView]) -> None:
        """Lift the counter of each tenant that has just started waiting to the waiting tenants' minimum."""
        now = {id(w.request): w.request for w in waiting}
        stayed = {r.tenant for k, r in self._queued.items() if k in now}
        left = {r.tenant for r in self._queued.values()} - stayed  # left the queue since the last call
        if left:
            self._last_left = max(self.counters.get(t, 0.0) for t in left)
        for w in waiting:
            t = w.request.tenant
            if id(w.request) in self._queued or t in stayed:
                continue
            floor = min(self.counters.get(s, 0.0) for s in stayed) if stayed else self._last_left
            self.counters[t] = max(self.counters.get(t, 0.0), floor)
            stayed.add(t)
        self._queued = now

    def _best(self, idxs: list[int], waiting: list[WaitingView], warm: set, anchor: str | None) -> int:
        """The tenant's request to admit next: starved, then the anchor bucket, then locality, then arrival."""
        return min(idxs, key=lambda i: (not waiting[i].starved, anchor is not None and waiting[i].bucket != anchor,
                                        -len(waiting[i].documents & warm), i))

    def _bonus(self, w: WaitingView, warm: set) -> float:
        docs = w.documents
        return self.locality_bonus * len(docs & warm) / len(docs) if docs else 0.0
