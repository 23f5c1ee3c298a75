"""The worker's Celery app registers the precompute task under the name the API sends."""

from __future__ import annotations

from service.settings import Settings
from workers.celery_app import PRECOMPUTE_TASK


def test_the_worker_registers_the_task_under_its_name():
    from workers import tasks

    assert tasks.precompute.name == PRECOMPUTE_TASK
    assert tasks.precompute.acks_late is True and tasks.precompute.reject_on_worker_lost is True
    assert tasks.precompute.max_retries == Settings().task_max_retries


def test_only_the_worker_app_includes_the_task_module():
    from service.celery_config import make_celery
    from workers.celery_app import make_worker_app

    settings = Settings(broker_url="redis://127.0.0.1:1/0")
    assert tuple(make_worker_app(settings).conf.include) == ("workers.tasks",)
    assert tuple(make_celery(settings).conf.include) == ()
