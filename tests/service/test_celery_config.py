"""The Celery configuration, and that building an app (as the API does) imports neither torch nor tasks."""

from __future__ import annotations

import subprocess
import sys

import pytest

from service.settings import Settings
from service_support import ROOT
from service.celery_config import celery_config, make_celery, transport_options


def test_config_acks_late_one_prefetch_and_redis_transport():
    s = Settings(broker_url="redis://h:6379/3", broker_visibility_timeout_s=5, task_queue="q1")
    conf = celery_config(s)
    assert conf["task_acks_late"] is True and conf["task_reject_on_worker_lost"] is True
    assert conf["worker_prefetch_multiplier"] == 1 and conf["task_default_queue"] == "q1"
    assert conf["result_backend"] == "redis://h:6379/3" and conf["accept_content"] == ["json"]
    assert conf["broker_transport_options"] == {"visibility_timeout": 5, "unacked_restore_interval": 1,
                                                "unacked_restore_throttle": 1}
    assert transport_options(Settings(broker_url="redis://h")) == {
        "visibility_timeout": 3600, "unacked_restore_interval": 10, "unacked_restore_throttle": 10}
    assert celery_config(Settings(broker_url="redis://a/1", result_backend="redis://b/2"))["result_backend"] == "redis://b/2"
    with pytest.raises(ValueError, match="KVLINK_RAG_BROKER_URL"):
        make_celery(Settings(broker_url=""))


def test_the_web_side_imports_no_torch_and_no_task_code():
    code = ("import sys\n"
            "from service.settings import Settings\n"
            "from service.celery_config import make_celery\n"
            "app = make_celery(Settings(broker_url='redis://127.0.0.1:1/0'))\n"
            "bad = [m for m in ('torch', 'transformers', 'workers.tasks') if m in sys.modules]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)

