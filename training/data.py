"""Training and validation examples for link tokens, built from an NQ-open oracle format file.

The first ``exclude_first`` questions are reserved for evaluation (``kvlink-rag eval`` reads the first n),
so training never sees an evaluated question or uses one's passage as a distractor.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from evaluation.nq import NQExample, load_nq
from kvlink_rag.types import ContextTooLong

if TYPE_CHECKING:
    from kvlink_rag.engine import Engine


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
        evaluation.nq.DataFormatError: unreadable file or missing fields.
        ValueError: too few examples left to train on.
    """
    examples = load_nq(path)
    pool = examples[exclude_first:]
    if len(pool) <= val_n + 10:
        raise ValueError(f"{path} has {len(examples)} questions; after reserving the first {exclude_first} for "
                         f"evaluation and {val_n} for validation too few are left to train on")
    return Split(train=pool[:-val_n], val=pool[-val_n:], data_hash=file_hash(path)[:16])


def check_context(engine: Engine, split: Split, max_docs: int, k: int, answer_tokens: int, sample: int = 200) -> int:
    """Refuse a documents-per-example count whose typical example cannot fit the model's context.

    The estimate (tokens) is the anchor prefix, ``max_docs`` times the mean length of the first ``sample``
    training passages plus their ``k`` link tokens each, the longest of those questions and
    ``answer_tokens`` + 1: an example that long would be refused by the linker mid-run
    (:func:`kvlink_rag.linking.linker.check_link_inputs`), so the run is refused before it starts instead.

    Returns: the estimate (tokens).
    Raises:
        ContextTooLong: the estimate exceeds ``engine.lm.max_positions`` (the counts in the message).
    """
    exs = split.train[:sample]
    doc_mean = sum(int(engine.document_ids(ex.gold).numel()) for ex in exs) / max(len(exs), 1)
    question = max(len(engine.template.question_ids(engine.lm.tokenizer, ex.question)) for ex in exs)
    prefix = engine.prefix.num_tokens if engine.anchored else 0
    need = int(prefix + max_docs * (doc_mean + k) + question + answer_tokens + 1)
    if need > engine.lm.max_positions:
        raise ContextTooLong(
            f"an example of {max_docs} documents needs about {need} tokens (prefix {prefix}, {max_docs} x "
            f"({doc_mean:.0f}-token passage + {k} link tokens), question {question}, answer {answer_tokens + 1}); "
            f"the model's context holds {engine.lm.max_positions}: use fewer documents per example")
    return need


def answer_ids(engine: Engine, answer: str, max_tokens: int) -> "torch.Tensor":
    """``[m + 1]`` int64: the answer's ids followed by the end-of-turn token; an answer longer than
    ``max_tokens`` is cut to its first ``max_tokens`` ids WITHOUT the end token (``[max_tokens]``), since a
    target that ends where the cap cuts teaches the model to stop mid-answer (a key-value UUID of 30-36 tokens
    cut at 16 came out as 16 tokens and never matched)."""
    import torch  # here: the CLI imports this module before it loads the model (no torch at start-up)

    from kvlink_rag.text.prompt import encode_user_text

    ids = encode_user_text(engine.lm.tokenizer, answer).tolist()  # plain text, never special ids
    if len(ids) > max_tokens:
        return torch.tensor(ids[:max_tokens], dtype=torch.long)
    end = engine.stop_ids[0] if engine.stop_ids else engine.lm.tokenizer.eos_token_id
    return torch.tensor(ids + [end], dtype=torch.long)
