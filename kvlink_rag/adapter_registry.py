"""Named query-side adapters: link-token artifacts (embeddings ``[K, hidden]`` + optional LoRA) kept as
``$KVLINK_RAG_HOME/links/<name>.safetensors`` or shipped with the package for its model
(``kvlink_rag/assets/adapters/<name>.safetensors``; a user's file of the same name wins), chosen per query.

Documents are encoded by the base model and their cache key does not include the adapter, so one store
serves every adapter and switching adapters never re-encodes a document (issue 7). ``default`` is the
engine's own link tokens (the shipped artifact for the default model); ``none`` keeps them but turns the
query-side LoRA off.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from .adapter_names import (RESERVED, UnknownAdapter, adapter_names, adapter_path, bundled_files, check_known,
                            check_name, find_adapter)
from .engine import Engine
from .linking.link_tokens import LinkTokens, bundled_adapters, load_link_tokens
from .model.lora import remove_lora
from .reuse.doc_side import check_query_side

__all__ = ["RESERVED", "AdapterVariants", "UnknownAdapter", "adapter_names", "adapter_path", "check_known",
           "check_name", "find_adapter"]

Signature = tuple[int, int, int, int]


@dataclass
class _Loaded:
    """A named adapter resident in the model: its file's signature and its engine
    (``engine.adapter`` is the name of the LoRA injected into the shared model)."""

    signature: Signature
    engine: Engine


class AdapterVariants:
    """Engine variants per adapter name over one model and one document cache.

    At most ``max_loaded`` named adapters keep their LoRA in the shared model; using another evicts the
    least recently used one (its LoRA weights are deleted; it is reloaded from its file when asked for
    again, with the same result). A file rewritten under the same name replaces its old copy. ``default``
    (the engine's own adapter) is never evicted.

    Args:
        engine: the default engine (its settings' ``links_dir`` unless ``links_dir`` is given).
        max_loaded: named adapters resident at once (``KVLINK_RAG_MAX_LOADED_ADAPTERS``; at least 1).
        bundled: the package's adapters by name (default: those shipped for the engine's model).

    :meth:`get` injects and deletes LoRAs in the shared model: call it under the lock that serialises
    model calls, and use the engine it returns before releasing that lock (a later :meth:`get` may evict
    it). :meth:`check` only reads the file and may be called anywhere.
    """

    def __init__(self, engine: Engine, links_dir: Path | None = None, max_loaded: int | None = None,
                 bundled: dict[str, Path] | None = None):
        self.engine = engine
        self.bundled = bundled if bundled is not None else bundled_adapters(engine.lm.fingerprint)
        self.links_dir = Path(links_dir) if links_dir is not None else engine.settings.links_dir
        limit = max_loaded if max_loaded is not None else engine.settings.max_loaded_adapters
        self.max_loaded = max(1, int(limit))
        self._loaded: OrderedDict[str, _Loaded] = OrderedDict()  # least recently used first
        self._artifacts: OrderedDict[tuple[str, Signature], LinkTokens] = OrderedDict()
        self._none: Engine | None = None
        self._lock = threading.Lock()

    def names(self) -> list[str]:
        return adapter_names(self.links_dir, self.bundled)

    def _file(self, name: str) -> tuple[Path, Signature]:
        """The artifact's path and signature (inode, mtime, ctime, size: any rewrite, in place or by
        rename, changes it). Raises UnknownAdapter."""
        path = self.path(name)
        try:
            st = path.stat() if path is not None else None
        except OSError:
            st = None
        if st is None:
            raise UnknownAdapter(self._unknown(name))
        return path, (st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)

    def _unknown(self, name: str) -> str:
        """Why ``name`` names no adapter here: unknown, or shipped only for another model."""
        available = ", ".join(self.names())
        if name in bundled_files() and name not in self.bundled:
            return (f"adapter {name!r} ships with kvlink-rag for another model, not for this one (fingerprint "
                    f"{self.engine.lm.fingerprint[:12]}); train one with `kvlink-rag train-links --name {name}`; "
                    f"available: {available}")
        return f"unknown adapter {name!r}; available: {available}"

    def path(self, name: str) -> Path | None:
        """The artifact file a query naming ``name`` reads; None when there is none (an unknown, invalid or
        reserved name). One lookup, no listing of the folder."""
        try:
            path = find_adapter(self.links_dir, name, self.bundled)
        except ValueError:
            return None
        return path if path is not None and path.is_file() else None

    def _artifact(self, name: str, path: Path, signature: Signature) -> LinkTokens:
        """The link tokens of one version of a file (a few recent versions are memoised)."""
        key = (name, signature)
        with self._lock:
            lt = self._artifacts.get(key)
            if lt is not None:
                self._artifacts.move_to_end(key)
                return lt
        lt = load_link_tokens(path, self.engine.lm)
        check_query_side(lt, f"adapter {name!r}")
        with self._lock:
            self._artifacts[key] = lt
            while len(self._artifacts) > 2 * self.max_loaded:
                self._artifacts.popitem(last=False)
        return lt

    def check(self, name: str | None) -> LinkTokens | None:
        """The link tokens ``name`` would use (for validating ``k``), without touching the model.

        Raises:
            UnknownAdapter: no such adapter.
            kvlink_rag.linking.link_tokens.LinkTokensMismatch: the artifact was made for another base model.
        """
        if name is None or name in RESERVED:
            return self.engine.link_tokens
        return self._artifact(name, *self._file(name))

    def get(self, name: str | None) -> Engine:
        """The engine for ``name`` (None = ``default``), its LoRA loaded; call under the model lock.

        Raises:
            UnknownAdapter: no such adapter.
            kvlink_rag.linking.link_tokens.LinkTokensMismatch: the artifact was made for another base model.
        """
        if name is None or name == "default":
            return self.engine
        if name == "none":
            if self._none is None:
                self._none = self.engine.with_link_tokens(self.engine.link_tokens, adapter=False)
            return self._none
        path, signature = self._file(name)
        entry = self._loaded.get(name)
        if entry is not None and entry.signature == signature and self._resident(entry.engine):
            self._loaded.move_to_end(name)
            return entry.engine
        lt = self._artifact(name, path, signature)
        if entry is not None:  # rewritten file (or its LoRA was removed): drop the old copy first
            self._unload(name)
        self._loaded[name] = _Loaded(signature, self.engine.with_link_tokens(lt))
        while len(self._loaded) > self.max_loaded:
            self._unload(next(iter(self._loaded)))
        return self._loaded[name].engine

    def loaded(self) -> list[str]:
        """Names of the resident named adapters, least recently used first."""
        return list(self._loaded)

    def _resident(self, eng: Engine) -> bool:
        return eng.adapter is None or eng.adapter in eng.lm.adapters

    def _unload(self, name: str) -> None:
        """Forget ``name`` and delete its LoRA unless the default or another resident adapter shares it."""
        entry = self._loaded.pop(name)
        lora = entry.engine.adapter
        shared = {self.engine.adapter} | {e.engine.adapter for e in self._loaded.values()}
        if lora is not None and lora not in shared and lora in self.engine.lm.adapters:
            remove_lora(self.engine.lm, lora)
