"""The BENCHMARKS.md section of the shared cache tier (:mod:`bench.shared_tier`)."""

from __future__ import annotations


def _ms(s: float) -> str:
    return f"{s * 1000:.0f}"


def shared_section(results: dict) -> list[str]:
    """Markdown lines: TTFT from memory, local LMDB warm and the shared Redis tier (local cold), the load
    bandwidth of both tiers against the copy floor, and precompute throughput with 1..N worker processes."""
    r = results["shared_tier"]
    if "skipped" in r:
        return ["## Shared cache tier (Redis)", "", f"Skipped: {r['skipped']}."]
    t = r["ttft"]
    lines = ["## Shared cache tier (Redis): TTFT and load bandwidth", "",
             f"10 documents, {t['context_tokens']} context tokens, {t['kv_bytes'] / 1e6:.1f} MB of KV "
             f"({t['bytes_per_token']:.0f} stored bytes/token), a private redis-server on loopback (append-only "
             "file, everysec). Medians, ms (min-max).", "",
             "| linked from | TTFT | load (lookup + waits) | RoPE | link+question forward |", "|---|---|---|---|---|"]
    for name, key in (("host memory", "memory"), ("local LMDB (warm)", "local_warm"),
                      ("shared Redis (local tier cold)", "shared_cold")):
        x = t[key]
        lines.append(f"| {name} | {_ms(x['total']['median_s'])} ({_ms(x['total']['min_s'])}-{_ms(x['total']['max_s'])}) "
                     f"| {_ms(x['load_s'])} | {_ms(x['rope_s'])} | {_ms(x['link_forward_s'])} |")
    lines += ["", f"Shared / local TTFT: **{t['shared_over_local']:.2f}x** (target <= 1.5x).", "",
              "Load = `get` of the 10 documents into tensors (fetch, checksums, decode); raw fetch = the shared "
              "tier's payload bytes pulled over the socket, no decode; floor = the same KV bytes copied into "
              "preallocated, touched buffers by one thread.", "",
              "| tier | load GB/s | raw fetch GB/s | floor copy GB/s | load / floor |", "|---|---|---|---|---|"]
    for name, b in t["bandwidth"].items():
        raw = f"{b['raw_fetch_gbps']:.2f}" if "raw_fetch_gbps" in b else "-"
        lines.append(f"| {name} | {b['load_gbps']:.2f} | {raw} | {b['copy_gbps']:.2f} | {b['load_vs_copy']:.2f} |")
    lines += ["", "## Precompute throughput with worker processes writing to the shared tier", "",
              "One torch thread per worker, timed from all models loaded to the last write; cores used = the "
              "workers' CPU seconds / wall seconds (what the machine gave them beside other jobs).", "",
              "| workers | tokens | wall s | tokens/s | speed-up | cores used |", "|---|---|---|---|---|---|"]
    for p in r["precompute"]:
        lines.append(f"| {p['workers']} | {p['tokens']} | {p['wall_s']:.1f} | {p['tokens_per_s']:.0f} "
                     f"| {p['speedup']:.2f}x | {p.get('cores_used', float('nan')):.2f} |")
    return lines
