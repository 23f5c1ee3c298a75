"""The task mixture of ``train-links --mixture`` (issue 28): which task each training example comes from,
and the fixed validation examples of each task.

Tasks (each drawn per example with probability weight / sum of weights, from ``random.Random`` seeded by the
run's seed and the example's index, so a run and its resumption draw the same sequence):

- ``nq``: NQ with a document count drawn uniformly in ``nq_docs`` (default 5-20), the gold passage at a
  uniformly drawn slot (``gold_position="random"``).
- ``kv``: key-value retrieval (:mod:`training.kv_retrieval`) over ``kv_docs`` documents, generated from seed
  ``KV_TRAIN_SEED + seed`` (validation ``KV_VAL_SEED``); ``eval --task kv-retrieval`` generates from its own
  ``--seed`` (default 0), so any evaluation seed below ``KV_TRAIN_SEED`` never meets a trained question.
  Every example is a new question (its documents encoded when it comes), or with ``pool`` N > 0
  question ``i mod N``: a pool of N x ``kv_docs`` documents that pre-encoding covers once. The trained answer is
  the value (a UUID), or with ``kv_answer`` 'sentence' the value in :data:`KV_SENTENCE` (the bare-UUID targets
  taught the shared adapter terse answers elsewhere too: EVALUATION.md, session 2026-12-07e).
- ``long``: the example's passages (``long_passages`` drawn uniformly) joined into ONE document that the
  engine chunks as the store does (``chunk_tokens``, :mod:`kvlink_rag.text.chunking`), link tokens after every chunk.
  Each is a new document (~1,500 tokens at 10 passages, 35 MB of bfloat16 KV for the default model), or with
  ``pool`` N > 0 the long document of example ``i mod N`` (N documents to encode and hold).
- ``polarity``: a subject's two documents of opposite polarity (covers / does not cover, ...) among 2-6
  documents, the question asking for one of the two lists (:mod:`training.polarity`, seed
  ``POLARITY_TRAIN_SEED + seed``, validation ``POLARITY_VAL_SEED``; with ``pool`` N, question ``i mod N``).
- ``retention``: NQ at ``docs`` documents, each document kept at a retention drawn from ``retentions``
  (:mod:`kvlink_rag.retention`, ``retention_method``), so the link tokens learn to repair pruned caches.

Validation is per task on fixed examples: NQ at ``docs`` documents (``--docs``, 10 by default: the
evaluation's setting and today's validation), KV at ``kv_docs``, polarity at 4 documents, long documents at the
midpoint of ``long_passages``, retention at ``docs`` documents and the lowest of ``retentions``.

No torch here.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from evaluation.long_docs import join_passages
from evaluation.nq import NQExample, TooFewDistractors, build_documents
from kvlink_rag.types import Document

from . import kv_retrieval as kv
from . import polarity

TASKS = ("nq", "kv", "long", "retention", "polarity")
KV_TRAIN_SEED = 7001
KV_VAL_SEED = 9001
KV_ANSWERS = ("value", "sentence")
KV_SENTENCE = "The corresponding value is {value}."
"""A kv example's trained answer with ``kv_answer`` 'sentence' (the value, a UUID, stays what scores)."""


@dataclass(frozen=True)
class Sample:
    """One example of a task: question, gold answers, documents in slot order (a long document is one
    entry, chunked by the engine), and the retention its document caches are linked at."""

    task: str
    question: str
    answers: tuple[str, ...]
    docs: tuple[Document, ...]
    retention: float = 1.0


@dataclass(frozen=True)
class Mixture:
    """Task weights and per-task settings. Raises ValueError (from :meth:`check`) on an unknown task, a
    negative weight, all weights zero, a bad range or an unknown ``kv_answer``."""

    weights: tuple[tuple[str, float], ...] = (("nq", 1.0),)
    nq_docs: tuple[int, int] = (5, 20)
    kv_docs: int = 10
    long_passages: tuple[int, int] = (5, 15)
    retentions: tuple[float, ...] = (0.4, 0.6, 0.8)
    docs: int = 10
    pool: int = 0
    kv_answer: str = "value"  # the kv target: the bare value, or it in a sentence (KV_SENTENCE)

    def check(self) -> Mixture:
        names = [t for t, _ in self.weights]
        bad = [t for t in names if t not in TASKS]
        if bad:
            raise ValueError(f"unknown task {bad[0]!r}; choose among {', '.join(TASKS)}")
        if any(w < 0 for _, w in self.weights) or sum(w for _, w in self.weights) <= 0:
            raise ValueError("task weights must be >= 0 and at least one above 0")
        for lo, hi in (self.nq_docs, self.long_passages):
            if not 1 <= lo <= hi:
                raise ValueError(f"range {lo}-{hi}: expected 1 <= MIN <= MAX")
        if not self.retentions or not all(0 < r <= 1 for r in self.retentions):
            raise ValueError(f"retentions {self.retentions}: each in (0, 1]")
        if self.kv_answer not in KV_ANSWERS:
            raise ValueError(f"kv answer {self.kv_answer!r}: choose {' or '.join(KV_ANSWERS)}")
        return self

    def kv_answers(self, ex: kv.KVExample) -> tuple[str, ...]:
        """The answers of a kv sample: ``ex.answers`` (the value), or with ``kv_answer`` 'sentence' the value in
        :data:`KV_SENTENCE` first (the trained target, ``answers[0]``) and the value after it."""
        if self.kv_answer == "value":
            return ex.answers
        return (KV_SENTENCE.format(value=ex.answers[0]), *ex.answers)

    @property
    def tasks(self) -> list[str]:
        """Tasks with a weight above 0, in :data:`TASKS` order."""
        w = dict(self.weights)
        return [t for t in TASKS if w.get(t, 0) > 0]

    def pooled(self, i: int) -> int:
        """The example index a pooled task (kv, long, polarity) draws for training example ``i``: ``i mod pool``,
        or ``i`` without a pool."""
        return i % self.pool if self.pool else i

    @property
    def max_docs(self) -> int:
        """Most NQ documents an example may hold (for the context check)."""
        return max(self.nq_docs[1] if "nq" in self.tasks else 0, self.docs)


