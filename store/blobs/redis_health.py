"""A shared tier's Redis client and its circuit breakers (:class:`TierClient`): which breaker of
:mod:`store.blobs.breakers` a Redis call belongs to, how a target is probed, and the shared tier's readiness: one target for a standalone server, one per primary of a Redis Cluster (a key's target is
the node serving its hash slot, found from the client's slot map without a network call), and
:data:`CLUSTER` for failures no node can be blamed for (the client cannot reach any start-up node, or a slot
is not covered)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

from store.blobs.blob_store import BlobStoreUnavailable
from store.blobs.breakers import TierHealth

SERVER = "server"
CLUSTER = "cluster"


def outage_errors() -> tuple[type[BaseException], ...]:
    """redis-py errors that mean a target is unreachable or not serving (not a refused command)."""
    import redis
    from redis.exceptions import ClusterDownError, SlotNotCoveredError

    return (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, ClusterDownError, SlotNotCoveredError)


def guarded(keyed: bool = True):
    """Guard a method of :class:`store.blobs.redis.RedisBlobStore` (its ``client`` a :class:`TierClient`) by its
    target's circuit breaker (``keyed``: the target serving the cache key, its first argument; else the whole
    tier); redis-py's errors are re-raised as :class:`BlobStoreUnavailable` naming the store, and an outage
    error opens the target's breaker."""
    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(self, *args, **kwargs):
            client, target = self.client, None
            try:
                target = client.targets.of_key(self.layout.key(args[0], "meta") if keyed else None)
                client.health.guard(target)
                return fn(self, *args, **kwargs)
            except client.errors as e:
                client.outage(target, e)
                raise BlobStoreUnavailable(f"shared cache tier {client.name} unreachable: {type(e).__name__}: {e}") from e
        return wrapper
    return decorate


class TierClient:
    """A shared tier's Redis client, made on first use, with one circuit breaker per target.

    Args:
        make_client: makes the ``redis.Redis`` or ``redis.cluster.RedisCluster`` on first use (a cluster client
            connects when it is made: an unreachable cluster must not stop the service from starting, only
            fail its readiness check).
        name: how messages name the tier (its URL without password).
        cluster: whether ``make_client`` makes a cluster client (one breaker per primary, else one).
        probe_interval_s: seconds between background probes of a target whose breaker is open.
    Attributes:
        errors: redis-py's error types (what :func:`guarded` turns into :class:`BlobStoreUnavailable`).
        targets: which target a key belongs to (:class:`RedisTargets`). health: the breakers (:class:`TierHealth`).
    """

    def __init__(self, make_client: Callable[[], Any], name: str, cluster: bool, probe_interval_s: float) -> None:
        import redis
        from redis.cluster import RedisClusterException

        self._make, self._client, self.name = make_client, None, name
        self.errors = (redis.exceptions.RedisError, RedisClusterException)
        self._outage_errors = outage_errors()
        self.targets = RedisTargets(lambda: self.r, self.reset, cluster)
        self.health = TierHealth(name, self.targets.probe, probe_interval_s, whole=CLUSTER if cluster else SERVER)

    @property
    def r(self):
        """The client, made on first use."""
        if self._client is None:
            self._client = self._make()
        return self._client

    def reset(self) -> None:
        """Make the client again on next use (a cluster client that could reach no node keeps failing)."""
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(*self.errors):
                client.close()

    def outage(self, target: str | None, err: BaseException) -> None:
        """Open ``target``'s breaker (the whole tier's when unknown) if ``err`` says it is unreachable."""
        if isinstance(err, self._outage_errors):
            self.health.failed(target or self.health.whole, err)
        elif self._client is None:  # the client could not even be made (no start-up node answered)
            self.health.failed(self.health.whole, err)

    def guarded_stream(self, it: Iterator, redis_key: str) -> Iterator:
        """``it``, whose redis-py errors mid-way are raised as :class:`BlobStoreUnavailable` (an outage error
        opens the breaker of ``redis_key``'s target)."""
        try:
            yield from it
        except self.errors as e:
            self.outage(self.targets.of_key(redis_key), e)
            raise BlobStoreUnavailable(f"shared cache tier {self.name} failed mid-read: {e}") from e

    def ping(self) -> None:
        """:func:`ping_tier` of this client's targets. Raises BlobStoreUnavailable."""
        ping_tier(self.health, self.targets, self.errors)

    def close(self) -> None:
        """Stop the breakers' prober and close the client's connections (if one was made)."""
        self.health.close()
        if self._client is not None:
            with contextlib.suppress(*self.errors):
                self._client.close()


class RedisTargets:
    """The targets of one Redis client.

    Args:
        client: returns the (lazily made) ``redis.Redis`` or ``redis.cluster.RedisCluster``.
        reset: drops the client so that the next use makes it again (after it failed to connect).
        cluster: whether the client is a cluster client.
    """

    def __init__(self, client: Callable[[], Any], reset: Callable[[], None], cluster: bool) -> None:
        self.client, self.reset, self.cluster = client, reset, cluster

    def of_key(self, redis_key: str | None) -> str:
        """The target serving ``redis_key`` (None: the whole tier). Raises redis errors when the cluster client
        cannot be made."""
        if not self.cluster:
            return SERVER
        if redis_key is None:
            return CLUSTER
        from redis.exceptions import RedisClusterException

        try:
            return self.client().get_node_from_key(redis_key).name
        except (RedisClusterException, AttributeError):  # slot not covered (yet): nobody to blame
            return CLUSTER

    def nodes(self) -> list[str]:
        """Names (``host:port``) of the primaries, or ``[SERVER]``."""
        return [n.name for n in self.client().get_primaries()] if self.cluster else [SERVER]

    def probe(self, target: str) -> None:
        """PING ``target`` (bounded by the client's socket timeouts); raises when it does not answer."""
        if not self.cluster:
            self.client().ping()
            return
        if target == CLUSTER:
            try:
                self.client().ping(target_nodes=self.client().RANDOM)
            except Exception:
                self.reset()
                raise
            return
        r = self.client()
        node = r.get_node(node_name=target)
        if node is None:
            raise LookupError(f"{target} is no longer a node of the cluster")
        (node.redis_connection or r.get_redis_connection(node)).ping()


def ping_tier(health: TierHealth, targets: RedisTargets, errors: tuple[type[BaseException], ...]) -> None:
    """Readiness of the tier: every target not open is pinged (a failure opens it), then every open target is
    named.

    Raises:
        BlobStoreUnavailable: a target is unreachable (the message names each, with its breaker state).
    """
    try:
        names = [CLUSTER] if health.is_open(CLUSTER) else targets.nodes()
    except errors as e:
        health.failed(CLUSTER, e)
        names = [CLUSTER]
    for name in names:
        if not health.is_open(name):
            health.probe_now(name)
    problem = health.describe(names)
    if problem:
        raise BlobStoreUnavailable(f"{health.name}: {problem}")
