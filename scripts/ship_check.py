"""Whether a trained artifact replaces the shipped default: the rule of :mod:`training.ship_rule` (validation per
task, the contrast check, the newcomer case), its inputs measured here, the verdict as JSON on stdout.

    KVLINK_RAG_NQ_PATH=... .venv/bin/python scripts/ship_check.py CANDIDATE.safetensors [--out DIR]

Validation NLL: the recipe's fixed validation examples (20 a task, whole answers) under each artifact, documents
from the store under KVLINK_RAG_HOME (the training run's pre-encoded ones are reused). Contrast check:
``kvlink-rag eval --task contrast --docs 2 --gold-position first,last`` (all 48 cases) with each artifact (rows in --out).
One torch thread by default (KVLINK_RAG_TORCH_THREADS); ~5 min on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SHIPPED = "kvlink_rag/assets/smollm2-135m-instruct-links-qlora.safetensors"
MIXTURE = "nq=1,kv=0.5,long=0.5,retention=0.5,polarity=0.5"


def task_nll(artifact: str, split, mix) -> dict[str, float]:
    """Mean answer NLL (nats/token) per task of the first 20 validation examples under ``artifact``."""
    from cli.common import doc_cache_engine, make_settings
    from cli.train import SHIPPED_TARGETS
    from training.loop import Trainer
    from training.samples import task_losses
    from training.train_config import TrainConfig

    engine = doc_cache_engine(make_settings(5, None, shipped_links=False, importance_scores=True), True)
    cfg = TrainConfig(steps=1, accumulate=8, k=5, lora=True, rank=16, alpha=32,
                      targets=tuple(SHIPPED_TARGETS.split(",")), init=artifact, mixture=mix, pack=True, bf16=True)
    with tempfile.TemporaryDirectory() as tmp:
        tr = Trainer(engine, split, cfg, Path(tmp))
        return {t: sum(v) / len(v) for t in mix.tasks for v in [task_losses(tr, t, 20)]}


def contrast_scores(artifact: str, tag: str, out: Path) -> list[tuple[int, str, float]]:
    """``(case, gold position, 0/1)`` of each contrast prompt answered linked with ``artifact``."""
    from evaluation.contrast import CASES

    summary = out / f"contrast-{tag}.json"
    cmd = [sys.executable, "-m", "cli", "eval", "--task", "contrast", "--n", str(len(CASES)), "--docs", "2",
           "--gold-position", "first,last", "--modes", "linked-query-lora", "--adapter", artifact, "--tag", tag,
           "--json", str(summary)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    rows = [json.loads(line) for line in summary.with_suffix(".rows.jsonl").read_text().splitlines()]
    return sorted((r["index"], r["gold_position"], float(r["em"])) for r in rows)


def trained_kv_answer(candidate: Path) -> str:
    """The kv target ``candidate`` was trained on: ``config.mixture.kv_answer`` of the ``<candidate>.json``
    train-links wrote beside it, or 'value' (the default then and before the option) where there is none."""
    try:
        mixture = json.loads(candidate.with_suffix(".json").read_text())["config"]["mixture"]
    except (OSError, ValueError, KeyError, TypeError):
        return "value"
    return (mixture or {}).get("kv_answer", "value")  # None: trained on NQ alone


def main() -> None:
    from cli.train_options import parse_mixture
    from training.data import split_examples
    from training.ship_rule import verdict

    ap = argparse.ArgumentParser(description="Whether CANDIDATE replaces the shipped artifact (training/ship_rule.py)"
                                 "; the verdict as JSON on stdout.")
    ap.add_argument("candidate", help="the trained artifact (link tokens + query-side LoRA, .safetensors)")
    ap.add_argument("--shipped", default=SHIPPED, help="the artifact it would replace (default: the shipped one)")
    ap.add_argument("--mixture", default=MIXTURE, help="the tasks validated, as train-links --mixture")
    ap.add_argument("--kv-answer", default=None, help="the kv validation target, as train-links --mix-kv-answer "
                    "(value or sentence; default: the candidate's own, read from the <candidate>.json beside it, "
                    "else value)")
    ap.add_argument("--out", type=Path, default=None, help="folder for the contrast check's rows (default: a new "
                    "temporary folder)")
    a = ap.parse_args()
    a.out = a.out or Path(tempfile.mkdtemp(prefix="ship-check-"))
    a.out.mkdir(parents=True, exist_ok=True)
    mix = parse_mixture(a.mixture, "5-20", 10, 256, "5-15", "0.4,0.6,0.8", 10, a.kv_answer or trained_kv_answer(
        Path(a.candidate)))
    split = split_examples(Path(os.environ["KVLINK_RAG_NQ_PATH"]), 500, 50)
    nll = {"shipped": task_nll(a.shipped, split, mix), "candidate": task_nll(a.candidate, split, mix)}
    scores = {"shipped": contrast_scores(a.shipped, "shipped", a.out),
              "candidate": contrast_scores(a.candidate, "candidate", a.out)}
    newcomer = all(em == 1.0 for i, _, em in scores["candidate"] if i == 0)
    v = verdict(nll["shipped"], nll["candidate"], [s for *_, s in scores["shipped"]],
                [s for *_, s in scores["candidate"]], newcomer)
    print(json.dumps(report(a.shipped, a.candidate, nll, scores, v), indent=1))


def report(shipped: str, candidate: str, nll: dict, scores: dict, v) -> dict:
    """The verdict's JSON: the artifacts, the inputs (validation NLL per task, per-prompt contrast scores as
    ``contrast_scores``) and the :class:`~training.ship_rule.Verdict`'s fields (its ``contrast`` is the two counts;
    until 2026-12-07d it overwrote the per-prompt scores under the same key)."""
    return {"shipped": shipped, "candidate": candidate, "validation_nll": nll, "contrast_scores": scores,
            **dataclasses.asdict(v)}


if __name__ == "__main__":
    main()
