"""Training and validation examples for link tokens, built from an NQ-open oracle format file.

The first ``exclude_first`` questions are reserved for evaluation (``kvlink-rag eval`` reads the first n),
so training never sees an evaluated question or uses one's passage as a distractor.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from kvlink_rag.nq import NQExample, load_nq


@dataclass(frozen=True)
class Split:
    """Training and held-out validation examples, with the hash of the data they came from."""

    train: list[NQExample]
    val: list[NQExample]
    data_hash: str


def file_hash(path: Path) -> str:
    """sha256 hex of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def split_examples(path: Path, exclude_first: int = 500, val_n: int = 50) -> Split:
    """Questions ``[exclude_first, end - val_n)`` train, the last ``val_n`` validate.

    Raises:
        kvlink_rag.nq.DataFormatError: unreadable file or missing fields.
        ValueError: too few examples left to train on.
    """
    examples = load_nq(path)
    pool = examples[exclude_first:]
    if len(pool) <= val_n + 10:
        raise ValueError(f"{path} has {len(examples)} questions; after reserving the first {exclude_first} for "
                         f"evaluation and {val_n} for validation too few are left to train on")
    return Split(train=pool[:-val_n], val=pool[-val_n:], data_hash=file_hash(path)[:16])
