"""Helpers of the serving benchmarks: a runtime on a temporary home, ingesting NQ passages (client threads:
:func:`bench.timing.run_clients`)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from evaluation.nq import NQExample
from kvlink_rag.engine import Engine
from service.runtime import Runtime, build_runtime

TENANT = "default"


def runtime(engine: Engine, **overrides) -> Runtime:
    """A runtime over ``engine`` on a fresh temporary home (embedded index and queue), ``overrides`` applied."""
    home = Path(tempfile.mkdtemp(prefix="kvlink-bench-serving-"))
    settings = engine.settings.model_copy(update={"home": home, "index_url": "", "broker_url": "", **overrides})
    return build_runtime(settings, engine, queue="auto", recover=False)


def ingest(rt: Runtime, docs: dict[str, NQExample], timeout: float = 1800) -> None:
    for doc_id, ex in docs.items():
        rt.documents.ingest(TENANT, doc_id, ex.gold.text, ex.gold.title or "")
    deadline = time.monotonic() + timeout
    while rt.queue.depth() and time.monotonic() < deadline:
        time.sleep(0.1)
