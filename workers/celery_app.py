"""The worker's Celery application: the configuration of :mod:`service.celery_config` with the task module.

``celery -A workers.celery_app worker -P solo`` (or ``kvlink-rag worker``) finds the module attribute
``app``, built lazily from the environment on first access. The web process never imports this module:
it sends tasks by name (:class:`service.queues.CeleryQueue`).
"""

from __future__ import annotations

from celery import Celery

from service.settings import Settings, get_settings
from service.celery_config import PRECOMPUTE_TASK, make_celery

__all__ = ["PRECOMPUTE_TASK", "TASK_MODULES", "make_worker_app"]

TASK_MODULES = ("workers.tasks",)


def make_worker_app(settings: Settings) -> Celery:
    """The worker's Celery app for ``settings``: it imports and registers the tasks when it starts.

    Raises:
        ValueError: no broker configured.
    """
    return make_celery(settings, include=TASK_MODULES)


def __getattr__(name: str) -> Celery:
    """``app`` / ``celery_app``: the app of the environment's settings, built on first access."""
    if name in ("app", "celery_app"):
        built = make_worker_app(get_settings())
        globals()["app"] = globals()["celery_app"] = built
        return built
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
