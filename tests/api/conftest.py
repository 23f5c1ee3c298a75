"""Fixtures of the API tests: the app on the embedded default over a tiny engine, fixture documents."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from api_helpers import service_settings
from factories import tiny_text_engine

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def tiny_engine(tmp_path_factory):
    """One tiny random Llama with the real tokenizer (answers are noise; 4 new tokens) for all API tests."""
    return tiny_text_engine(tmp_path_factory.mktemp("tiny-engine"), max_new_tokens=4)


@pytest.fixture
def make_client(tmp_path, tiny_engine) -> Callable:
    """``make_client(**settings)`` -> context manager of a started ``TestClient`` (``client.app_state`` is
    the app's ``ServiceState``)."""

    @contextmanager
    def make(engine=None, **overrides):
        app = create_app(service_settings(tmp_path / "home", **overrides), engine or tiny_engine)
        with TestClient(app) as client:
            client.app_state = app.state.service
            yield client

    return make


@pytest.fixture
def client(make_client):
    """A started app: embedded default, single tenant, one precompute thread."""
    with make_client() as c:
        yield c


@pytest.fixture
def fixture_docs(tmp_path) -> list[dict]:
    """The four fixture documents (lighthouse, paris, photosynthesis, volcano), read from a copy."""
    path = shutil.copy(FIXTURES / "documents.jsonl", tmp_path / "documents.jsonl")
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
