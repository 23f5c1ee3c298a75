"""Natural Questions (open) multi-document inputs and the best_subspan_em metric.

Data: the NQ-open oracle file of "Lost in the Middle" (Liu et al., 2023): one JSON object a line with
``question``, ``answers`` and ``ctxs`` (the gold passage first). Multi-document inputs mix a question's
gold passage with other questions' gold passages as distractors (never containing an answer).
Metric: normalised substring match of any gold answer in the output (best_subspan_em, Liu et al. 2023;
used by KVLink, arXiv 2502.16002, section 4).
"""

from __future__ import annotations

import gzip
import json
import random
import re
import string
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kvlink_rag.types import Document

GOLD_POSITIONS = ("first", "middle", "last", "random")


class DataFormatError(ValueError):
    """A data file is missing, unreadable or lacks a required field."""


@dataclass(frozen=True)
class NQExample:
    """One question with its gold answers and gold passage."""

    question: str
    answers: tuple[str, ...]
    gold: Document


def normalize_answer(s: str) -> str:
    """Lower-case, drop punctuation and the articles a/an/the, collapse whitespace (SQuAD normalisation)."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def best_subspan_em(prediction: str, answers: list[str] | tuple[str, ...]) -> float:
    """1.0 if any normalised gold answer is a substring of the normalised prediction, else 0.0."""
    pred = normalize_answer(prediction)
    return float(any(normalize_answer(a) and normalize_answer(a) in pred for a in answers))


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, object]]:
    """``(line number, parsed JSON)`` for each non-blank line of a JSONL file (``.gz`` or plain).

    Raises:
        DataFormatError: a line is not JSON.
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield n, json.loads(line)
            except json.JSONDecodeError as e:
                raise DataFormatError(f"{path}:{n}: not JSON ({e.msg})") from None


def load_nq(path: str | Path, limit: int | None = None) -> list[NQExample]:
    """Read the NQ-open oracle JSONL (``.gz`` or plain).

    Raises:
        DataFormatError: file missing, bad JSON, or a line without question/answers/ctxs.
    """
    path = Path(path)
    if not path.exists():
        raise DataFormatError(f"data file {path} does not exist (give its path with --nq, KVLINK_RAG_NQ_PATH=path "
                              "or make ... NQ=path; README 'Quick start')")
    out: list[NQExample] = []
    for n, obj in iter_jsonl(path):
        for key in ("question", "answers", "ctxs"):
            if not isinstance(obj, dict) or key not in obj:
                raise DataFormatError(f"{path}:{n}: missing field {key!r}")
        if not obj["ctxs"] or "text" not in obj["ctxs"][0]:
            raise DataFormatError(f"{path}:{n}: ctxs holds no passage with 'text'")
        ctx = obj["ctxs"][0]
        out.append(NQExample(obj["question"], tuple(obj["answers"]), Document(ctx["text"], ctx.get("title"))))
        if limit is not None and len(out) >= limit:
            break
    return out


def gold_slot(gold_position: str, n_docs: int, rng: random.Random) -> int:
    """Slot index of the gold passage. Raises ValueError for an unknown position name."""
    if gold_position not in GOLD_POSITIONS:
        raise ValueError(f"unknown gold position {gold_position!r}; choose one of {', '.join(GOLD_POSITIONS)}")
    if gold_position == "random":
        return rng.randrange(n_docs)
    return {"first": 0, "middle": n_docs // 2, "last": n_docs - 1}[gold_position]


class TooFewDistractors(ValueError):
    """Not enough passages without the question's answer to serve as distractors."""


def build_documents(examples: list[NQExample], index: int, n_docs: int, gold_position: str = "random",
                    seed: int = 0) -> tuple[list[Document], int]:
    """Gold passage of ``examples[index]`` among ``n_docs - 1`` distractors (other questions' gold passages).

    Distractors are drawn with ``random.Random(seed * 1_000_003 + index)`` and never contain a
    normalised gold answer. Returns ``(documents, gold_slot)``.

    Raises:
        ValueError: n_docs < 1, index out of range; TooFewDistractors (a ValueError): fewer passages
            without the answer than ``n_docs - 1`` (an answer such as "S" is a substring of nearly every
            passage).
    """
    if n_docs < 1:
        raise ValueError(f"documents per question must be >= 1, got {n_docs}")
    if not 0 <= index < len(examples):
        raise ValueError(f"index {index} out of range 0..{len(examples) - 1}")
    ex = examples[index]
    rng = random.Random(seed * 1_000_003 + index)
    answers = [normalize_answer(a) for a in ex.answers if normalize_answer(a)]
    pool = [i for i in range(len(examples)) if i != index]
    rng.shuffle(pool)
    distractors: list[Document] = []
    for i in pool:
        if len(distractors) == n_docs - 1:
            break
        text = normalize_answer(examples[i].gold.text + " " + (examples[i].gold.title or ""))
        if not any(a in text for a in answers):
            distractors.append(examples[i].gold)
    if len(distractors) < n_docs - 1:
        raise TooFewDistractors(f"only {len(distractors)} distractors without the answer are available")
    slot = gold_slot(gold_position, n_docs, rng)
    return distractors[:slot] + [ex.gold] + distractors[slot:], slot
