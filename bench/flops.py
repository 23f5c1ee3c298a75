"""The compute floor of a linked query on this machine: its FLOPs (link-token and question prefill over
the documents' KV, then decode) against the measured matrix-multiply rate at the same thread count."""

from __future__ import annotations

import time

import torch

from kvlink_rag.engine import Engine


def gemm_gflops(dtype: torch.dtype = torch.float32, m: int = 1024, k: int = 576, n: int = 1536, repeats: int = 20) -> float:
    """Measured ``[m, k] @ [k, n]`` rate (GFLOP/s) in ``dtype`` at torch's current thread count."""
    a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
    for _ in range(3):
        a @ b
    t0 = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return 2 * m * k * n * repeats / (time.perf_counter() - t0) / 1e9


def query_flops(engine: Engine, prefill_tokens: int, new_tokens: int, context_tokens: int) -> dict:
    """FLOPs of one linked query (``2 * params`` per token through the linear layers, attention ``4 * heads *
    head_dim`` per query-key pair per layer; the LM head only for the last prefill token and each decode).

    Args:
        prefill_tokens: link tokens plus question tokens computed.
        new_tokens: generated tokens (decode steps).
        context_tokens: keys each query attends to (about the prompt length).
    Returns:
        ``{prefill_gflop, decode_gflop, total_gflop}``.
    """
    cfg = engine.lm.config
    emb = cfg.vocab_size * cfg.hidden_size
    linear = sum(p.numel() for p in engine.lm.decoder.parameters()) - emb  # embeddings are a lookup
    attn_per_pair = 4 * cfg.num_attention_heads * engine.lm.head_dim * cfg.num_hidden_layers
    prefill = 2 * linear * prefill_tokens + attn_per_pair * prefill_tokens * context_tokens + 2 * emb
    decode = new_tokens * (2 * linear + 2 * emb + attn_per_pair * (context_tokens + new_tokens // 2))
    return {"prefill_gflop": prefill / 1e9, "decode_gflop": decode / 1e9, "total_gflop": (prefill + decode) / 1e9}


def compute_floor(engine: Engine, prefill_tokens: int, new_tokens: int, context_tokens: int, batch: int) -> dict:
    """Best possible throughput of ``batch`` concurrent queries if every FLOP ran at the measured GEMM rate
    (requests/s), in the compute dtype and, for comparison, in bfloat16."""
    f = query_flops(engine, prefill_tokens, new_tokens, context_tokens)
    rate = gemm_gflops(engine.lm.dtype)
    bf16 = gemm_gflops(torch.bfloat16)
    return {**f, "batch": batch, "gemm_gflops": rate, "gemm_gflops_bf16": bf16, "threads": torch.get_num_threads(),
            "floor_rps": rate / f["total_gflop"], "floor_rps_bf16": bf16 / f["total_gflop"]}
