"""The model runner against transformers' eager forward and llama.cpp: prefill and decode, side by side.

Every row runs in this one process on the same model, thread count and machine state: prefill of
``context`` tokens (one row), decode of ``new`` tokens from an almost empty context (llama-bench's ``tg``)
and after the ``context``-token prefill (what a linked answer decodes after). llama.cpp's ``llama-bench`` on
the same GGUF the default model is converted from joins when its binary is found (:mod:`bench.llama_cpp`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from transformers import DynamicCache

from kvlink_rag.model.loader import LoadedModel, kv_dtype_of
from kvlink_rag.runtime.model_runner import ModelRunner
from kvlink_rag.runtime.ragged import RaggedBatch, SequenceKV

Step = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (ids [n], positions [n]) -> logits [vocab]


def _runner_session(lm: LoadedModel, fmt: str, capacity: int) -> Step:
    runner = ModelRunner(lm.model, fmt)
    cfg = lm.config
    seq = SequenceKV([], lm.num_layers, cfg.num_key_value_heads, lm.head_dim, kv_dtype_of(fmt, lm.dtype), lm.device,
                     capacity)

    def step(ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        batch = RaggedBatch()
        batch.add(seq, int(ids.numel()))
        return runner.forward(batch, lm.embed_tokens(ids), pos)[0]
    return step


def _transformers_session(lm: LoadedModel) -> Step:
    cache = DynamicCache()

    def step(ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        out = lm.model(input_ids=ids[None], position_ids=pos[None], cache=cache, use_cache=True, logits_to_keep=1)
        return out.logits[0, -1]
    return step


def _clock(device: torch.device) -> float:
    """Seconds, after the device's queued kernels have finished (CUDA launches return before they run)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


@torch.inference_mode()
def _measure(make: Callable[[], Step], context: int, new: int, vocab: int, device: torch.device) -> dict:
    """Seconds of a ``context``-token prefill and ``new`` decode steps after it, and of ``new`` decode steps
    after a 1-token prompt, each in a fresh session (tokens per second); ids and positions on ``device``."""
    ids = torch.randint(3, min(20000, vocab), (context,), generator=torch.Generator().manual_seed(0)).to(device)
    rows = {}
    for label, prompt in (("empty", ids[:1]), ("context", ids)):
        step = make()
        t0 = _clock(device)
        logits = step(prompt, torch.arange(len(prompt), device=device))
        prefill_s = _clock(device) - t0
        t0 = _clock(device)
        for j in range(new):
            tok = torch.argmax(logits).reshape(1)
            logits = step(tok, torch.tensor([len(prompt) + j], device=device))
        decode_s = _clock(device) - t0
        rows[label] = (prefill_s, decode_s)
    return {"prefill_tok_s": context / rows["context"][0], "decode_tok_s": new / rows["empty"][1],
            "decode_after_context_tok_s": new / rows["context"][1]}


def engine_rows(lm: LoadedModel, formats: list[str], context: int = 1300, new: int = 24, repeats: int = 2,
                log=print) -> list[dict]:
    """One row per engine: ``transformers`` (eager, the engine before the runner) and the runner in each
    weight format; the best of ``repeats`` runs of each (a shared machine only ever slows a run down)."""
    makers: list[tuple[str, Callable[[], Step]]] = [("transformers eager", lambda: _transformers_session(lm))]
    for fmt in formats:
        makers.append((f"runner {fmt}", lambda f=fmt: _runner_session(lm, f, context + new + 2)))
    out = []
    for name, make in makers:
        log(f"engine: {name}")
        runs = [_measure(make, context, new, int(lm.config.vocab_size), lm.device) for _ in range(repeats)]
        out.append({"engine": name, **{k: max(r[k] for r in runs) for k in runs[0]}})
    return out


def markdown(rows: list[dict], peer: dict | None, context: int, new: int, threads: int) -> str:
    """The table, with llama.cpp's row (or why it is missing) and each engine's decode ratio to it."""
    ref = peer["decode_tok_s"] if peer and "decode_tok_s" in peer else None
    lines = [f"## Engine: prefill {context} tokens, decode {new} (tokens/s, {threads} thread(s), best of runs)", "",
             "| engine | prefill | decode (empty context) | decode after the prefill | decode vs llama.cpp |",
             "|---|---|---|---|---|"]
    for r in rows:
        ratio = f"{r['decode_tok_s'] / ref:.2f}x" if ref else "-"
        lines.append(f"| {r['engine']} | {r['prefill_tok_s']:.0f} | {r['decode_tok_s']:.1f} | "
                     f"{r['decode_after_context_tok_s']:.1f} | {ratio} |")
    if peer and "decode_tok_s" in peer:
        lines.append(f"| llama.cpp llama-bench ({peer['model']}) | {peer['prefill_tok_s']:.0f} | {peer['decode_tok_s']:.1f} "
                     f"| - | 1.00x |")
    elif peer:
        lines.append(f"\nllama.cpp: skipped ({peer['skipped']})")
    return "\n".join(lines) + "\n"
