"""How much of a 16-row decode step's attention a shared prefix could save (cascade attention: Hydragen, FlashInfer's
cascade kernels, SGLang): 16 rows that share one chunk of S keys (the dialogues' documents and system prompt) each
read it by the decode kernel today (attend_decode per row, the C++ kernel: one pass over its pieces); shared, the
rows' 16 x 3 query heads of each KV head meet the chunk once as two bfloat16 GEMMs around a float32 softmax, which
also gives the log-sum-exp a merge with each row's own keys would need. One torch thread; ms per layer for the
shared chunk only. Usage (repository root): .venv/bin/python docs/bench/cascade-decode-2026-12-08/shared_chunk.py"""
import time

import torch

from kvlink_rag.runtime.decode_attention import attend_decode

torch.set_num_threads(1)
torch.manual_seed(0)
ROWS, H, KVH, D = 16, 9, 3, 64
SCALE = D ** -0.5


def per_row(qs, k, v):
    return [attend_decode(q, [(k, v)], None, SCALE) for q in qs]


def shared(qs, k, v):
    q = torch.stack(qs).view(ROWS, KVH, H // KVH, D).transpose(0, 1).reshape(KVH, ROWS * H // KVH, D)
    s = torch.bmm(q, k.transpose(1, 2)).float() * SCALE  # [KVH, rows * group, S]
    lse = torch.logsumexp(s, -1, keepdim=True)
    o = torch.bmm((s - lse).exp().to(v.dtype), v)  # [KVH, rows * group, D]
    return o, lse


def ms(f, *a):
    for _ in range(3):
        f(*a)
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < 0.5:
        f(*a)
        n += 1
    return 1e3 * (time.perf_counter() - t0) / n


for keys in (400, 800, 1600):
    k = torch.randn(KVH, keys, D).bfloat16()
    v = torch.randn(KVH, keys, D).bfloat16()
    qs = [torch.randn(H, 1, D).bfloat16() for _ in range(ROWS)]
    ref = torch.stack([o[:, 0] for o in per_row(qs, k, v)])  # [rows, H, D]
    o, _ = shared(qs, k, v)
    got = o.view(KVH, ROWS, H // KVH, D).transpose(0, 1).reshape(ROWS, H, D)
    err = (got.float() - ref.float()).abs().max().item()
    a, b = ms(per_row, qs, k, v), ms(shared, qs, k, v)
    print(f"shared chunk of {keys} keys, 16 rows: per row {a:.3f} ms, shared GEMMs {b:.3f} ms ({a / b:.1f}x), "
          f"max |diff| {err:.4f}")
