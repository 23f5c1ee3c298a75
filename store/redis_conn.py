"""Redis clients from URLs: a standalone server (``redis://host:port/db``, ``rediss://``, ``unix://``) or a Redis
Cluster (``redis+cluster://host:port[,host:port...]``, redis-py's :class:`redis.cluster.RedisCluster`).

Query parameters that are ours, not redis-py's, are split off first (:func:`split_url`): ``prefix`` (key
prefix) and the blob store's ``chunk_bytes``, ``batch_bytes``, ``pending_ttl_s``. Clients get short socket
timeouts by default (a probe or a read must fail, not hang, when a node is gone); ``socket_timeout=`` and
``socket_connect_timeout=`` in the URL override them. redis-py is imported lazily.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
STANDALONE_SCHEMES = ("redis", "rediss", "unix")
OWN_OPTIONS = ("prefix", "chunk_bytes", "batch_bytes", "pending_ttl_s")
DEFAULT_TIMEOUTS = {"socket_timeout": 10.0, "socket_connect_timeout": 2.0}


def is_redis_url(url: str) -> bool:
    """Whether ``url`` names a standalone Redis or a Redis Cluster."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    return scheme in STANDALONE_SCHEMES + CLUSTER_SCHEMES


def split_url(url: str) -> tuple[str, dict[str, str]]:
    """``(url without our own parameters, {our parameter: value})`` (see :data:`OWN_OPTIONS`)."""
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    own = {k: query.pop(k)[0] for k in OWN_OPTIONS if k in query}
    rest = "&".join(f"{k}={v}" for k, vs in query.items() for v in vs)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, rest, parts.fragment)), own


def redact(url: str) -> str:
    """``url`` without a password (for messages and readiness checks)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def connect(url: str, decode_responses: bool = False, **kwargs: Any):
    """A client for ``url`` (our own query parameters must already be split off).

    Args:
        url: ``redis://...`` (also ``rediss://``, ``unix://``) or ``redis+cluster://host:port[,host:port]``
            (``rediss+cluster://`` for TLS); a cluster URL's hosts are its start-up nodes.
        kwargs: passed to redis-py (timeouts, ``retry=``, ...).
    Raises:
        ValueError: not a Redis URL, or a cluster URL without a host.
        ImportError: the ``redis`` package is not installed.
    """
    import redis

    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    opts = {**DEFAULT_TIMEOUTS, "decode_responses": decode_responses, **kwargs}
    if scheme in STANDALONE_SCHEMES:
        return redis.Redis.from_url(url, **opts)
    if scheme not in CLUSTER_SCHEMES:
        raise ValueError(f"not a Redis URL: {redact(url)!r}; use redis://host:port/db or redis+cluster://host:port")
    from redis.cluster import ClusterNode, RedisCluster

    parts = urlsplit(url)
    nodes = []
    for hostport in parts.netloc.rsplit("@", 1)[-1].split(","):
        host, _, port = hostport.rpartition(":") if ":" in hostport else (hostport, "", "6379")
        if host:
            nodes.append(ClusterNode(host.strip("[]"), int(port or 6379)))
    if not nodes:
        raise ValueError(f"cluster URL {redact(url)!r} names no host")
    if parts.password is not None:
        opts.setdefault("password", parts.password)
        opts.setdefault("username", parts.username or None)
    if scheme == "rediss+cluster":
        opts.setdefault("ssl", True)
    for k, v in parse_qs(parts.query).items():  # the URL's own options win, as redis.Redis.from_url does
        opts[k] = _number(v[0])
    if "retry" not in opts and "cluster_error_retry_attempts" not in opts:
        from redis.backoff import ExponentialBackoff
        from redis.retry import Retry

        opts["retry"] = Retry(ExponentialBackoff(cap=0.5, base=0.05), 2)  # a lost shard fails fast
    return RedisCluster(startup_nodes=nodes, **opts)


def tier_options(url: str, timeout_s: float) -> dict[str, Any]:
    """Client options of a shared cache tier at ``url``: a slow or gone server must cost about ``timeout_s``
    seconds per call, once (the tier's circuit breakers, :mod:`store.blobs.breakers`, then skip it).

    * ``socket_timeout`` and ``socket_connect_timeout``: ``timeout_s`` (seconds; per socket operation);
    * ``retry``: a standalone server retries a call once, on a connection error only (a pooled connection
      that a restarted server dropped), never on a timeout (redis-py's default retries 3 times with backoff up
      to 10 s: 40-50 s per call against a paused server); a cluster client does not retry (it reloads its
      slot map after a failure, which is the retry that helps);
    * ``health_check_interval``: a connection idle for 10 s is PINGed before its next command.

    Raises:
        ValueError: ``timeout_s`` not positive.
    """
    from redis.backoff import NoBackoff
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.retry import Retry

    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    retry = Retry(NoBackoff(), 0) if is_cluster_url(url) else Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,))
    return {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s, "retry": retry,
            "health_check_interval": 10}


def is_cluster_url(url: str) -> bool:
    """Whether ``url`` names a Redis Cluster (``redis+cluster://``, ``rediss+cluster://``)."""
    return url.split("://", 1)[0].lower() in CLUSTER_SCHEMES if "://" in url else False


def server_info(client, section: str) -> list[dict]:
    """``INFO section`` of every node (one dict per node of a cluster, a one-item list for one server)."""
    info = client.info(section)
    nested = info and all(isinstance(v, dict) for v in info.values())
    return list(info.values()) if nested else [info]


def _number(value: str) -> Any:
    """A URL parameter as int or float when it looks like one."""
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            continue
    return value
