"""The query-side adapter's prefill terms of 30 layers at M rows (bfloat16 activations, as q4q8-bf16's prefill rows):
today's float32 GEMMs (x widened, h = x A^T float32, then h B^T narrowed and added) against the same in bfloat16
(A, B^T and h bfloat16, oneDNN's bfloat16 GEMMs with float32 accumulation), medians of 5 x 10 forwards."""
import statistics, time, torch
from cli.common import make_engine, make_settings
from kvlink_rag.runtime.model_runner import get_runner
e = make_engine(make_settings())
r = get_runner(e.lm)
terms = r._terms(e.adapter)
dims = {"qkv": (576, 960), "o": (576, 576), "gate_up": (576, 3072), "down": (1536, 576)}
def forward(M, dtype, xs, ys):
    for t in terms:
        for name, (n_in, n_out) in dims.items():
            lr = getattr(t, name)
            if lr is None:
                continue
            a, b_t = lr.stacks()
            if dtype == torch.bfloat16:
                a, b_t = lr.kernel_stacks()  # the adapter's bfloat16 values (exact)
                h = torch.mm(xs[n_in], a.t())
                ys[n_out][:, lr.start: lr.end].add_(torch.mm(h, b_t))
            else:
                lr._gemm(ys[n_out], xs[n_in])
for M in (16, 70, 280, 1120):
    xs = {n: torch.randn(M, n).bfloat16() for n in (576, 1536)}
    ys = {n: torch.zeros(M, n, dtype=torch.bfloat16) for n in (960, 576, 3072)}
    out = {}
    for dtype in (torch.float32, torch.bfloat16, torch.float32, torch.bfloat16):
        forward(M, dtype, xs, ys)
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(10):
                forward(M, dtype, xs, ys)
            times.append((time.perf_counter() - t0) / 10 * 1e3)
        out.setdefault(str(dtype)[6:], []).append(round(statistics.median(times), 2))
    print(M, "rows: LoRA terms ms per forward", out, flush=True)
