"""What every ``kvlink-rag`` command shares: the consoles, errors, settings, shared options, the runtime.

Where output goes (every command follows it):

* **stdout** is the command's result, data a script may read: answers, assigned ids, finding rows,
  tables, the model's path, JSON with ``--json`` (then nothing else).
* **stderr** is everything about the work: progress bars (one style, :mod:`cli.terminal`), warnings,
  errors (one line, non-zero exit: :func:`fail`), logs, and the closing summary line of what was done
  (``5 documents: 5 new or changed ...``, ``repaired``, ``saved ...``).

Start-up stays light (no torch, transformers, peft, fastapi or celery at module level, here or in any
command module), so ``--help`` and bad arguments answer at once; the model loads inside the commands
that need it, after their arguments (and, where they name stored documents, those documents) are checked.
"""

from __future__ import annotations

import atexit
import gc
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn, Optional

import typer

from cli.terminal import console, out, progress_bar, quiet_libraries, results_only_stdout
from kvlink_rag.settings import DEFAULT_MODEL
from service.settings import Settings, get_settings

if TYPE_CHECKING:
    from kvlink_rag.engine import Engine
    from service.runtime import Runtime

__all__ = ["DtypeOpt", "EncOpt", "KOpt", "NQ_DEFAULT", "NqOpt", "console", "fail", "fetch_default_model",
           "make_engine", "make_settings", "open_runtime", "out", "progress_bar", "quiet_libraries",
           "results_only_stdout"]

NQ_DEFAULT = Path(os.environ.get("KVLINK_RAG_NQ_PATH") or "../shared/data/nq-open-oracle-dev.jsonl.gz")
"""The NQ data file commands read by default: ``$KVLINK_RAG_NQ_PATH``, else ``../shared/data/...``."""
KOpt = Annotated[Optional[int], typer.Option("--k", help="Link tokens per document (0 = naive reuse).")]
EncOpt = Annotated[Optional[str], typer.Option("--encoding", help="anchored (default: documents see the system prompt) | isolated")]
DtypeOpt = Annotated[Optional[str], typer.Option("--kv-dtype", help="float32 | bfloat16 | float16")]
NqOpt = Annotated[Path, typer.Option("--nq", "--data", help="NQ-open oracle JSONL(.gz).")]


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``message`` to stderr and exit non-zero (no traceback)."""
    console.print(f"[red]error:[/red] {message}")
    raise typer.Exit(code)


_FLAGS = {"link_k": "--k", "encoding": "--encoding", "kv_dtype": "--kv-dtype"}


def _name(loc: tuple, overrides: dict) -> str:
    """A settings error's field, as the flag that set it (``--k``) where the command line did, else as the
    environment variable that sets it (``KVLINK_RAG_CHUNK_CONTEXT``)."""
    field = ".".join(map(str, loc))
    if overrides.get(field) is not None:  # the command line set it: its flag (--port for port)
        return _FLAGS.get(field, "--" + field.replace("_", "-"))
    return f"KVLINK_RAG_{field.upper()}" if field.isidentifier() else field


def _message(error: dict, overrides: dict) -> str:
    """One pydantic error as ``NAME: message`` (:func:`_name`), or the message alone for a rule across settings (no
    field); pydantic's "Value error, " prefix dropped."""
    msg = error["msg"].removeprefix("Value error, ")
    return f"{_name(error['loc'], overrides)}: {msg}" if error["loc"] else msg


def make_settings(k: int | None = None, encoding: str | None = None, kv_dtype: str | None = None,
                  **extra) -> Settings:
    """Settings from the environment with CLI overrides; a bad value exits with a message."""
    overrides = {"link_k": k, "encoding": encoding, "kv_dtype": kv_dtype, **extra}
    from pydantic import ValidationError

    try:
        return get_settings(**{k_: v for k_, v in overrides.items() if v is not None})
    except ValidationError as e:  # the messages only, a field the command line set named by its flag
        fail("invalid setting: " + "; ".join(_message(x, overrides) for x in e.errors()))
    except Exception as e:  # noqa: BLE001 - any other bad value: one line, no traceback
        fail(f"invalid setting: {e}")


def open_runtime(settings: Settings) -> Runtime:
    """The store under ``settings.home`` (``build_runtime``: Celery queue with a broker, else none; no
    engine yet, no recovery); exits when it cannot be opened."""
    from service.runtime import StoreOpenError, build_runtime

    try:
        return build_runtime(settings, queue="auto" if settings.distributed else "none", recover=False,
                             load_engine=False)
    except StoreOpenError as e:
        fail(str(e))


