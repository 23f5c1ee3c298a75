"""AdamW's step over the shipped recipe's trainable tensors (LoRA r16 on 7 projections x 30 layers), the default
(foreach) implementation against fused=True, and the gradient clipping beside it; ms per step, one process.

    python docs/bench/train-forward-2026-12-06/adamw_fused.py      # session 2026-12-06b: 19.9 -> 5.5 ms
"""
import time

import torch

shapes = []
for _ in range(30):
    for out, inn in [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]:
        shapes += [(16, inn), (out, 16)]
for fused in (False, True):
    ps = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    opt = torch.optim.AdamW([{"params": ps, "lr": 1e-3}], weight_decay=0.0, fused=fused)
    for p in ps:
        p.grad = torch.randn_like(p)
    for _ in range(3):
        opt.step()
    t0 = time.perf_counter()
    for _ in range(10):
        opt.step()
    print("fused" if fused else "default", (time.perf_counter() - t0) / 10 * 1e3, "ms")
    clip0 = time.perf_counter()
    torch.nn.utils.clip_grad_norm_(ps, 1.0)
    print("clip", (time.perf_counter() - clip0) * 1e3)
