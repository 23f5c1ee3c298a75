"""float32 prefill attention on this CPU: SDPA (as ragged.attend) vs a matmul form; us per call, 2 threads."""
import time, torch, torch.nn.functional as F
torch.manual_seed(0)
torch.set_num_threads(2)

def sdpa(q, k, v, m, scale):
    return F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=m, scale=scale, enable_gqa=True)[0]

def mm(q, k, v, m, scale):
    h, n, d = q.shape; kv, t, _ = k.shape; g = h // kv
    qg = q.reshape(kv, g * n, d)
    s = torch.baddbmm(m.expand(kv, g, n, t).reshape(kv, g * n, t) if False else torch.empty(0), qg, k.transpose(1, 2)) if False else torch.bmm(qg, k.transpose(1, 2))
    s = s.view(kv, g, n, t)
    s.mul_(scale).add_(m)
    torch.softmax(s, dim=-1, out=s) if False else s.copy_(torch.softmax(s, -1))
    return torch.bmm(s.view(kv, g * n, t), v).view(h, n, d)

def mm2(q, k, v, m, scale):
    h, n, d = q.shape; kv, t, _ = k.shape; g = h // kv
    qg = (q * scale).reshape(kv, g * n, d)
    s = torch.bmm(qg, k.transpose(1, 2)).view(kv, g, n, t)
    s += m
    p = torch.softmax(s, dim=-1)
    return torch.bmm(p.view(kv, g * n, t), v).view(h, n, d)

def bench(f, *a, reps=20):
    f(*a)
    t = time.perf_counter()
    for _ in range(reps):
        f(*a)
    return (time.perf_counter() - t) / reps * 1e6

for n, t in [(70, 1370), (128, 1370), (512, 2048), (512, 4096), (16, 1370)]:
    q = torch.randn(9, n, 64); k = torch.randn(3, t, 64); v = torch.randn(3, t, 64)
    m = torch.zeros(n, t); m[:, : t // 3] = torch.finfo(torch.float32).min  # a KVLink-like block masked
    ref = sdpa(q, k, v, m, 0.125)
    e = (mm2(q, k, v, m, 0.125) - ref).abs().max().item()
    a, b = bench(sdpa, q, k, v, m, 0.125), bench(mm2, q, k, v, m, 0.125)
    gfl = 9 * n * t * 64 * 4 / 1e9
    print(f"n={n} t={t}: sdpa {a:8.0f} us ({gfl/a*1e6:5.1f} GFLOP/s)  matmul {b:8.0f} us ({gfl/b*1e6:5.1f})  x{a/b:4.2f} err {e:.1e}")
