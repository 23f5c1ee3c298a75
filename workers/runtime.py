"""What a worker process holds: its :class:`service.runtime.Runtime` (settings, store, engine; no queue),
built once, lazily, by :func:`service.runtime.build_runtime`."""

from __future__ import annotations

import logging
import threading

from service.settings import get_settings
from service.queues import redact
from service.runtime import Runtime, build_runtime

log = logging.getLogger(__name__)

_runtime: Runtime | None = None
_lock = threading.Lock()


def get_runtime() -> Runtime:
    """The process's runtime, created on first call (opens the store, loads the model).

    The store under ``settings.home`` must be the API's (a shared volume or the same machine); the
    engine's cache is the store's, so cache keys are the same as the API's. Workers queue nothing and
    run no start-up recovery (the API does).

    Raises:
        kvlink_rag.model.support.ModelLoadError, kvlink_rag.model.convert.ModelFetchError: the model cannot be loaded.
        ValueError: bad settings. service.runtime.StoreOpenError: the store or index cannot be opened.
    """
    global _runtime
    with _lock:
        if _runtime is None:
            settings = get_settings()
            _runtime = build_runtime(settings, queue="none", recover=False)
            log.info("worker loaded model %s in %.1f s (store %s, index %s)", settings.model, _runtime.load_s,
                     redact(settings.local_store), settings.index_url or "embedded")
        return _runtime
