"""Fixtures of the store tests: random document factories, a fake clock, fresh LMDB folders."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from factories import random_kv
from kvlink_rag.types import DocumentKV

# ~80 and ~50 word English texts for the SimHash tests.
AMAZON = (
    "The Amazon rainforest covers much of the Amazon basin of South America. This basin encompasses seven million "
    "square kilometres, of which five and a half million square kilometres are covered by the rainforest. The region "
    "includes territory belonging to nine nations and three thousand four hundred and forty four formally acknowledged "
    "indigenous territories. The majority of the forest is contained within Brazil, with sixty percent of the "
    "rainforest, followed by Peru with thirteen percent and Colombia with ten percent."
)
PHOTOSYNTHESIS = (
    "Photosynthesis is the process used by plants and other organisms to convert light energy into chemical energy "
    "that can later be released to fuel the organism's activities. Some of this chemical energy is stored in "
    "carbohydrate molecules such as sugars and starches, which are synthesized from carbon dioxide and water."
)


class FakeClock:
    """A settable clock: ``clock()`` returns ``clock.t``; ``clock.advance(s)`` moves it."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> float:
        self.t += seconds
        return self.t


@pytest.fixture
def texts() -> SimpleNamespace:
    """``amazon`` (~80 words) and ``photosynthesis`` (~50 words): unrelated English texts."""
    return SimpleNamespace(amazon=AMAZON, photosynthesis=PHOTOSYNTHESIS)


@pytest.fixture
def make_kv():
    """The :func:`random_kv` factory."""
    return random_kv


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def lmdb_env(tmp_path):
    """A fresh :class:`store.lmdb_env.LmdbEnv` (4 MiB map, 64 MiB max), closed afterwards."""
    from store.lmdb_env import open_env

    env = open_env(tmp_path / "store", map_size=4 << 20, max_map_size=64 << 20)
    yield env
    env.close()


def assert_same_kv(a: DocumentKV, b: DocumentKV) -> None:
    """Bit-exact equality of two documents (dtype, shape, values, ids, fingerprint, encoding)."""
    assert a.keys.dtype == b.keys.dtype and a.keys.shape == b.keys.shape
    assert torch.equal(a.keys.cpu(), b.keys.cpu())  # a device tier's copy against the host's
    assert torch.equal(a.values.cpu(), b.values.cpu())
    assert torch.equal(a.token_ids.cpu(), b.token_ids.cpu())
    assert (a.fingerprint, a.encoding) == (b.fingerprint, b.encoding)


@pytest.fixture
def same_kv():
    """The :func:`assert_same_kv` helper."""
    return assert_same_kv
