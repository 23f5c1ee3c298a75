"""The Celery configuration: Redis broker and result backend from :class:`Settings`, and the task's name.

This module imports neither torch nor the task code, so the web process can build an app and enqueue
tasks by name (``app.send_task("kvlink.precompute", ...)``, :class:`service.queues.CeleryQueue`); the
worker's app (``workers.celery_app``) is built here too, with the task module in ``include``.
"""

from __future__ import annotations

from celery import Celery

from service.settings import Settings

PRECOMPUTE_TASK = "kvlink.precompute"


def transport_options(settings: Settings) -> dict:
    """Redis transport options: the visibility timeout (seconds before an unacknowledged task of a dead
    worker is redelivered) and how often workers sweep for such tasks (at most every 10 s)."""
    vt = int(settings.broker_visibility_timeout_s)
    sweep = max(1, min(10, vt // 5))
    return {"visibility_timeout": vt, "unacked_restore_interval": sweep,
            "unacked_restore_throttle": 1 if vt < 600 else 10}


def celery_config(settings: Settings) -> dict:
    """Celery settings: late acks (a task is acknowledged after it ran, so a killed worker's task is
    redelivered), one task prefetched per worker, JSON only, results kept one hour.

    Raises:
        ValueError: no broker configured.
    """
    if not settings.broker_url:
        raise ValueError("no broker configured: set KVLINK_RAG_BROKER_URL=redis://host:port/db "
                         "(without one, `kvlink-rag serve` precomputes in its own thread pool)")
    return {
        "broker_url": settings.broker_url,
        "result_backend": settings.result_backend or settings.broker_url,
        "task_default_queue": settings.task_queue,
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "task_track_started": True,
        "worker_prefetch_multiplier": 1,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_expires": 3600,
        "broker_transport_options": transport_options(settings),
        "result_backend_transport_options": {"visibility_timeout": int(settings.broker_visibility_timeout_s)},
        "broker_connection_retry_on_startup": True,
        "broker_connection_timeout": 2.0,
        "worker_hijack_root_logger": False,
    }


def make_celery(settings: Settings, include: tuple[str, ...] = ()) -> Celery:
    """A Celery app for ``settings``; ``include`` names the task modules a worker imports when it starts
    (none for the web process, which only sends tasks by name).

    Raises:
        ValueError: no broker configured.
    """
    app = Celery("kvlink", include=list(include))
    app.conf.update(celery_config(settings))
    return app

