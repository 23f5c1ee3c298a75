"""float32 against bfloat16 GEMM on this CPU (torch's CPU linear, oneDNN), two threads: a prefill-sized product
[512, 576] x [576, 1536]; and what `auto` picks here. Run: .venv/bin/python docs/bench/icelake-2026-12-07b/gemm.py"""
import time

import torch

from kvlink_rag.model.loader import cpu_has_native_bf16
from kvlink_rag.runtime.cpu_kernels import cpu_flags

torch.set_num_threads(2)
print("oneDNN says bfloat16 supported:", bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
      "| flags avx512_bf16 / amx_bf16:", "avx512_bf16" in cpu_flags(), "amx_bf16" in cpu_flags(),
      "| cpu_has_native_bf16:", cpu_has_native_bf16())
for rnd in range(3):
    row = []
    for dt in (torch.float32, torch.bfloat16):
        a, w = torch.randn(512, 576, dtype=dt), torch.randn(1536, 576, dtype=dt)
        for _ in range(3):
            torch.nn.functional.linear(a, w)
        t = time.perf_counter()
        for _ in range(20):
            torch.nn.functional.linear(a, w)
        s = (time.perf_counter() - t) / 20
        row.append(s)
        print(f"round {rnd} {str(dt):15s} {s * 1e3:6.2f} ms {2 * 512 * 576 * 1536 / s / 1e9:6.1f} GFLOP/s")
    print(f"round {rnd} bfloat16 / float32 time: {row[1] / row[0]:.1f}x")
