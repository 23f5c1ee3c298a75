import torch, time
torch.set_num_threads(2)
L = 30
shapes = ((960, 576), (576, 576), (3072, 576), (576, 1536))
W = [[torch.randn(o, i).bfloat16() for (o, i) in shapes] for _ in range(L)]
Ps = {h: [[torch.ops.mkldnn._reorder_linear_weight(w, h) for w in l] for l in W] for h in (1, 64, 256)}
for T in (22, 80, 256):
    xs = [torch.randn(T, i).bfloat16() for (o, i) in shapes]
    res = {h: [] for h in Ps}
    for rep in range(3):
        for h, P in Ps.items():
            def packed():
                for l in range(L):
                    for w, x in zip(P[l], xs): torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")
            packed(); t0 = time.perf_counter()
            for _ in range(10): packed()
            res[h].append(round((time.perf_counter()-t0)/10*1e3, 1))
    print(T, res)
