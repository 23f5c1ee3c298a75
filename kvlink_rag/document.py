"""The user-facing document: text and optional title (no torch, so the CLI can read files before
loading the model)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Document:
    """A document as given by a user: text and optional title."""

    text: str
    title: str | None = None
