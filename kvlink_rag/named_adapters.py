"""Named query-side adapters: link-token artifacts (embeddings ``[K, hidden]`` + optional LoRA) kept as
``$KVLINK_RAG_HOME/links/<name>.safetensors`` and chosen per query.

Documents are encoded by the base model and their cache key does not include the adapter, so one store
serves every adapter and switching adapters never re-encodes a document (issue 7). ``default`` is the
engine's own link tokens (the shipped artifact for the default model); ``none`` keeps them but turns the
query-side LoRA off.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

from .engine import Engine
from .links import load_link_tokens

RESERVED = ("default", "none")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class UnknownAdapter(KeyError):
    """No adapter of that name (message lists the available ones)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


def check_name(name: str) -> str:
    """``name`` if it is a valid adapter name (letters, digits, ``._-``, at most 64, not reserved).

    Raises:
        ValueError: invalid or reserved name.
    """
    if not _NAME.match(name or "") or name.endswith(".safetensors"):
        raise ValueError(f"invalid adapter name {name!r}: use 1-64 letters, digits, '.', '_' or '-'")
    if name in RESERVED:
        raise ValueError(f"{name!r} is reserved; choose another adapter name")
    return name


def adapter_path(links_dir: Path, name: str) -> Path:
    """Where the adapter ``name`` lives. Raises ValueError for an invalid name."""
    return Path(links_dir) / f"{check_name(name)}.safetensors"


def adapter_names(links_dir: Path) -> list[str]:
    """``default``, ``none`` and every valid ``<name>.safetensors`` under ``links_dir``, sorted."""
    found = sorted(p.stem for p in Path(links_dir).glob("*.safetensors") if _NAME.match(p.stem) and p.stem not in RESERVED)
    return [*RESERVED, *found]


class AdapterVariants:
    """Engine variants per adapter name over one model and one document cache (loaded once, memoised).

    Args:
        engine: the default engine (its settings' ``links_dir`` unless ``links_dir`` is given).

    Loading a named adapter injects its LoRA into the shared model: call :meth:`get` under the lock
    that serialises model calls.
    """

    def __init__(self, engine: Engine, links_dir: Path | None = None):
        self.engine = engine
        self.links_dir = Path(links_dir) if links_dir is not None else engine.settings.links_dir
        self._memo: dict[tuple[str, float], Engine] = {}
        self._lock = threading.Lock()

    def names(self) -> list[str]:
        return adapter_names(self.links_dir)

    def get(self, name: str | None) -> Engine:
        """The engine for ``name`` (None = ``default``).

        Raises:
            UnknownAdapter: no such adapter.
            kvlink_rag.links.LinkTokensMismatch: the artifact was made for another base model.
        """
        if name is None or name == "default":
            return self.engine
        if name == "none":
            return self.engine.with_link_tokens(self.engine.link_tokens, adapter=False)
        try:
            path = adapter_path(self.links_dir, name)
        except ValueError:
            path = None
        if path is None or not path.is_file():
            raise UnknownAdapter(f"unknown adapter {name!r}; available: {', '.join(self.names())}")
        key = (name, path.stat().st_mtime)  # a retrained file under the same name is reloaded
        with self._lock:
            if key not in self._memo:
                self._memo[key] = self.engine.with_link_tokens(load_link_tokens(path, self.engine.lm))
            return self._memo[key]
