"""Tier policy benchmark (issue 15): documents a memory tier holds at a fixed byte budget when it holds them
whole in bfloat16 vs at retention 0.4 in int8 (the cold tier), and the hit rate of each under a Zipf access trace.

The documents are synthetic KV of the default model's geometry (SmolLM2-135M: 30 layers, 3 KV heads, head
dim 64, bfloat16) with random importance: a tier's bytes and hits depend only on shapes and the trace, not on
values. A miss loads the document whole from a stand-in blob store and fills the tiers, as
:meth:`store.tiers.tiered.TieredCache.get` does. CPU only, about a minute::

    python -m bench.tier_policy [--docs 1000] [--accesses 10000] [--budget-mib 64] [--zipf 1.0] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from kvlink_rag.types import DocumentKV
from store.tiers.policies import LRUPolicy
from store.tiers.tier_format import TierFormat
from store.tiers.tier import CacheTier, entry_nbytes
from store.tiers.tiered import TieredCache

GEOMETRY = (30, 3, 64)  # SmolLM2-135M: layers, kv_heads, head_dim


class SyntheticStore:
    """Stands in for the blob store: ``get(key, dtype)`` makes document ``key`` (``'d<i>'``) on demand."""

    def __init__(self, tokens: int) -> None:
        self.tokens, self.loads = tokens, 0

    def get(self, key: str, dtype=None) -> DocumentKV:
        self.loads += 1
        return synthetic_doc(int(key[1:]), self.tokens)


_BASE: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}


def synthetic_doc(i: int, tokens: int) -> DocumentKV:
    """Document ``i``: ``[30, 3, tokens, 64]`` bfloat16 K and V (one random tensor pair shared by every document:
    values do not change bytes or hits, and making them per document would dominate the run) and its own
    random importance (seeded by ``i``)."""
    if tokens not in _BASE:
        g = torch.Generator().manual_seed(0)
        shape = (*GEOMETRY[:2], tokens, GEOMETRY[2])
        _BASE[tokens] = (torch.randn(shape, generator=g).to(torch.bfloat16),
                         torch.randn(shape, generator=g).to(torch.bfloat16))
    k, v = _BASE[tokens]
    imp = torch.rand(tokens, generator=torch.Generator().manual_seed(i))
    return DocumentKV(k, v, torch.zeros(tokens, dtype=torch.long), "fp", "anchored", imp)


def zipf_trace(n_docs: int, accesses: int, s: float, seed: int = 0) -> list[int]:
    """``accesses`` document ids drawn with P(rank k) ~ 1/k^s, ranks shuffled over the ids."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, n_docs + 1) ** s
    ranks = rng.choice(n_docs, size=accesses, p=p / p.sum())
    return rng.permutation(n_docs)[ranks].tolist()


def run_trace(tiers: list[CacheTier], trace: list[int], retentions: list[float], tokens: int) -> dict:
    """Replay ``trace`` (request ``j`` at ``retentions[j]``) through the tiers; hit rates per retention over
    the second half of the trace (the first half warms the tiers)."""
    cache = TieredCache(tiers, SyntheticStore(tokens))
    hits: dict[float, list[int]] = {}
    t0 = time.perf_counter()
    for j, (d, r) in enumerate(zip(trace, retentions)):
        before = sum(t.counters["hits"] for t in tiers)
        cache.get(f"d{d}", "A", retention=r)
        if j >= len(trace) // 2:
            hits.setdefault(r, []).append(int(sum(t.counters["hits"] for t in tiers) > before))
    return {
        "hit_rate": {f"{r:g}": float(np.mean(h)) for r, h in sorted(hits.items())},
        "tiers": [{"name": t.name, **t.format.describe(), "entries": len(t), "used_bytes": t.used_bytes,
                   "partial_misses": t.counters["partial_misses"]} for t in tiers],
        "seconds": round(time.perf_counter() - t0, 1),
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=1000)
    ap.add_argument("--accesses", type=int, default=10000)
    ap.add_argument("--tokens", type=int, default=160, help="tokens per document (NQ passages: ~150-170)")
    ap.add_argument("--budget-mib", type=int, default=64)
    ap.add_argument("--zipf", type=float, default=1.0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    budget = a.budget_mib << 20
    cold = TierFormat(0.4, int8=True)
    doc = synthetic_doc(0, a.tokens)
    full_b = entry_nbytes(doc)
    cold_b = CacheTier("probe", 1 << 40, fmt=cold).put("d0", doc, "A").nbytes
    out = {"tokens": a.tokens, "budget_bytes": budget, "bytes_per_doc": {"bf16_r1": full_b, "int8_r0.4": cold_b},
           "docs_per_gib": {"bf16_r1": (1 << 30) // full_b, "int8_r0.4": (1 << 30) // cold_b}}
    trace = zipf_trace(a.docs, a.accesses, a.zipf)
    at = {r: [r] * len(trace) for r in (0.4, 1.0)}
    mixed = np.random.default_rng(1).choice([0.4, 1.0], size=len(trace)).tolist()
    runs = {
        "bf16 r=1, requests r=0.4": ([CacheTier("host", budget, LRUPolicy())], at[0.4]),
        "int8 r=0.4, requests r=0.4": ([CacheTier("cold", budget, LRUPolicy(), fmt=cold)], at[0.4]),
        "bf16 r=1, requests r=1": ([CacheTier("host", budget, LRUPolicy())], at[1.0]),
        "int8 r=0.4, requests r=1": ([CacheTier("cold", budget, LRUPolicy(), fmt=cold)], at[1.0]),
        "bf16 r=1, requests half r=0.4 half r=1": ([CacheTier("host", budget, LRUPolicy())], mixed),
        "host bf16 1/2 + cold int8 r=0.4 1/2, requests half/half": (
            [CacheTier("host", budget // 2, LRUPolicy()), CacheTier("cold", budget // 2, LRUPolicy(), fmt=cold)],
            mixed),
    }
    out["runs"] = {name: run_trace(tiers, trace, rs, a.tokens) for name, (tiers, rs) in runs.items()}
    out["args"] = vars(a)
    print(markdown(out))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return out


def markdown(out: dict) -> str:
    """The results as BENCHMARKS.md tables."""
    b, n = out["bytes_per_doc"], out["docs_per_gib"]
    lines = [f"{out['tokens']}-token documents: bf16 r=1 {b['bf16_r1']:,} bytes ({n['bf16_r1']:,} per GiB), "
             f"int8 r=0.4 {b['int8_r0.4']:,} bytes ({n['int8_r0.4']:,} per GiB), "
             f"{b['bf16_r1'] / b['int8_r0.4']:.1f}x more documents per byte.", "",
             ("| tiers (same budget) | requests | documents held | hit rate r=0.4 | hit rate r=1 "
              "| partial misses (whole trace) |"),
             "|---|---|---|---|---|---|"]
    for name, run in out["runs"].items():
        tiers, reqs = name.split(", requests ")
        held = " + ".join(str(t["entries"]) for t in run["tiers"])
        hr = run["hit_rate"]
        pm = sum(t["partial_misses"] for t in run["tiers"])
        rate = {r: f"{hr[r]:.2f}" if r in hr else "-" for r in ("0.4", "1")}
        lines.append(f"| {tiers} | {reqs} | {held} | {rate['0.4']} | {rate['1']} | {pm} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
