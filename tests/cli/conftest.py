"""Fixtures of the CLI tests: a tiny saved checkpoint and an environment that points the CLI at it."""

from __future__ import annotations

from pathlib import Path

import pytest

from service_support import save_tiny_checkpoint


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory) -> Path:
    return save_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny")


@pytest.fixture
def env(tmp_path, tiny_checkpoint) -> dict:
    """``KVLINK_RAG_*`` for one CLI run: a fresh home, the tiny model on CPU, embedded index and queue."""
    return {"KVLINK_RAG_HOME": str(tmp_path / "home"), "KVLINK_RAG_MODEL": str(tiny_checkpoint),
            "KVLINK_RAG_DEVICE": "cpu", "KVLINK_RAG_MAX_NEW_TOKENS": "3", "KVLINK_RAG_BROKER_URL": "",
            "KVLINK_RAG_INDEX_URL": "", "KVLINK_RAG_API_KEY": ""}
