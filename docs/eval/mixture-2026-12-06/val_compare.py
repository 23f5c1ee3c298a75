"""The shipping rule between two artifacts, on validation only: each task's answer NLL (the recipe's validation
examples, 20 a task, the whole answer as target) under the shipped artifact and under the mixture artifact, and
the rule's score, mean over tasks of NLL(candidate) / NLL(shipped) (below 1: the candidate ships).

    KVLINK_RAG_HOME=<the run's home> KVLINK_RAG_NQ_PATH=... python docs/eval/mixture-2026-12-06/val_compare.py \
        SHIPPED.safetensors CANDIDATE.safetensors > val_compare.json
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from cli.common import doc_cache_engine, make_settings
from cli.train import SHIPPED_TARGETS
from cli.train_options import parse_mixture
from training.data import split_examples
from training.loop import Trainer
from training.samples import task_losses
from training.train_config import TrainConfig


def task_nll(artifact: str, split, mix) -> dict[str, float]:
    engine = doc_cache_engine(make_settings(5, None, shipped_links=False, importance_scores=True), True)  # store
    cfg = TrainConfig(steps=1, accumulate=8, k=5, lora=True, rank=16, alpha=32, targets=tuple(SHIPPED_TARGETS.split(",")),
                      init=artifact, mixture=mix, pack=True, bf16=True)
    with tempfile.TemporaryDirectory() as tmp:
        tr = Trainer(engine, split, cfg, Path(tmp))
        out = {t: sum(v) / len(v) for t in mix.tasks for v in [task_losses(tr, t, 20)]}
    return out


def main() -> None:
    shipped, candidate = sys.argv[1], sys.argv[2]
    mix = parse_mixture("nq=1,kv=0.5,long=0.5,retention=0.5", "5-20", 10, 256, "5-15", "0.4,0.6,0.8", 10)
    split = split_examples(Path(os.environ["KVLINK_RAG_NQ_PATH"]), 500, 50)
    a, b = task_nll(shipped, split, mix), task_nll(candidate, split, mix)
    ratios = {t: b[t] / a[t] for t in a}
    print(json.dumps({"shipped": {"artifact": shipped, "nll": a}, "candidate": {"artifact": candidate, "nll": b},
                      "ratio": ratios, "rule_score": sum(ratios.values()) / len(ratios),
                      "rule": "the candidate ships when the mean over tasks of NLL(candidate) / NLL(shipped) < 1"},
                     indent=1))


if __name__ == "__main__":
    main()
