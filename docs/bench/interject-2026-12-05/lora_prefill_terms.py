"""The query-side adapter's terms of 30 layers (prefill rows: two float32 GEMMs per fused projection) at M rows."""
import time, torch
from cli.common import make_engine, make_settings
from kvlink_rag.runtime.model_runner import get_runner
e = make_engine(make_settings())
r = get_runner(e.lm)
terms = r._terms(e.adapter)
print("adapter", e.adapter, "projections/layer", sum(x is not None for x in (terms[0].qkv, terms[0].o, terms[0].gate_up, terms[0].down)))
for M in (22, 70, 280):
    res = []
    for rep in range(3):
        ys = {}
        def f():
            for t in terms:
                for lr, (n_in, n_out) in ((t.qkv, (576, 960)), (t.o, (576, 576)), (t.gate_up, (576, 3072)), (t.down, (1536, 576))):
                    if lr is None: continue
                    x = xs[n_in]; y = ys.setdefault(n_out, torch.zeros(M, n_out))
                    lr.stacks(); lr._gemm(y, x)
        xs = {576: torch.randn(M, 576), 1536: torch.randn(M, 1536)}
        f(); t0 = time.perf_counter()
        for _ in range(10): f()
        res.append(round((time.perf_counter() - t0) / 10 * 1e3, 2))
    print(M, "LoRA terms ms per forward", res)
