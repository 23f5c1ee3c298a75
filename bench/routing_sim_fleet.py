"""A fake replica for the model-free routing simulation (:mod:`bench.routing_sim`): the real host tier
(:class:`store.tiers.tier.CacheTier` with its :class:`~store.tiers.policies.LRUPolicy`) over stand-in document
KV that has only a size, its cache events numbered as :class:`service.cache_publisher.CachePublisher` numbers
them, and one FIFO prefill server whose time per request comes from a :class:`ServiceModel`.

The router's side of a replica is the real :class:`router.fleet.ReplicaState`: :meth:`SimReplica.deliver`
applies the events published up to a poll time, as the router's poll loop does.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from types import SimpleNamespace

import torch

from router.fleet import ReplicaState
from store.tiers.policies import LRUPolicy
from store.tiers.tier import CacheTier

KV_BYTES_PER_TOKEN = 30 * 2 * 3 * 64 * 2 + 8
"""Bytes a host tier charges per token of the default model (SmolLM2-135M): bf16 KV (layers x (K, V) x KV heads
x head dim x 2 bytes) and the int64 token id (:func:`store.tiers.tier.entry_nbytes`)."""


@dataclass(frozen=True)
class ServiceModel:
    """Modelled prefill time of one request on a replica, in milliseconds:
    ``fixed_ms + sum over its documents of tokens x (hit_us if in the host tier else miss_us) / 1000``.

    Attributes:
        name: row label; shared_tier: whether a miss is a fetch (the router's ``shared_tier`` setting).
        fixed_ms: per request whatever its documents (link tokens + question forward, first decode step).
        hit_us, miss_us: microseconds per document token served from the host tier / from wherever a miss goes.
    """

    name: str
    fixed_ms: float
    hit_us: float
    miss_us: float
    shared_tier: bool = True

    def prefill_ms(self, hit_tokens: int, miss_tokens: int) -> float:
        return self.fixed_ms + (hit_tokens * self.hit_us + miss_tokens * self.miss_us) / 1000.0


FETCH = ServiceModel("fetch from the shared tier", fixed_ms=300.0, hit_us=14.0, miss_us=38.0)
"""The issue's setup (every passage precomputed in the shared Redis tier; a host-tier miss is fetched and
decoded). From BENCHMARKS.md's CPU rows for the default model: link+question forward and first decode step of
a ~1.2k-token, 10-document context ~300 ms; host-tier load + RoPE ~14 us/token (59 ms at 4,111 tokens); the
shared tier adds ~24 us/token (121 ms against 22 ms of load at 4,156 tokens)."""

ENCODE = ServiceModel("encode on a miss", fixed_ms=300.0, hit_us=14.0, miss_us=1900.0, shared_tier=False)
"""No shared tier or local copy: a host-tier miss is encoded (precompute throughput 521 tokens/s on the same
CPU, BENCHMARKS.md), as for a replica that keeps document caches only in memory."""


class _FakeKV:
    """Stand-in document KV for :class:`CacheTier`: only what it reads (size, token count, device); the tier
    charges ``tokens x bytes_per_token`` (at least 9: the token id's 8 bytes and one of KV)."""

    def __init__(self, tokens: int, bytes_per_token: int):
        self.nbytes = tokens * (bytes_per_token - 8)
        self.token_ids = SimpleNamespace(numel=lambda: tokens, element_size=lambda: 8)
        self.keys = self.values = SimpleNamespace(device=torch.device("cpu"))


class _Outbox:
    """:class:`store.cache_events.CacheEvents` of one replica: events numbered per replica with one epoch and
    stamped with the simulated time they happen at (``now``, set by the replica)."""

    def __init__(self, epoch: str):
        self.epoch, self.seq, self.now = epoch, 1, 0.0
        self.events: deque[tuple[float, dict]] = deque([(0.0, {"epoch": epoch, "seq": "1", "op": "snapshot",
                                                                "data": "[]"})])

    def _push(self, event: dict) -> None:
        self.seq += 1
        self.events.append((self.now, {"epoch": self.epoch, "seq": str(self.seq), **event}))

    def stored(self, tier: str, key: str, tokens: int, nbytes: int) -> None:
        self._push({"op": "stored", "tier": tier, "key": key, "tokens": str(tokens)})

    def removed(self, tier: str, key: str) -> None:
        self._push({"op": "removed", "tier": tier, "key": key})


class SimReplica:
    """One replica: host tier, event outbox, FIFO prefill server, and the router's :class:`ReplicaState` of it.

    Args:
        name: its id (and URL in the router's fleet); host_bytes: its host tier's budget (bytes).
    """

    def __init__(self, name: str, host_bytes: int, bytes_per_token: int = KV_BYTES_PER_TOKEN):
        self.name, self.bytes_per_token = name, bytes_per_token
        self.outbox = _Outbox(f"sim-{name}")
        self.tier = CacheTier("host", host_bytes, policy=LRUPolicy(), clock=lambda: self.outbox.now,
                              events=self.outbox)
        self.state = ReplicaState(name, id=name, epoch=self.outbox.epoch)
        self.free_at = 0.0  # simulated seconds at which its server finishes what it was given

    def restart(self, now: float) -> None:
        """Restart at ``now`` (seconds): an empty host tier, a new epoch whose first event is an empty snapshot;
        the router resyncs (its holding of this replica emptied until the snapshot arrives)."""
        self.outbox = _Outbox(f"{self.outbox.epoch}+")
        self.outbox.events[0] = (now, self.outbox.events[0][1])
        self.outbox.now = now
        self.tier = CacheTier("host", self.tier.byte_budget, policy=LRUPolicy(), clock=lambda: self.outbox.now,
                              events=self.outbox)
        self.state.epoch, self.state.held, self.state.seq, self.state.synced = self.outbox.epoch, {}, 0, False

    def deliver(self, until: float) -> None:
        """Apply to the router's :attr:`state` the events published at or before ``until`` (seconds)."""
        box = self.outbox.events
        while box and box[0][0] <= until:
            if not self.state.apply(box.popleft()[1]):
                raise AssertionError(f"gap in {self.name}'s simulated events")

    def serve(self, docs: list[tuple[str, int]], arrival: float, model: ServiceModel) -> tuple[float, int, int]:
        """Serve a request of ``docs`` (``[(key, tokens)]``) arriving at ``arrival`` (seconds): each document
        is read from the host tier and, on a miss, put there (as the replica's query path does), when the
        server takes the request. Returns ``(time its first token is out (s), hit tokens, hit documents)``."""
        start = max(arrival, self.free_at)
        self.outbox.now = start
        hit_tokens = hit_docs = 0
        for key, tokens in docs:
            if self.tier.get(key, "default") is not None:
                hit_tokens, hit_docs = hit_tokens + tokens, hit_docs + 1
            else:
                self.tier.put(key, _FakeKV(tokens, self.bytes_per_token), "default")
        total = sum(t for _, t in docs)
        self.free_at = start + model.prefill_ms(hit_tokens, total - hit_tokens) / 1000.0
        return self.free_at, hit_tokens, hit_docs
