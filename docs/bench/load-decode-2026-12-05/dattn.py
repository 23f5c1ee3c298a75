"""decode_rows over 16 rows x 30 layers, ~1370 keys each: ms per step, and the KV bytes read."""
import time, torch, sys
from kvlink_rag.runtime.cpu_kernels import kernels
K = kernels()
if len(sys.argv) > 2: torch.set_num_threads(int(sys.argv[2]))
torch.manual_seed(0)
R, L, H, KV, T = 16, 30, 9, 3, 1370
own_k = [torch.randn(L, KV, T + 8, 64).to(torch.bfloat16) for _ in range(R)]
own_v = [torch.randn(L, KV, T + 8, 64).to(torch.bfloat16) for _ in range(R)]
pos = [T] * R
qkv = torch.randn(R, (H + 2 * KV) * 64)
def step():
    for l in range(L):
        K.decode_rows(qkv, H, l, own_k, own_v, pos, [[] for _ in range(R)], [[] for _ in range(R)], 0.125)
step()
ts = []
for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 15):
    t = time.perf_counter(); step(); ts.append(time.perf_counter() - t)
ts.sort(); med = ts[len(ts) // 2]
nbytes = R * L * KV * (T + 1) * 64 * 2 * 2
print(f"step {med*1e3:.2f} ms  KV {nbytes/1e6:.0f} MB  {nbytes/med/1e9:.1f} GB/s  threads {torch.get_num_threads()}")
