"""Which breaker of :mod:`store.tiers.health` a Redis call belongs to, how a target is probed, and the shared
tier's readiness: one target for a standalone server, one per primary of a Redis Cluster (a key's target is
the node serving its hash slot, found from the client's slot map without a network call), and
:data:`CLUSTER` for failures no node can be blamed for (the client cannot reach any start-up node, or a slot
is not covered)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from store.blobs.blob_store import BlobStoreUnavailable
from store.tiers.health import TierHealth

SERVER = "server"
CLUSTER = "cluster"


def outage_errors() -> tuple[type[BaseException], ...]:
    """redis-py errors that mean a target is unreachable or not serving (not a refused command)."""
    import redis
    from redis.exceptions import ClusterDownError, SlotNotCoveredError

    return (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, ClusterDownError, SlotNotCoveredError)


def guarded(keyed: bool = True):
    """Guard a method of :class:`store.blobs.redis.RedisBlobStore` by its target's circuit breaker (``keyed``:
    the target serving the cache key, its first argument; else the whole tier); redis-py's errors are re-raised
    as :class:`BlobStoreUnavailable` naming the store, and an outage error opens the target's breaker."""
    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(self, *args, **kwargs):
            target = None
            try:
                target = self.targets.of_key(self.layout.key(args[0], "meta") if keyed else None)
                self.health.guard(target)
                return fn(self, *args, **kwargs)
            except self.redis_errors as e:
                self._outage(target, e)
                raise BlobStoreUnavailable(f"shared cache tier {self.name} unreachable: {type(e).__name__}: {e}") from e
        return wrapper
    return decorate


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
