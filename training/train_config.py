"""A training run's settings (:class:`TrainConfig`), its progress (:class:`TrainState`), and which settings a
resumed run must share with its checkpoint."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from kvlink_rag.model.lora import DEFAULT_TARGETS

from .mixture import Mixture

TRAIN_ADAPTER = "train_links"
SPEED_FIELDS = ("fast_attention", "pack", "bf16", "own_forward")
"""Settings a run may change when it resumes (a CPU fallback resumes a bfloat16 GPU run, say)."""


@dataclass
class TrainConfig:
    """Hyper-parameters (defaults picked by the evaluation in EVALUATION.md).

    steps: optimiser steps; accumulate: examples per step; docs: documents per example;
    lr: LoRA learning rate; link_lr: link-embedding learning rate; lora: train a query-side adapter;
    slots: 1 = link tokens shared by every document slot (KVLink's choice), S = per-slot ``[S, K, hidden]``;
    rank, alpha, targets: LoRA rank, scale numerator and target projections;
    init: path of a saved artifact to start from (:mod:`training.warm_start`), "" for the initialisation;
    curriculum: ``(min, max)``: documents per training example drawn per example (seeded) in that range
    instead of ``docs`` (validation keeps ``docs``); doc_side: the adapter encodes documents too;
    mixture: train on a task mixture (:mod:`training.mixture`; None: NQ at ``docs`` / ``curriculum``);
    retention_method: which tokens the mixture's retention task keeps; link_init: ``separator`` (today's) or
    ``document`` (:mod:`training.link_init`, from 64 training passages' last hidden states).
    Speed (issue 28; none changes what is trained, only how fast and, for ``bf16``, the rounding):
    fast_attention: :mod:`training.fast_attention` (no gradient formed for the cached KV); pack: the
    ``accumulate`` examples of a step in one batched forward (:mod:`training.packed`); bf16: the frozen base
    GEMMs run in bfloat16 during training steps (everything else float32; documents are encoded by the
    float32 model as at serving, :mod:`training.train_model`); own_forward: with ``pack``, the forward runs on
    :class:`training.train_forward.TrainForward` (the runner's layout in plain torch) instead of transformers'
    decoder (default; False: transformers', the reference).
    """

    steps: int = 150
    accumulate: int = 4
    k: int = 5
    docs: int = 10
    lr: float = 3e-4
    link_lr: float = 1e-3
    lora: bool = True
    rank: int = 16
    alpha: int = 32
    targets: tuple[str, ...] = DEFAULT_TARGETS
    seed: int = 0
    checkpoint_every: int = 25
    max_answer_tokens: int = 48  # a key-value UUID (30-36 tokens) whole; longer answers lose their end token
    slots: int = 1
    init: str = ""
    curriculum: tuple[int, int] | None = None
    doc_side: bool = False
    mixture: Mixture | None = None
    retention_method: str = "importance"
    link_init: str = "separator"
    fast_attention: bool = False
    pack: bool = False
    bf16: bool = False
    own_forward: bool = True


@dataclass
class TrainState:
    """What a checkpoint holds besides tensors."""

    step: int = 0
    losses: list[float] = field(default_factory=list)
    val_losses: list[tuple[int, float]] = field(default_factory=list)
    best_step: int | None = None
    best_val: float | None = None
    seconds: float = 0.0
    val_by_task: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    best_by_task: dict[str, tuple[int, float]] = field(default_factory=dict)


def comparable(config: dict) -> dict:
    """Settings that must match to resume (steps and checkpoint cadence may change; a field added since
    the checkpoint was written takes its default, the mixture's included)."""
    full = {**asdict(TrainConfig()), **config}
    if isinstance(full.get("mixture"), dict):  # the mixture's own fields added since take their defaults too
        full["mixture"] = {**asdict(Mixture()), **full["mixture"]}
    return {k: list(v) if isinstance(v, tuple) else v for k, v in full.items()
            if k not in ("steps", "checkpoint_every", *SPEED_FIELDS)}
