"""Prefill attention on this CPU: the AVX512-BF16 kernel (attend_prefill) against torch SDPA with grouped-query heads
(sdpa_gqa), SDPA over repeated KV heads (sdpa_rep) and two bmm; per shape (queries, keys): (ms, GFLOP/s, max abs
difference from the kernel). Usage (repository root): .venv/bin/python docs/bench/prefill-attention-amx-2026-12-08/micro.py"""
import time, torch, torch.nn.functional as F
from kvlink_rag.runtime.prefill_attention import attend_prefill
torch.manual_seed(0)
H, KVH, D = 9, 3, 64
for n, keys in ((70, 1370), (256, 1370), (256, 4000), (16, 1370)):
    q = torch.randn(H, n, D).bfloat16(); k = torch.randn(KVH, keys, D).bfloat16(); v = torch.randn(KVH, keys, D).bfloat16()
    mask = torch.zeros(n, keys, dtype=torch.bfloat16); mask[:, -n:] = torch.full((n, n), float("-inf")).triu(1).bfloat16()
    def kern(): return attend_prefill(q, [(k, v)], mask, D ** -0.5, False)
    def sdpa(): return F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask, scale=D ** -0.5, enable_gqa=True)[0]
    def sdpa_rep():
        kk, vv = k.repeat_interleave(H // KVH, 0), v.repeat_interleave(H // KVH, 0)
        return F.scaled_dot_product_attention(q[None], kk[None], vv[None], attn_mask=mask, scale=D ** -0.5)[0]
    def bmm():
        qq = q.view(KVH, H // KVH * n, D)
        s = torch.baddbmm(mask.repeat(H // KVH, 1)[None].expand(KVH, -1, -1), qq, k.transpose(1, 2), alpha=D ** -0.5)
        p = s.softmax(-1).bfloat16()
        return torch.bmm(p, v).view(H, n, D)
    ref = kern().float()
    res = {}
    for name, f in (("kernel", kern), ("sdpa_gqa", sdpa), ("sdpa_rep", sdpa_rep), ("bmm", bmm)):
        err = (f().float() - ref).abs().max().item()
        for _ in range(3): f()
        t0 = time.perf_counter(); r = 0
        while time.perf_counter() - t0 < 0.5: f(); r += 1
        ms = 1e3 * (time.perf_counter() - t0) / r
        res[name] = (round(ms, 3), round(4 * H * n * keys * D / ms / 1e6, 1), round(err, 4))
    print(n, keys, res)
