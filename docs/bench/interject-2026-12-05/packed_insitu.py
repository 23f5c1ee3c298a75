import torch, time
from cli.common import make_engine, make_settings
from kvlink_rag.runtime.model_runner import get_runner
from kvlink_rag.runtime.linear import DenseLinear
e = make_engine(make_settings())
r = get_runner(e.lm)
L = r.weights.layers
model = e.lm.model
fam_layers = model.model.layers
dense = []
for l in fam_layers:
    a, m = l.self_attn, l.mlp
    qkv = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).bfloat16()
    gu = torch.cat([m.gate_proj.weight, m.up_proj.weight]).bfloat16()
    dense.append((DenseLinear(qkv), DenseLinear(a.o_proj.weight.bfloat16()), DenseLinear(gu), DenseLinear(m.down_proj.weight.bfloat16())))
packed = [(l.qkv.large, l.o.large, l.gate_up.large, l.down.large) for l in L]
for T in (22, 80, 256):
    xs = {576: torch.randn(T, 576), 1536: torch.randn(T, 1536)}
    res = {}
    for rep in range(3):
        for name, LL in (("dense", dense), ("packed", packed)):
            def f():
                for l in LL:
                    for lin in l:
                        lin(xs[lin.weight.shape[1] if hasattr(lin, "weight") else lin.in_features])
            f(); t0 = time.perf_counter()
            for _ in range(10): f()
            res.setdefault(name, []).append(round((time.perf_counter()-t0)/10*1e3, 1))
    print(T, res)
