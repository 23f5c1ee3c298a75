"""Training reports: validation accuracy of a trained artifact and the loss-curve plot."""

from __future__ import annotations

import copy
from pathlib import Path

from evaluation.nq import best_subspan_em, build_documents
from kvlink_rag.engine import Engine
from kvlink_rag.reuse.doc_side import document_adapter

from .data import Split
from .loop import Trainer


def validation_accuracy(engine: Engine, trainer: Trainer, split: Split, max_new_tokens: int = 24) -> float:
    """best_subspan_em of greedy linked answers on the held-out split with the trained tensors (a document-side
    run's documents encoded with its adapter, under their own fingerprint)."""
    eng = copy.copy(engine)  # shares model and cache; the engine itself is left as it was
    eng.link_tokens, eng.adapter = trainer.artifact({}), trainer.adapter
    eng.doc_adapter, eng.fingerprint = document_adapter(eng)
    hits = 0.0
    for i, ex in enumerate(split.val):
        docs, _ = build_documents(split.val + split.train, i, trainer.cfg.docs, "random", seed=1)
        answer = eng.answer(ex.question, docs, max_new_tokens=max_new_tokens)  # scopes eng.adapter
        hits += best_subspan_em(answer.text, ex.answers)
    return hits / len(split.val)


def plot_losses(state, path: Path) -> None:
    """PNG of the training loss per step (and validation loss points)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(range(1, len(state.losses) + 1), state.losses, lw=0.8, label="train")
    if state.val_losses:
        xs, ys = zip(*state.val_losses)
        ax.plot(xs, ys, "o-", label="validation")
    ax.set_xlabel("step")
    ax.set_ylabel("answer NLL (nats/token)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