def parse_weights(text: str) -> tuple[tuple[str, float], ...]:
    """``"nq=1,kv=0.5"`` -> ``(("nq", 1.0), ("kv", 0.5))``. Raises ValueError: not ``task=weight`` pairs."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, eq, w = part.partition("=")
        try:
            out.append((name.strip(), float(w)))
        except ValueError:
            raise ValueError(f"--mixture {text!r}: expected task=weight pairs, e.g. nq=1,kv=0.5") from None
        if not eq:
            raise ValueError(f"--mixture {text!r}: expected task=weight pairs, e.g. nq=1,kv=0.5")
    return tuple(out)


def draw_task(mix: Mixture, seed: int, i: int) -> str:
    """The task of training example ``i`` (deterministic in ``seed`` and ``i``)."""
    w = dict(mix.weights)
    tasks = mix.tasks
    return random.Random(f"mixture-{seed}-{i}").choices(tasks, weights=[w[t] for t in tasks])[0]


def _nq_docs(pool: list[NQExample], order: list[int], i: int, n_docs: int, seed: int) -> tuple[NQExample, list[Document]]:
    for shift in range(len(order)):  # a question whose answer is in every passage is skipped
        idx = order[(i + shift) % len(order)]
        try:
            docs, _ = build_documents(pool, idx, n_docs, "random", seed=seed)
        except TooFewDistractors:
            continue
        return pool[idx], docs
    raise TooFewDistractors(f"no training question has {n_docs - 1} distractors without its answer")


def train_sample(mix: Mixture, train: list[NQExample], order: list[int], seed: int, i: int) -> Sample:
    """Training example ``i`` of the mixture (task by :func:`draw_task`, its draws seeded by ``seed`` and ``i``)."""
    task = draw_task(mix, seed, i)
    rng = random.Random(f"mixture-draw-{seed}-{i}")
    if task == "kv":
        ex = kv.make_example(mix.pooled(i), mix.kv_docs, seed=KV_TRAIN_SEED + seed)
        docs, _ = kv.build_documents([ex], 0, mix.kv_docs, "random", seed=seed + i)
        return Sample(task, ex.question, mix.kv_answers(ex), tuple(docs))
    if task == "polarity":
        j = mix.pooled(i)
        ex = polarity.make_example(j, random.Random(f"polarity-{seed}-{j}").randint(2, 6),
                                   seed=polarity.POLARITY_TRAIN_SEED + seed)
        return Sample(task, ex.question, ex.answers, ex.docs)
    if task == "long":
        j = mix.pooled(i)
        rng = random.Random(f"mixture-draw-{seed}-{j}")
        ex, docs = _nq_docs(train, order, j, rng.randint(*mix.long_passages), seed + j)
        return Sample(task, ex.question, ex.answers, (join_passages(docs),))
    n_docs = rng.randint(*mix.nq_docs) if task == "nq" else mix.docs
    ex, docs = _nq_docs(train, order, i, n_docs, seed + i)
    r = rng.choice(mix.retentions) if task == "retention" else 1.0
    return Sample(task, ex.question, ex.answers, tuple(docs), r)


def val_samples(mix: Mixture, task: str, val: list[NQExample], pool: list[NQExample], n: int) -> list[Sample]:
    """The first ``n`` fixed validation examples of ``task`` (the same in every run): NQ questions ``val`` with
    distractors from ``pool`` (validation + training questions, seed 1, as :meth:`training.loop.Trainer.validation_loss`),
    key-value questions from ``KV_VAL_SEED``.

    Raises:
        ValueError: unknown task.
    """
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}")
    out: list[Sample] = []
    for i in range(n):
        if task == "kv":
            ex = kv.make_example(i, mix.kv_docs, seed=KV_VAL_SEED)
            docs, _ = kv.build_documents([ex], 0, mix.kv_docs, "random", seed=i)
            out.append(Sample(task, ex.question, mix.kv_answers(ex), tuple(docs)))
            continue
        if task == "polarity":
            ex = polarity.make_example(i, 4, seed=polarity.POLARITY_VAL_SEED)
            out.append(Sample(task, ex.question, ex.answers, ex.docs))
            continue
        if i >= len(val):
            break
        n_docs = (sum(mix.long_passages) // 2) if task == "long" else mix.docs
        try:
            docs, _ = build_documents(pool, i, n_docs, "random", seed=1)
        except TooFewDistractors:
            continue
        if task == "long":
            docs = [join_passages(docs)]
        out.append(Sample(task, val[i].question, val[i].answers, tuple(docs),
                          min(mix.retentions) if task == "retention" else 1.0))
    return out
