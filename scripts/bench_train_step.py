"""Seconds per optimiser step of ``train-links`` today and with the issue-28 speed-ups, side by side in one run.

Every variant trains the same recipe (K=5, LoRA r16 on attention + MLP, ``--accumulate`` examples of
``--docs`` NQ documents per step, seed 0) on the same examples; steps are interleaved round-robin (variant
A step j, B step j, ...) so load from other processes on a shared machine falls on every variant alike.
Documents are pre-encoded once before the steps (``training.train_model.preencode``; its cost per document
is reported: what today's loop pays inside a step whenever an example brings a passage not yet cached).
Then answer NLL on validation: the same parameters under the float32 and the bfloat16 forward, paired per
question (mean difference with a 95% bootstrap interval), and each variant's own validation NLL after its steps.

    PYTHONPATH=. KVLINK_RAG_TORCH_THREADS=1 nice -n 10 python scripts/bench_train_step.py --steps 4 --json out.json

Writes a JSON summary (``--json``) and prints one line per variant.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import tempfile
import time
from pathlib import Path

VARIANTS = {"today": {}, "fast-attention": {"fast_attention": True}, "pack": {"pack": True, "own_forward": False},
            "bf16": {"bf16": True}, "bf16+pack": {"bf16": True, "pack": True, "own_forward": False},
            "pack+own": {"pack": True}, "bf16+pack+own": {"bf16": True, "pack": True},
            "bf16+pack+own-torch-ew": {"bf16": True, "pack": True}}
"""``pack`` and ``bf16+pack`` run the packed forward through transformers' decoder; ``+own`` through
:class:`training.train_forward.TrainForward` (the default of ``--pack`` since 2026-12-06); ``-torch-ew`` that
forward with its elementwise steps in torch ops (:mod:`training.elementwise`'s kernels off: the step before
2026-12-07h)."""
TORCH_ELEMENTWISE = {"bf16+pack+own-torch-ew"}


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=4, help="timed steps per variant (after one untimed warm-up)")
    p.add_argument("--accumulate", type=int, default=4)
    p.add_argument("--docs", type=int, default=10)
    p.add_argument("--val-n", type=int, default=20)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", type=Path, default=None)
    return p.parse_args()


def _engine(device: str):
    from cli.common import doc_cache_engine, make_settings

    return doc_cache_engine(make_settings(5, None, shipped_links=False, importance_scores=False, device=device), False)


def _trainer(engine, split, a, extra: dict, root: Path, name: str | None = None):
    """A trainer on its own copy of the base model (each variant's adapter apart), sharing the document cache."""
    import dataclasses

    from cli.train import SHIPPED_TARGETS
    from training.loop import Trainer
    from training.train_config import TrainConfig

    engine = copy.copy(engine)
    engine.lm = dataclasses.replace(engine.lm, model=copy.deepcopy(engine.lm.model), adapters=set(), runner=None)
    cfg = TrainConfig(steps=10_000, accumulate=a.accumulate, docs=a.docs, targets=tuple(SHIPPED_TARGETS.split(",")),
                      **extra)
    return Trainer(engine, split, cfg, root / (name or "-".join(extra) or "today"))


def _paired_bf16(engine, trainer, split, n: int) -> dict:
    """Per-question validation NLL of ``trainer``'s (float32) parameters under the float32 forward, under
    bfloat16 GEMMs (:func:`training.train_model.bf16_gemms`) and under the own bfloat16 forward
    (:class:`training.train_forward.TrainForward`, with its elementwise kernels and with torch's ops), each
    bfloat16 one paired with float32."""
    import torch

    from evaluation.nq import build_documents
    from kvlink_rag.model.lora import adapter_scope
    from training.data import answer_ids
    from training.eval import bootstrap_ci
    from training.fast_attention import training_attention
    from training.loop import example_loss
    from training.packed import PackItem, packed_loss
    from training.train_forward import TrainForward
    from training.train_model import bf16_gemms

    out = {}
    lm, own = engine.lm, TrainForward(engine.lm, torch.bfloat16)
    questions = [(ex, build_documents(split.val + split.train, i, trainer.cfg.docs, "random", seed=1)[0])
                 for i, ex in enumerate(split.val[:n])]
    for label in ("float32", "bfloat16"):
        with torch.no_grad(), adapter_scope(lm, trainer.adapter), training_attention(lm.model, bf16=label == "bfloat16"), \
                bf16_gemms(lm.model, label == "bfloat16"):
            out[label] = [float(example_loss(engine, trainer.link_embeds, ex, docs, trainer.cfg, lm))
                          for ex, docs in questions]
    kernels = own.ext
    for label, ext in (("own-bfloat16", kernels), ("own-bfloat16-torch-ew", None)):  # torch-ew: the forward before
        own.ext = ext  # 2026-12-07h, its elementwise steps in torch ops (one copy of the weights for both)
        with torch.no_grad():
            out[label] = [float(packed_loss(lm, engine.prefix, [PackItem(
                [engine.get_or_encode(d)[0] for d in docs], engine.template.question_ids(lm.tokenizer, ex.question),
                answer_ids(engine, ex.answers[0], trainer.cfg.max_answer_tokens))], trainer.link_embeds,
                engine.anchored, own, trainer.adapter)) for ex, docs in questions]
    own.ext = kernels
    result = {label: statistics.mean(vals) for label, vals in out.items()}
    for label in ("bfloat16", "own-bfloat16", "own-bfloat16-torch-ew"):
        diffs = [b - a for a, b in zip(out["float32"], out[label])]
        result[f"paired_diff_{label}"] = statistics.mean(diffs)
        result[f"ci95_{label}"] = list(bootstrap_ci(diffs))
    result["n"] = len(questions)
    return result


def main() -> None:
    a = _args()
    import torch

    from cli.common import NQ_DEFAULT
    from kvlink_rag.model.loader import cpu_has_native_bf16
    from training.data import split_examples
    from training.train_model import preencode

    engine, split = _engine(a.device), split_examples(NQ_DEFAULT, 500, 50)
    names = [v for v in a.variants.split(",") if v]
    root = Path(tempfile.mkdtemp(prefix="bench-train-"))
    trainers = {v: _trainer(engine, split, a, VARIANTS[v], root, v) for v in names}
    for v in TORCH_ELEMENTWISE.intersection(names):
        trainers[v].train_forward().ext = None
    first = next(iter(trainers.values()))
    docs = [d for i in range((a.steps + 1) * a.accumulate) for d in first.sample(i).docs]
    t0 = time.perf_counter()
    seen, encoded = preencode(engine.warm, docs)
    encode_s = time.perf_counter() - t0
    times: dict[str, list[float]] = {v: [] for v in names}
    for j in range(a.steps + 1):
        for v, tr in trainers.items():
            t = time.perf_counter()
            tr.step()
            if j:  # the first step of each variant is a warm-up
                times[v].append(time.perf_counter() - t)
    base = statistics.median(times[names[0]])
    rows = {v: {"s_per_step_median": statistics.median(ts), "s_per_step": ts,
                "speedup_vs_" + names[0]: base / statistics.median(ts),
                "loss_curve": trainers[v].state.losses} for v, ts in times.items()}
    for v, r in rows.items():
        print(f"{v:>15}: {r['s_per_step_median']:.2f} s/step (median of {a.steps}), x{r['speedup_vs_' + names[0]]:.2f}; "
              f"losses {[round(x, 3) for x in r['loss_curve']]}", flush=True)
    result = {"torch_threads": torch.get_num_threads(), "cpu_native_bf16": cpu_has_native_bf16(),
              "accumulate": a.accumulate, "docs": a.docs, "steps": a.steps, "variants": rows,
              "preencode": {"documents": seen, "encoded": encoded, "seconds": encode_s,
                            "s_per_document": encode_s / max(1, encoded)}}
    for v, tr in trainers.items():  # each variant's parameters after its steps, the same float32 validation
        rows[v]["val_nll_after"] = tr.validation_loss(a.val_n)
        print(f"{v:>15}: validation NLL after {a.steps + 1} steps {rows[v]['val_nll_after']:.4f}", flush=True)
    if "today" in trainers:
        result["bf16_paired_val_nll"] = _paired_bf16(trainers["today"].engine, trainers["today"], split, a.val_n)
        print("paired validation NLL (today's parameters after the steps), bf16 - fp32:",
              json.dumps(result["bf16_paired_val_nll"]), flush=True)
    if a.json:
        a.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
