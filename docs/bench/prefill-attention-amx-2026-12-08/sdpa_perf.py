"""One thread, 40 SDPA calls of 256 grouped-query queries over 4,000 bfloat16 keys with a mask, for a perf profile:
perf record -o OUT .venv/bin/python docs/bench/prefill-attention-amx-2026-12-08/sdpa_perf.py; perf report --sort dso,sym
(sdpa_perf.txt: the lines of oneDNN's brgemm and the flash attention kernel)."""
import torch, torch.nn.functional as F
torch.set_num_threads(1)
q = torch.randn(1, 9, 256, 64).bfloat16(); k = torch.randn(1, 3, 4000, 64).bfloat16(); v = torch.randn(1, 3, 4000, 64).bfloat16()
m = torch.zeros(256, 4000, dtype=torch.bfloat16)
for _ in range(40): F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True)