def fetch_default_model(settings: Settings) -> Path:
    """The converted default model under ``settings.models_dir``, downloaded and converted first if missing
    (messages and this CLI's progress bar on stderr); exits with the reason when that fails."""
    from kvlink_rag.model.convert import ModelFetchError, ensure_default_model

    try:
        with results_only_stdout():
            return ensure_default_model(settings.models_dir, progress=progress_bar)
    except ModelFetchError as e:
        fail(str(e))


def make_engine(settings: Settings, timings: dict[str, float] | None = None, cache=None,
                runtime: Runtime | None = None, adhoc: bool = False) -> Engine:
    """Load the engine (model, prefix, link tokens, document store) through :mod:`service.runtime`;
    errors exit with a message.

    Args:
        cache: the document cache (no store is opened then).
        runtime: a runtime whose engine to load (on its store's cache); by default one is built
            (``build_runtime``: the store under ``settings.home``, no queue, no recovery).
        adhoc: the caches this engine writes belong to no document record (``ask``, ``demo``): written
            untracked, so ``store check`` never calls them unreferenced (:meth:`store.doc_cache.StoreCache.untracked`).
        timings: if given, filled with seconds spent in ``import_s`` (torch, transformers, the engine),
            ``store_open_s``, ``model_load_s`` (weights, tokenizer, fingerprint; fetches and converts the
            default model on first use) and ``engine_setup_s`` (prefix KV, link tokens, query-side LoRA).
    """
    t = {} if timings is None else timings
    t0 = time.perf_counter()
    with results_only_stdout():
        import torch  # noqa: F401 - imported here so that import_s counts it

        from kvlink_rag import engine  # noqa: F401 - imported here (with the model loader) so that import_s counts them
        from kvlink_rag.model import loader  # noqa: F401
        from service.runtime import apply_torch_threads, build_runtime, load_engine

        quiet_libraries()  # transformers is imported now: its own bar switch
        apply_torch_threads(settings)
        t1 = time.perf_counter()
        fetch_s = _fetch_if_default(settings)
        stages: dict[str, float] = {}
        try:
            if cache is None:
                runtime = runtime or build_runtime(settings, queue="none", recover=False, load_engine=False)
                loaded = runtime.load_engine()
                stages = runtime.timings
                if adhoc:
                    loaded.cache = runtime.store.cache.untracked()
            else:
                loaded = load_engine(settings, cache, stages)
        except (ValueError, FileNotFoundError, RuntimeError) as e:  # StoreOpenError is a RuntimeError
            fail(str(e))
    t.update(import_s=t1 - t0, **{k: stages.get(k, 0.0) for k in ("store_open_s", "model_load_s", "engine_setup_s")})
    t["model_load_s"] += fetch_s
    atexit.register(gc.freeze)  # at exit, skip the interpreter's last collections over torch's objects (~1-2 s)
    return loaded


def checked_doc_cache(doc_cache: str) -> bool:
    """``--doc-cache`` of ``train-links`` and ``eval``: True for ``store``, False for ``memory``; else a one-line
    error and exit (before the model loads)."""
    if doc_cache not in ("memory", "store"):
        fail(f"--doc-cache {doc_cache!r}: choose memory or store")
    return doc_cache == "store"


def doc_cache_engine(settings: Settings, stored_docs: bool) -> Engine:
    """:func:`make_engine` whose document caches live in this process only (a ``MemoryCache``), or with
    ``stored_docs`` in the store under ``settings.home``, untracked, shared by parallel and later runs."""
    if stored_docs:
        return make_engine(settings, adhoc=True)
    from kvlink_rag.cache import MemoryCache

    return make_engine(settings, cache=MemoryCache())


def _fetch_if_default(settings: Settings) -> float:
    """Fetch the default model with this CLI's progress bar before the engine loads it; seconds spent."""
    if settings.model != DEFAULT_MODEL:
        return 0.0
    t0 = time.perf_counter()
    fetch_default_model(settings)
    return time.perf_counter() - t0


def check_adapter_name(settings, adapter: str | None) -> None:
    """A one-line error and exit 2 for an adapter name that exists nowhere (no file in ``settings.links_dir``,
    none shipped with the package), before any model loads; None passes."""
    if adapter is None:
        return
    from kvlink_rag.adapter_names import check_known

    try:
        check_known(settings.links_dir, adapter)
    except (KeyError, ValueError) as e:  # UnknownAdapter, an invalid name
        fail(str(e))
