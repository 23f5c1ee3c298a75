"""Fixtures of the scripts' tests: a script under scripts/ loaded as a module."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def script():
    """``script(name)``: ``scripts/<name>.py`` loaded as a module (its ``main`` not run)."""

    def load(name: str):
        spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    return load
