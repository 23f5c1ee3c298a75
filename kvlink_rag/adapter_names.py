"""Adapter names and where their files lie, without torch: what a command line or a request can check before
any model loads (:mod:`kvlink_rag.adapter_registry` loads them).

A named adapter is ``$KVLINK_RAG_HOME/links/<name>.safetensors`` or one shipped with the package
(``kvlink_rag/assets/adapters/<name>.safetensors``, offered only for the model it was made for:
:func:`kvlink_rag.linking.link_tokens.bundled_adapters`); a user's file of the same name wins. ``default`` and
``none`` are reserved, and so is the served model's id.
"""

from __future__ import annotations

import re
from pathlib import Path

from .settings import SERVED_MODEL_ID

RESERVED = ("default", "none")
ASSETS = Path(__file__).with_name("assets")  # kvlink_rag/assets (package data): the shipped artifact
BUNDLED = ASSETS / "adapters"  # named adapters shipped with the package: <name>.safetensors
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
    if name in RESERVED or name == SERVED_MODEL_ID:
        raise ValueError(f"{name!r} is reserved; choose another adapter name")
    return name


def adapter_path(links_dir: Path, name: str) -> Path:
    """Where the adapter ``name`` lives. Raises ValueError for an invalid name."""
    return Path(links_dir) / f"{check_name(name)}.safetensors"


def adapter_names(links_dir: Path, bundled: dict[str, Path] | None = None) -> list[str]:
    """``default``, ``none`` and every valid ``<name>.safetensors`` under ``links_dir`` or in ``bundled``, sorted
    (``kvlink-rag``, the served model's id, is never an adapter)."""
    def valid(n: str) -> bool:  # the names check_name accepts: every listed name can be used
        try:
            return bool(check_name(n))
        except ValueError:
            return False

    own = {p.stem for p in Path(links_dir).glob("*.safetensors") if valid(p.stem)}
    return [*RESERVED, *sorted(own | {n for n in bundled or {} if valid(n)})]


def find_adapter(links_dir: Path, name: str, bundled: dict[str, Path] | None = None) -> Path | None:
    """The file a query naming ``name`` uses: ``links_dir/<name>.safetensors`` when it exists, else the bundled
    adapter of that name, else None. Raises ValueError for an invalid name."""
    own = adapter_path(links_dir, name)
    if own.is_file():
        return own
    return (bundled or {}).get(name)


def bundled_files(folder: Path = BUNDLED) -> dict[str, Path]:
    """Every adapter file shipped in ``folder``, by name, whatever model it was made for (no file is read)."""
    return {p.stem: p for p in sorted(Path(folder).glob("*.safetensors"))}


def check_known(links_dir: Path, name: str, folder: Path = BUNDLED) -> str:
    """``name`` if a query may name it before the model loads: ``default``, ``none``, a file in ``links_dir`` or
    one shipped in ``folder`` (for any model: whether it was made for the served one is known once the model
    has loaded, :meth:`kvlink_rag.adapter_registry.AdapterVariants.get`).

    Raises:
        UnknownAdapter: no such adapter (the message lists the names that exist).
        ValueError: an invalid name.
    """
    if name in RESERVED:
        return name
    shipped = bundled_files(folder)
    if find_adapter(links_dir, name, shipped) is None:
        raise UnknownAdapter(f"unknown adapter {name!r}; available: {', '.join(adapter_names(links_dir, shipped))}")
    return name
