"""Multi-document key-value retrieval: a synthetic second task for the answer-quality evaluation.

The task of "Lost in the Middle" (Liu et al., 2023, section 3): a JSON object of random UUID keys and
values, and a question asking for the value of one key. Here the object is spread over documents: each
document is a JSON object holding ``pairs_per_doc`` of the pairs, and one document (the gold document)
holds the asked key. Examples are generated, never downloaded: every UUID is a version-4 UUID drawn from
``random.Random(seed * 1_000_003 + index)``, so question ``index`` is the same in every run and at every
gold position (only the gold document's slot moves).

An example has the shape of :class:`evaluation.nq.NQExample` (question, answers, gold document) plus its
distractor documents, and :func:`build_documents` has the signature of :func:`evaluation.nq.build_documents`,
so every evaluation mode runs on it unchanged. Metric: :func:`exact_match` (the gold value occurs verbatim
in the answer).

Context (SmolLM2-135M-Instruct tokenizer, 8,192 positions): a UUID is 30-36 tokens, a two-pair document
~145 tokens with its ``Document:`` frame, the question ~69; a full prompt of 50 two-pair documents is
7,233-7,319 tokens (measured on questions 0-19), ~7,670 with K=5 link tokens per document and 100 new
tokens (10 documents: 1,512-1,556; 20: 2,951-3,013). Three pairs per document (~216 tokens each) would not fit 50 documents.

No torch here: the CLI builds examples before it loads the model.
"""

from __future__ import annotations

import json
import random
import uuid
from dataclasses import dataclass

from evaluation.nq import NQExample, gold_slot
from kvlink_rag.types import Document

PAIRS_PER_DOC = 2
"""Default pairs per document: 50 such documents fit the default model's 8k context."""
INSTRUCTION = "Extract the value corresponding to the specified key in the JSON objects of the documents above."


@dataclass(frozen=True)
class KVExample(NQExample):
    """One retrieval question: ``question`` asks for ``key``, ``answers`` is ``(value,)``, ``gold`` the
    document holding the pair, ``distractors`` the other documents (``n_docs - 1``, in generation order)."""

    key: str
    distractors: tuple[Document, ...]


def exact_match(prediction: str, answers: list[str] | tuple[str, ...]) -> float:
    """1.0 if a gold value (a UUID) occurs verbatim (case and hyphens included) in ``prediction``, else 0.0.

    Stricter than best_subspan_em (which lower-cases and drops punctuation, so a UUID without its hyphens
    would count); a UUID is already lower-case, so only an answer that reproduces it exactly scores.
    """
    return float(any(a and a in prediction for a in answers))


def question_text(key: str) -> str:
    """The question (the prompt template puts ``Question:`` before it): LITM's instruction and key lines."""
    return f'{INSTRUCTION}\nKey: "{key}"\nCorresponding value:'


def _uuids(rng: random.Random, count: int) -> list[str]:
    """``count`` distinct version-4 UUID strings from ``rng``."""
    seen: dict[str, None] = {}
    while len(seen) < count:
        seen[str(uuid.UUID(int=rng.getrandbits(128), version=4))] = None
    return list(seen)


def make_example(index: int, n_docs: int, pairs_per_doc: int = PAIRS_PER_DOC, seed: int = 0) -> KVExample:
    """Question ``index``: ``n_docs`` documents of ``pairs_per_doc`` pairs each, all keys and values distinct.

    The gold pair sits at a random place inside the gold document (drawn from the same generator).

    Raises:
        ValueError: ``n_docs`` or ``pairs_per_doc`` below 1, or ``index`` negative.
    """
    if n_docs < 1 or pairs_per_doc < 1:
        raise ValueError(f"documents ({n_docs}) and pairs per document ({pairs_per_doc}) must be >= 1")
    if index < 0:
        raise ValueError(f"question index {index} must be >= 0")
    rng = random.Random(seed * 1_000_003 + index)
    ids = _uuids(rng, 2 * n_docs * pairs_per_doc)
    pairs = list(zip(ids[::2], ids[1::2]))  # [(key, value)], n_docs * pairs_per_doc of them
    docs = [Document(json.dumps(dict(pairs[d * pairs_per_doc:(d + 1) * pairs_per_doc])))
            for d in range(n_docs)]
    gold_doc = rng.randrange(n_docs)
    key, value = pairs[gold_doc * pairs_per_doc + rng.randrange(pairs_per_doc)]
    return KVExample(question_text(key), (value,), docs[gold_doc], key,
                     tuple(d for i, d in enumerate(docs) if i != gold_doc))


def make_examples(n: int, n_docs: int, pairs_per_doc: int = PAIRS_PER_DOC, seed: int = 0) -> list[KVExample]:
    """Questions ``0..n-1`` (:func:`make_example`).

    Raises:
        ValueError: ``n`` below 1, or a bad count (see :func:`make_example`).
    """
    if n < 1:
        raise ValueError(f"number of questions ({n}) must be >= 1")
    return [make_example(i, n_docs, pairs_per_doc, seed) for i in range(n)]


def build_documents(examples: list[KVExample], index: int, n_docs: int, gold_position: str = "random",
                    seed: int = 0) -> tuple[list[Document], int]:
    """``examples[index]``'s documents with the gold document at ``gold_position`` (first, middle
    (``n_docs // 2``), last, or random from ``random.Random(seed * 1_000_003 + index)``); the
    distractors keep their order. Returns ``(documents, gold_slot)``, as :func:`evaluation.nq.build_documents`.

    Raises:
        ValueError: index out of range, ``n_docs`` not the example's document count, unknown position.
    """
    if not 0 <= index < len(examples):
        raise ValueError(f"index {index} out of range 0..{len(examples) - 1}")
    ex = examples[index]
    if n_docs != len(ex.distractors) + 1:
        raise ValueError(f"example {index} has {len(ex.distractors) + 1} documents, not {n_docs}")
    slot = gold_slot(gold_position, n_docs, random.Random(seed * 1_000_003 + index))
    return [*ex.distractors[:slot], ex.gold, *ex.distractors[slot:]], slot
