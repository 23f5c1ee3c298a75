"""One packed bfloat16 training step under the torch profiler (self CPU time by op), with the elementwise kernels
(``kernels``) or with torch's ops (``torch-ops``: the step before 2026-12-07h); the shipped recipe, 4 examples of
10 NQ documents, as docs/bench/train-forward-2026-12-06/profile_step.py.

    PYTHONPATH=. python docs/bench/train-elementwise-2026-12-07h/step_profile.py kernels|torch-ops > out/profile-X.txt
"""
import sys
import tempfile
from pathlib import Path

import torch

sys.path.append("scripts")
from bench_train_step import _engine, _trainer  # noqa: E402


class A:
    accumulate, docs = 4, 10


def main() -> None:
    from cli.common import NQ_DEFAULT
    from training.data import split_examples
    from training.train_model import preencode

    engine, split = _engine("cpu"), split_examples(NQ_DEFAULT, 500, 50)
    tr = _trainer(engine, split, A, {"bf16": True, "pack": True}, Path(tempfile.mkdtemp()))
    if sys.argv[1] == "torch-ops":
        tr.train_forward().ext = None
    preencode(engine.warm, [d for i in range(12) for d in tr.sample(i).docs])
    tr.step()
    with torch.profiler.profile() as prof:
        tr.step()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


if __name__ == "__main__":
    main()
