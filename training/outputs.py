"""What a finished training run writes: the best-validation artifact, the last one, the loss plot and a JSON
summary (``<out>.json``: steps, validation curve, best step, seconds per step, device)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch

from .data import Split
from .loop import Trainer
from .report import plot_losses, validation_accuracy


def last_path(out: Path) -> Path:
    """Where the last step's artifact goes when the best validation step is another one: ``<stem>-last<suffix>``."""
    return out.with_name(out.stem + "-last" + out.suffix)


def _provenance(trainer: Trainer, step: int) -> dict:
    """Artifact metadata of the parameters of ``step`` (steps and examples counted from the very start)."""
    return {"steps": trainer.init_steps + step,
            "examples_seen": trainer.example_offset + step * trainer.cfg.accumulate,
            "val_loss_curve": [[trainer.init_steps + s, v] for s, v in trainer.state.val_losses]}


def summary(trainer: Trainer, out: Path, val_accuracy: float, last: Path | None) -> dict:
    """The run in numbers (see the module docstring); step numbers count from the start of this run
    (``init_steps`` more for an ``--init`` artifact's total)."""
    st = trainer.state
    steps_here = len(st.losses)
    curve = [{"step": s, "total_steps": trainer.init_steps + s, "val_nll": v} for s, v in st.val_losses]
    after = [v for s, v in st.val_losses if st.best_step is not None and s > st.best_step]
    lm = trainer.engine.lm
    return {
        "artifact": str(out), "last_artifact": str(last) if last else str(out),
        "steps": st.step, "steps_asked": trainer.cfg.steps, "init": trainer.cfg.init or None,
        "init_steps": trainer.init_steps,
        "examples_seen": trainer.example_offset + st.step * trainer.cfg.accumulate,
        "val_curve": curve, "best_step": st.best_step, "best_val_nll": st.best_val,
        "improving_at_end": st.best_step == st.step if st.best_step is not None else None,
        "val_after_best": after, "val_accuracy_best": val_accuracy, "val_n": len(trainer.split.val),
        "train_loss_last10": sum(st.losses[-10:]) / max(1, len(st.losses[-10:])) if st.losses else None,
        "seconds_per_step": st.seconds / steps_here if steps_here else None,
        "device": str(lm.device), "gpu": torch.cuda.get_device_name(lm.device) if lm.device.type == "cuda" else None,
        "compute_dtype": str(lm.dtype), "config": json.loads(json.dumps(asdict(trainer.cfg))),
    }


def save_outputs(trainer: Trainer, split: Split, out: Path, metadata: dict) -> dict:
    """Save the artifact of the best validation step as ``out`` (the last step's as :func:`last_path` when it
    differs), its validation accuracy (greedy answers on the whole validation split), ``<out>.png`` and
    ``<out>.json``; returns the summary.

    Without any validation measured (``val_every`` 0) the last step is the artifact.
    """
    st, last = trainer.state, None
    if st.best_step is not None and st.best_step != st.step:
        last = last_path(out)
        trainer.artifact({**metadata, **_provenance(trainer, st.step), "best_step": False}).save(last)
        trainer.use_best()
    step = st.best_step if st.best_step is not None else st.step
    acc = validation_accuracy(trainer.engine, trainer, split)
    trainer.artifact({**metadata, **_provenance(trainer, step), "val_accuracy": acc, "val_n": len(split.val),
                      "best_step": st.best_step is not None}).save(out)
    plot_losses(st, out.with_suffix(".png"))
    result = summary(trainer, out, acc, last)
    if trainer.mixture is not None:
        result.update(_task_artifacts(trainer, out, metadata))
    out.with_suffix(".json").write_text(json.dumps(result, indent=2))
    return result


def task_path(out: Path, task: str) -> Path:
    """Where the best validation step of one task goes: ``<stem>-best-<task><suffix>``."""
    return out.with_name(f"{out.stem}-best-{task}{out.suffix}")


def _task_artifacts(trainer: Trainer, out: Path, metadata: dict) -> dict:
    """Save each task's best-validation artifact (:func:`task_path`); returns the summary's per-task part
    (curves, best steps, paths and the rule that picked ``out``). The trainer's parameters are left as they were."""
    from .samples import ARTIFACT_RULE

    st = trainer.state
    keep = [p.detach().cpu().clone() for p in trainer.params]
    paths = {}
    for task, params in trainer.best_by_task.items():
        with torch.no_grad():
            for p, saved in zip(trainer.params, params):
                p.copy_(saved)
        step = st.best_by_task[task][0]
        paths[task] = str(task_path(out, task))
        trainer.artifact({**metadata, **_provenance(trainer, step), "best_for_task": task}).save(task_path(out, task))
    with torch.no_grad():
        for p, saved in zip(trainer.params, keep):
            p.copy_(saved)
    return {"tasks": trainer.mixture.tasks, "val_by_task": st.val_by_task, "best_by_task": st.best_by_task,
            "task_artifacts": paths, "artifact_rule": ARTIFACT_RULE}
