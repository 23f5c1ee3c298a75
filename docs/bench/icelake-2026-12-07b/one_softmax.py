"""One layer of a ~410-token NQ document after the 29-token anchor prefix (SmolLM2's 9 query / 3 KV heads of 64),
importance on: the fused kernel's output plus the mass pass forming the scores again (before), one explicit
softmax for both (attend_and_mass, now), and the fused kernel alone (no scores); two threads, alternating.
Run: .venv/bin/python docs/bench/icelake-2026-12-07b/one_softmax.py"""
import statistics
import time

import torch

from kvlink_rag.runtime.attention_probs import attend_and_mass, attention_mass
from kvlink_rag.runtime.ragged import _causal_tail, attend_with_lse

torch.set_num_threads(2)
torch.manual_seed(0)
H, KV, D, P, N = 9, 3, 64, 29, 410
q = torch.randn(H, N, D)
pieces = [(torch.randn(KV, P, D), torch.randn(KV, P, D)), (torch.randn(KV, N, D), torch.randn(KV, N, D))]
mask, scale = _causal_tail(N, N + P, torch.float32, "cpu"), D ** -0.5


def before():
    out, lse = attend_with_lse(q, pieces, mask, scale)
    return out, attention_mass(q, pieces, mask, scale, 0, True, P, lse)


def now():
    return attend_and_mass(q, pieces, mask, scale, 0, True, P)


def no_scores():
    return attend_with_lse(q, pieces, mask, scale)


times = {f.__name__: [] for f in (before, now, no_scores)}
for _ in range(5):
    for f in (before, now, no_scores):
        for _ in range(3):
            f()
        t = time.perf_counter()
        for _ in range(40):
            f()
        times[f.__name__].append((time.perf_counter() - t) / 40 * 1e3)
for name, ts in times.items():
    print(f"{name:10s} median {statistics.median(ts):5.2f} ms per layer (rounds: {', '.join(f'{x:.2f}' for x in ts)})")
(o1, m1), (o2, m2) = before(), now()
print(f"output max |diff| {(o1 - o2).abs().max():.2e}, mass max |diff| {(m1 - m2).abs().max():.2e} of {m1.sum():.1f}")
