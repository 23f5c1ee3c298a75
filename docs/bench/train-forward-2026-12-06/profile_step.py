"""Where one packed bfloat16 training step's time goes (torch profiler, self CPU time by op).

    PYTHONPATH=. python docs/bench/train-forward-2026-12-06/profile_step.py [variant-json]
"""
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, "scripts")
from bench_train_step import _engine, _trainer  # noqa: E402


class A:
    accumulate, docs = 4, 10


def main() -> None:
    from cli.common import NQ_DEFAULT
    from training.data import split_examples
    from training.train_model import preencode

    extra = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {"bf16": True, "pack": True}
    engine, split = _engine("cpu"), split_examples(NQ_DEFAULT, 500, 50)
    tr = _trainer(engine, split, A, extra, Path(tempfile.mkdtemp()))
    preencode(engine.warm, [d for i in range(12) for d in tr.sample(i).docs])
    tr.step()
    with torch.profiler.profile(record_shapes=True) as prof:
        tr.step()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=45))
    print(prof.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=40))


if __name__ == "__main__":
    main()
