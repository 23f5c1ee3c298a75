"""From a training or validation :class:`training.mixture.Sample` to the linker's inputs, and per-task
validation bookkeeping (issue 28).

Per task, the validation answer NLL (nats/token) of the first ``n`` fixed validation examples is recorded every
validation (``state.val_by_task``) with the parameters of its best step (``best_by_task``). The overall score a
step is ranked by - the rule that picks the shipped artifact, on validation questions only, never evaluation
ones - is the mean over the trained tasks of ``val_nll(task, step) / val_nll(task, first validation)``: each
task counts equally whatever its NLL scale (a UUID's tokens are not an NQ answer's); the lowest score wins,
the earlier step on a tie.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

import torch

from evaluation.nq import NQExample
from kvlink_rag.model.lora import adapter_scope
from kvlink_rag.types import Document, LayeredDocuments

from .data import answer_ids
from .mixture import Sample, train_sample, val_samples
from .packed import PackItem, packed_loss

if TYPE_CHECKING:
    from kvlink_rag.engine import Engine
    from kvlink_rag.model.loader import LoadedModel

    from .data import Split
    from .mixture import Mixture


class Trainer(Protocol):
    """What these helpers read of a run (``training.loop.Trainer``; a protocol, so that the loop's helpers do
    not import the loop): its config (``seed``, ``accumulate``, ...), state (``step``, ...), engine and model,
    examples and mixture, link embeddings, trainable parameters and the best parameters per task."""

    cfg: Any
    state: Any
    engine: Engine
    lm: LoadedModel
    split: Split
    mixture: Mixture | None
    order: list[int]
    example_offset: int
    link_embeds: torch.Tensor
    adapter: str | None
    params: list[torch.Tensor]
    best_by_task: dict[str, list[torch.Tensor]]

    def example(self, i: int) -> tuple[NQExample, list]: ...

    def sample(self, i: int) -> Sample: ...

ARTIFACT_RULE = ("the artifact is the validation step with the lowest mean over the trained tasks of "
                 "val_nll(task, step) / val_nll(task, first validation) (validation questions only, never "
                 "evaluation ones; the earlier step on a tie); each task's own best step is saved beside it")


def sample_of(sample: Sample) -> NQExample:
    """The sample as the :class:`evaluation.nq.NQExample` :func:`training.loop.example_loss` takes."""
    return NQExample(sample.question, sample.answers, sample.docs[0])


def train_sample_at(trainer: Trainer, i: int) -> Sample:
    """Training example ``i``: the mixture's (:func:`training.mixture.train_sample`), or without a mixture
    :meth:`Trainer.example`'s NQ example as an ``nq`` sample."""
    if trainer.mixture is not None:
        return train_sample(trainer.mixture, trainer.split.train, trainer.order, trainer.cfg.seed, i)
    ex, docs = trainer.example(i)
    return Sample("nq", ex.question, ex.answers, tuple(docs))


def slots(trainer: Trainer, sample: Sample) -> list:
    """The sample's document slots: a ``long`` sample's document as the store chunks it (``chunk_tokens`` of
    the engine's settings; link tokens after each chunk not joined to the next, ``chunk_links``), else its documents."""
    if sample.task == "long":
        return trainer.engine.expand(list(sample.docs))
    return list(sample.docs)


def pack_item(trainer: Trainer, sample: Sample) -> PackItem:
    """:class:`training.packed.PackItem` of ``sample``: document caches from the engine (cached, else encoded
    now by the frozen base model), at the sample's retention (``cfg.retention_method``) when below 1."""
    eng = trainer.engine
    docs_in = slots(trainer, sample)
    kvs = [eng.get_or_encode(d)[0] for d in docs_in]
    docs = LayeredDocuments.from_documents(kvs, sample.retention, trainer.cfg.retention_method) \
        if sample.retention < 1.0 else kvs
    return PackItem(docs, eng.template.question_ids(eng.lm.tokenizer, sample.question),
                    answer_ids(eng, sample.answers[0], trainer.cfg.max_answer_tokens), eng.joins(docs_in))


@torch.no_grad()
def task_losses(trainer: Trainer, task: str, n: int) -> list[float]:
    """Answer NLL (nats/token) of each of ``task``'s first ``n`` validation examples, current parameters."""
    mix = trainer.mixture
    samples = val_samples(mix, task, trainer.split.val, trainer.split.val + trainer.split.train, n)
    with adapter_scope(trainer.lm, trainer.adapter):
        return [float(packed_loss(trainer.lm, trainer.engine.prefix, [pack_item(trainer, s)], trainer.link_embeds,
                                  trainer.engine.anchored)) for s in samples]


def overall_score(val_by_task: dict[str, list[tuple[int, float]]], step: int) -> float:
    """The shipped-artifact rule (module docstring): mean over tasks of the task's NLL at ``step`` relative to
    its first recorded validation. Raises KeyError: a task without a value at ``step``."""
    ratios = []
    for task, curve in val_by_task.items():
        at = dict(curve)
        ratios.append(at[step] / curve[0][1] if curve[0][1] > 0 else at[step])
    return sum(ratios) / len(ratios)


def validate_tasks(trainer: Trainer, n: int) -> float:
    """Record each task's validation NLL at the current step (best per task kept with its parameters) and
    return the overall score of :func:`overall_score`."""
    st, step = trainer.state, trainer.state.step
    n = min(n, len(trainer.split.val))  # generated kv questions too: every task validates on as many
    for task in trainer.mixture.tasks:
        losses = task_losses(trainer, task, n)
        val = sum(losses) / max(1, len(losses))
        st.val_by_task.setdefault(task, []).append((step, val))
        best = st.best_by_task.get(task)
        if best is None or val < best[1]:
            st.best_by_task[task] = (step, val)
            trainer.best_by_task[task] = [p.detach().cpu().clone() for p in trainer.params]
    return overall_score(st.val_by_task, step)


def run_documents(trainer: Trainer, val_n: int = 20) -> Iterator[Document]:
    """Every document slot the run's remaining steps and its validation (first ``val_n`` per task) will link,
    in order of first use (repeats included; :func:`training.train_model.preencode` skips them)."""
    first = trainer.example_offset + trainer.state.step * trainer.cfg.accumulate
    last = trainer.example_offset + trainer.cfg.steps * trainer.cfg.accumulate
    for i in range(first, last):
        yield from slots(trainer, trainer.sample(i))
    if trainer.mixture is not None:
        val_n = min(val_n, len(trainer.split.val))  # as validate_tasks
        for task in trainer.mixture.tasks:
            for s in val_samples(trainer.mixture, task, trainer.split.val, trainer.split.val + trainer.split.train,
                                 val_n):
                yield from slots(trainer, s)
