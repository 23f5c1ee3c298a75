"""Micro-benchmark: the LSE from torch's CPU flash kernel at 512 queries over 16k keys against the explicit
mass (attention_mass over every key); two threads. Output: flash_lse.txt."""
import torch, time
torch.set_num_threads(2)
op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
print(op.default._schema)
H, KV, n, L, d = 9, 3, 512, 16000, 64
q = torch.randn(H, n, d); k = torch.randn(KV, L + n, d); v = torch.randn(KV, L + n, d)
mask = torch.zeros(n, L + n); mask[:, L:] = torch.triu(torch.full((n, n), float("-inf")), 1)
kr = k.repeat_interleave(H // KV, 0); vr = v.repeat_interleave(H // KV, 0)
for dt in (torch.float32, torch.bfloat16):
    t = time.perf_counter()
    out, lse = op(q[None].to(dt), kr[None].to(dt), vr[None].to(dt), 0.0, False, attn_mask=mask[None, None].to(dt), scale=d ** -0.5)
    print(dt, "flash", time.perf_counter() - t, lse.shape, lse.dtype)
# reference lse
t = time.perf_counter()
s = (q @ kr.transpose(1, 2)) * d ** -0.5 + mask
ref = torch.logsumexp(s, -1)
print("explicit", time.perf_counter() - t, (ref - lse[0].float()).abs().max())
from kvlink_rag.runtime.attention_probs import attention_mass
t = time.perf_counter(); m = attention_mass(q, [(k, v)], mask, d ** -0.5); print("attention_mass", time.perf_counter() - t)
