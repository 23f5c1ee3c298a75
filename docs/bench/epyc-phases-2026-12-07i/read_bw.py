"""How fast two torch threads stream-read memory here: reductions over 512 MB (int64 max / sum, float32 sum of
the same bytes), 5 timings each after a warm-up; GB/s of bytes read. Usage: python read_bw.py > read_bw.txt"""
import time
import torch
torch.set_num_threads(2)
x = torch.empty(512 * 1024 * 1024 // 8, dtype=torch.int64).random_(0, 1000)
for name, f in [("max int64", lambda: x.max()), ("sum int64", lambda: x.sum()), ("sum float32", lambda: x.view(torch.float32).sum())]:
    f()
    t = time.perf_counter()
    for _ in range(5):
        f()
    print(name, f"{x.numel() * 8 / ((time.perf_counter() - t) / 5) / 1e9:.1f} GB/s")
