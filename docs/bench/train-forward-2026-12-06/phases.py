"""Wall time of a packed bfloat16 step's phases (layouts and padding, forward, loss, backward, optimiser), one
process, medians of 5 steps after a warm-up: where the remaining time of ``--pack --bf16`` goes.

    PYTHONPATH=. python docs/bench/train-forward-2026-12-06/phases.py ['{"own_forward": false}']
"""
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, "scripts")
from bench_train_step import _engine, _trainer  # noqa: E402


class A:
    accumulate, docs = 4, 10


def main() -> None:
    from cli.common import NQ_DEFAULT
    from kvlink_rag.model.lora import adapter_scope
    from training import packed
    from training.data import split_examples
    from training.fast_attention import training_attention
    from training.samples import pack_item
    from training.train_model import bf16_gemms, preencode

    extra = {"bf16": True, "pack": True, **(json.loads(sys.argv[1]) if len(sys.argv) > 1 else {})}
    engine, split = _engine("cpu"), split_examples(NQ_DEFAULT, 500, 50)
    tr = _trainer(engine, split, A, extra, Path(tempfile.mkdtemp()))
    preencode(engine.warm, [d for i in range(24) for d in tr.sample(i).docs])
    times: dict[str, list[float]] = {}
    for step in range(6):
        t = [time.perf_counter()]
        samples = [tr.sample(step * 4 + j) for j in range(4)]
        items = [pack_item(tr, s) for s in samples]
        t.append(time.perf_counter())
        with adapter_scope(tr.lm, tr.adapter), training_attention(tr.lm.model, True, True), bf16_gemms(tr.lm.model):
            loss = packed.packed_loss(tr.lm, engine.prefix, items, tr.link_embeds, engine.anchored,
                                      tr.train_forward(), tr.adapter)
            t.append(time.perf_counter())
            loss.backward()
            t.append(time.perf_counter())
        tr.opt.step()
        tr.opt.zero_grad(set_to_none=True)
        t.append(time.perf_counter())
        if step:
            for name, a, b in zip(("samples", "forward+loss", "backward", "optimiser"), t, t[1:]):
                times.setdefault(name, []).append(b - a)
    for name, ts in times.items():
        print(f"{name:>14}: {statistics.median(ts) * 1e3:7.1f} ms")


if __name__ == "__main__":
    main()
