# Tried, not kept (session 2026-12-06b): the adapter's thin products in bfloat16 ("new": a variant of
# training/frozen_linear.py tried then, not committed) against float32 ("old": frozen_linear.py of 91f1096, copied to
# /tmp/fl_old.py), interleaved in one process; medians in ms per forward+backward. Printed: gate_up 9.67 / 9.63,
# qkv 3.83 / 3.76, o 2.51 / 2.63, down 5.82 / 5.53 (old / new: no change at this resolution).
import torch, time, sys, statistics
sys.path.insert(0, "/tmp")
import fl_old
from training.frozen_linear import frozen_lora_linear as new_f
old_f = fl_old.frozen_lora_linear
torch.manual_seed(0)
for n_in, out, r in [(576, 3072, 32), (576, 960, 48), (576, 576, 16), (1536, 576, 16)]:
    rows = 293
    x = torch.randn(rows, n_in, requires_grad=True)
    w = torch.zeros(out, n_in + r).bfloat16(); w[:, :n_in] = torch.randn(out, n_in).bfloat16()
    a = (torch.randn(r, n_in) * 0.01).requires_grad_(True); b = (torch.randn(out, r) * 0.01).requires_grad_(True)
    g = torch.randn(rows, out)
    res = {"old": [], "new": []}
    for rep in range(12):
        for name, f in (("old", old_f), ("new", new_f)):
            t0 = time.perf_counter()
            for _ in range(10):
                f(x, w, None, (a, b)).backward(g)
            res[name].append((time.perf_counter() - t0) / 10 * 1e3)
    print(n_in, out, r, {k: round(statistics.median(v[2:]), 2) for k, v in res.items()})
