"""The same training batches (initial parameters) under the own forward in float32, in bfloat16 with the
elementwise steps in torch ops, and in bfloat16 with the kernels: each bfloat16 one's packed loss minus float32's,
and the relative distance of its final hidden states to float32's, batch by batch (issue 28 item 2: the kernels'
rounding is no worse than the torch ops').

    PYTHONPATH=. python docs/bench/train-elementwise-2026-12-07h/batch_losses.py [BATCHES] > out/batch-losses.txt
"""
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.append("scripts")
from bench_train_step import _engine, _trainer  # noqa: E402


class A:
    accumulate, docs = 4, 10


def _run(engine, tr, forward, items):
    """(packed loss, final hidden states [T, hidden]) of ``items`` through ``forward``."""
    from training.packed import _layout, _ragged, packed_loss

    lm = engine.lm
    with torch.no_grad():
        loss = float(packed_loss(lm, engine.prefix, items, tr.link_embeds, engine.anchored, forward, tr.adapter))
        layouts = [_layout(lm, engine.prefix, it, tr.link_embeds, engine.anchored) for it in items]
        k, v, e, p, lay = _ragged(lm, engine.prefix, layouts, forward)
        return loss, forward(tr.adapter, e, p, k, v, lay)


def main() -> None:
    from cli.common import NQ_DEFAULT
    from training.data import split_examples
    from training.samples import pack_item
    from training.train_forward import TrainForward
    from training.train_model import preencode

    batches = int(sys.argv[1]) if len(sys.argv) > 1 else 12
    engine, split = _engine("cpu"), split_examples(NQ_DEFAULT, 500, 50)
    tr = _trainer(engine, split, A, {"bf16": True, "pack": True}, Path(tempfile.mkdtemp()))
    preencode(engine.warm, [d for i in range(batches * 4) for d in tr.sample(i).docs])
    forwards = {"float32": TrainForward(engine.lm, torch.float32), "bf16 torch ops": TrainForward(engine.lm, torch.bfloat16),
                "bf16 kernels": TrainForward(engine.lm, torch.bfloat16)}
    forwards["bf16 torch ops"].ext = None
    diffs = {name: ([], []) for name in forwards if name != "float32"}
    for b in range(batches):
        items = [pack_item(tr, tr.sample(4 * b + j)) for j in range(4)]
        runs = {name: _run(engine, tr, f, items) for name, f in forwards.items()}
        ref_loss, ref_h = runs["float32"]
        line = [f"batch {b}: float32 loss {ref_loss:.4f}"]
        for name, (loss, h) in runs.items():
            if name != "float32":
                rel = float((h - ref_h).norm() / ref_h.norm())
                diffs[name][0].append(loss - ref_loss)
                diffs[name][1].append(rel)
                line.append(f"{name} {loss:.4f} ({loss - ref_loss:+.4f}, hidden {rel:.5f})")
        print("  ".join(line), flush=True)
    for name, (d, rel) in diffs.items():
        print(f"{name} - float32 over {batches} batches: loss mean {statistics.mean(d):+.4f}, mean |d| "
              f"{statistics.mean(abs(x) for x in d):.4f}, max |d| {max(abs(x) for x in d):.4f}; hidden states' "
              f"relative distance {min(rel):.5f}-{max(rel):.5f}")


if __name__ == "__main__":
    main()
