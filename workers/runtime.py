"""What a worker process holds: its settings, the store, and one engine (model loaded once, lazily)."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from kvlink_rag.settings import Settings, get_settings

log = logging.getLogger(__name__)


@dataclass
class WorkerRuntime:
    """The store and the engine of one worker process.

    Attributes:
        settings: from the environment (``KVLINK_RAG_*``).
        store: ``store.factory.Store`` under ``settings.home`` (the LMDB store must be the API's: a
            shared volume or the same machine).
        engine: ``kvlink_rag.engine.Engine`` whose cache is ``store.cache`` (same cache keys as the API).
        load_s: seconds it took to open the store and load the model.
    """

    settings: Settings
    store: object
    engine: object
    load_s: float


_runtime: WorkerRuntime | None = None
_lock = threading.Lock()


def apply_torch_threads(settings: Settings) -> None:
    """``torch.set_num_threads(settings.torch_threads)`` when it is set (> 0)."""
    if settings.torch_threads > 0:
        import torch

        torch.set_num_threads(settings.torch_threads)


def get_runtime() -> WorkerRuntime:
    """The process's runtime, created on first call (opens the store, loads the model).

    Raises:
        kvlink_rag.model.ModelLoadError, kvlink_rag.convert.ModelFetchError: the model cannot be loaded.
        ValueError: bad settings (e.g. the index URL).
    """
    global _runtime
    with _lock:
        if _runtime is None:
            from kvlink_rag.engine import Engine
            from store.factory import open_store

            t0 = time.perf_counter()
            settings = get_settings()
            apply_torch_threads(settings)
            store = open_store(settings)
            engine = Engine(settings, cache=store.cache)
            _runtime = WorkerRuntime(settings, store, engine, time.perf_counter() - t0)
            log.info("worker loaded model %s in %.1f s (store %s, index %s)", settings.model, _runtime.load_s,
                     settings.store_dir, settings.index_url or "embedded")
        return _runtime
