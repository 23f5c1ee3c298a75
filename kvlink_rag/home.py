"""The home folder and the base of every layer's settings class (part of the declared kernel: the store's
and the service's settings derive from it without reaching into the core).

Each layer reads its own class: :class:`kvlink_rag.settings.EngineSettings` (the core),
:class:`store.settings.StoreSettings`, :class:`service.settings.ServiceSettings`; a process's whole
configuration is :class:`service.settings.Settings`, all three in one. Every class reads the same
environment variables ``KVLINK_RAG_<FIELD>`` and ignores the other layers' ones. :func:`registered` is the one
check of a setting's name against a registry (admission policies, reuse methods, stored dtypes).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def default_home() -> Path:
    """``~/.cache/kvlink-rag``: the one folder that holds every piece of kept state."""
    return Path.home() / ".cache" / "kvlink-rag"


class LayerSettings(BaseSettings):
    """What every layer's settings share: the ``KVLINK_RAG_`` prefix (other variables are ignored) and ``home``.

    Paths that are not given default to folders under ``home`` so that two runs pointed at the same home
    share all state.
    """

    model_config = SettingsConfigDict(env_prefix="KVLINK_RAG_", extra="ignore")

    home: Path = Field(default_factory=default_home, description="Folder for all kept state.")


def registered(what: str, name: str, names: Iterable[str]) -> str:
    """``name`` when it is one of ``names`` (a registry's keys or a setting's choices).

    Raises:
        ValueError: ``unknown <what> 'name'; choose one of ...`` naming ``names`` in their order.
    """
    names = list(names)
    if name not in names:
        raise ValueError(f"unknown {what} {name!r}; choose one of {', '.join(names)}")
    return name
