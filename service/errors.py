"""The errors the service raises for bad input, an unservable request or an unreachable task queue, and which
exceptions mean Redis is down.

:class:`ServiceError` carries an HTTP-like status (the API answers with it; the CLI prints the message),
a stable machine code and a human message.
"""

from __future__ import annotations


class QueueUnavailable(RuntimeError):
    """The task queue (the Redis broker) cannot be reached."""


class ServiceError(Exception):
    """An error with an HTTP-like status (4xx: the caller's fault; 503: a dependency is down), a stable
    machine ``code`` and a human ``message``; ``retry_after_s`` (seconds) when retrying later can succeed
    (the API sends it as ``Retry-After``)."""

    def __init__(self, status: int, code: str, message: str, retry_after_s: float | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.retry_after_s = status, code, message, retry_after_s


def redis_errors() -> tuple[type[BaseException], ...]:
    """Exception types that mean "Redis (index, broker or shared cache tier) is unreachable"."""
    import redis

    from store.blobs.blob_store import BlobStoreUnavailable

    return (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, QueueUnavailable, BlobStoreUnavailable)
