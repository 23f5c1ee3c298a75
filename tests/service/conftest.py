"""Fixtures of the service tests: a tiny engine and runtimes built with ``build_runtime`` over it."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from factories import tiny_text_engine
from runtime_helpers import service_settings
from service.runtime import Runtime, build_runtime


@pytest.fixture(scope="session")
def tiny_engine(tmp_path_factory):
    """One tiny random Llama with the real tokenizer (answers are noise; 4 new tokens)."""
    return tiny_text_engine(tmp_path_factory.mktemp("tiny-engine"), max_new_tokens=4)


@pytest.fixture
def make_runtime(tmp_path, tiny_engine) -> Iterator[Callable[..., Runtime]]:
    """``make_runtime(queue="none", **settings)``: a runtime over the tiny engine on ``tmp_path/home``,
    closed at the end of the test."""
    built: list[Runtime] = []

    def make(queue: str = "none", recover: bool = True, **overrides) -> Runtime:
        rt = build_runtime(service_settings(tmp_path / "home", **overrides), tiny_engine, queue=queue,
                           recover=recover)
        built.append(rt)
        return rt

    yield make
    for rt in built:
        rt.close()
