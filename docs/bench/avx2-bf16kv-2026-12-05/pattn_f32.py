"""(Ran against the kernel of prefill_attention_f32.cpp.txt, built into the runner's extension for the run and
not kept: attend_prefill_f32 is not in the tree any more; output pattn_f32.txt.)

Prefill attention of float32 queries on this CPU, us per call (2 threads, best of 3 runs of 10): SDPA float32
over float32 KV, SDPA float32 over bfloat16 KV widened first (ragged._widened), the AVX2 float32 kernel over
float32 and over bfloat16 KV (pieces read in place). 9 query heads over 3 KV heads, a KVLink-like mask."""
import time, torch, torch.nn.functional as F
from kvlink_rag.runtime.prefill_attention import attend_prefill_f32
from kvlink_rag.runtime.ragged import _widened
torch.manual_seed(0)
torch.set_num_threads(2)


def sdpa(q, pieces, m):
    k, v = pieces[0] if len(pieces) == 1 else (torch.cat([k for k, _ in pieces], 1), torch.cat([v for _, v in pieces], 1))
    return F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=m, scale=0.125, enable_gqa=True)[0]


def bench(f, reps=10):
    f()
    best = 1e9
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(reps):
            f()
        best = min(best, (time.perf_counter() - t) / reps * 1e6)
    return best


for n, t in [(16, 1370), (70, 1370), (128, 1370), (70, 4096), (256, 2048), (512, 4096)]:
    q = torch.randn(9, n, 64)
    pieces = [(torch.randn(3, t // 2, 64), torch.randn(3, t // 2, 64)), (torch.randn(3, t - t // 2, 64), torch.randn(3, t - t // 2, 64))]
    bf = [(k.bfloat16(), v.bfloat16()) for k, v in pieces]
    m = torch.zeros(n, t); m[:, : t // 3] = torch.finfo(torch.float32).min
    gfl = 9 * n * t * 64 * 4 / 1e9
    a = bench(lambda: sdpa(q, pieces, m))
    b = bench(lambda: sdpa(q, [_widened(bf)], m))
    c = bench(lambda: attend_prefill_f32(q, pieces, m, 0.125, False))
    d = bench(lambda: attend_prefill_f32(q, bf, m, 0.125, False))
    e = (attend_prefill_f32(q, bf, m, 0.125, False) - sdpa(q, [_widened(bf)], m)).abs().max().item()
    print(f"n={n:4d} keys={t:5d}: sdpa f32 {a:7.0f} us ({gfl / a * 1e6:5.1f} GFLOP/s) | widened bf16 {b:7.0f} "
          f"| kernel f32 {c:7.0f} ({gfl / c * 1e6:5.1f}) | kernel bf16 {d:7.0f} ({gfl / d * 1e6:5.1f}) "
          f"| sdpa/kernel(bf16) {b / d:4.2f}x | max err {e:.1e}", flush=True)
