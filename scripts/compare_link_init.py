"""Link-token initialisation side by side (issue 28 item 3): today's separator init against the document init
(:mod:`training.link_init`) at equal steps, on validation answer NLL.

Both runs train the shipped recipe (K=5, LoRA r16 on attention + MLP) on the same examples from the same seed,
interleaved step by step in one process (each on its own copy of the base model, documents encoded once and
shared); validation answer NLL on the same held-out questions at the start, every ``--val-every`` steps and at
the end.

    PYTHONPATH=. KVLINK_RAG_TORCH_THREADS=1 nice -n 10 python scripts/compare_link_init.py --steps 30 --json out.json
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import tempfile
import time
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--accumulate", type=int, default=2)
    p.add_argument("--val-every", type=int, default=10)
    p.add_argument("--val-n", type=int, default=20)
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args()
    from cli.common import NQ_DEFAULT, doc_cache_engine, make_settings
    from cli.train import SHIPPED_TARGETS
    from training.data import split_examples
    from training.loop import Trainer
    from training.train_config import TrainConfig
    from training.samples import run_documents
    from training.train_model import preencode

    base = doc_cache_engine(make_settings(5, None, shipped_links=False, importance_scores=False), False)
    split, root = split_examples(NQ_DEFAULT, 500, 50), Path(tempfile.mkdtemp(prefix="link-init-"))
    trainers = {}
    for init in ("separator", "document"):
        eng = copy.copy(base)
        eng.lm = dataclasses.replace(base.lm, model=copy.deepcopy(base.lm.model), adapters=set(), runner=None)
        cfg = TrainConfig(steps=a.steps, accumulate=a.accumulate, targets=tuple(SHIPPED_TARGETS.split(",")),
                          fast_attention=True, link_init=init, checkpoint_every=10_000)
        trainers[init] = Trainer(eng, split, cfg, root / init)
    t0 = time.perf_counter()
    seen, encoded = preencode(base.warm, run_documents(trainers["separator"]))
    print(f"pre-encoded {encoded} documents in {time.perf_counter() - t0:.0f} s", flush=True)
    for tr in trainers.values():
        tr.validate(a.val_n)
    while trainers["separator"].state.step < a.steps:
        for name, tr in trainers.items():
            tr.step()
            if tr.state.step % a.val_every == 0 or tr.state.step == a.steps:
                tr.validate(a.val_n)
                print(f"{name:>9} step {tr.state.step}: val NLL {tr.state.val_losses[-1][1]:.3f}", flush=True)
    result = {name: {"val_curve": tr.state.val_losses, "train_losses": tr.state.losses,
                     "s_per_step": tr.state.seconds / max(1, tr.state.step)} for name, tr in trainers.items()}
    result["config"] = {"steps": a.steps, "accumulate": a.accumulate, "val_n": a.val_n, "documents_encoded": encoded}
    if a.json:
        a.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
