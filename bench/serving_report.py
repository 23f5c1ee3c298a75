"""The BENCHMARKS.md section of :func:`bench.serving.serving_suite`'s results."""

from __future__ import annotations


def serving_section(results: dict) -> list[str]:
    """Markdown lines: NQ throughput by clients with the compute floor, dialogues with sharing on/off,
    short-query latency during a long precompute."""
    s = results["serving"]
    nq, fl = s["nq"], s["nq"]["floor"]
    lines = ["## Serving: batching scheduler (linked NQ queries, 10 cached documents, 24 new tokens, greedy)", "",
             "| clients | scheduler | requests | throughput req/s | vs 1 client | tokens/s | p50 s | p99 s | p99/p50 "
             "| TTFT p50 s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in nq["rows"]:
        lines.append(f"| {r['clients']} | {'on' if r['scheduler'] else 'off'} | {r['requests']} "
                     f"| {r['throughput_rps']:.2f} | {r['speedup_vs_1']:.2f}x | {r['tokens_per_s']:.1f} | {r['p50_s']:.2f} "
                     f"| {r['p99_s']:.2f} | {r['p99_over_p50']:.2f} | {r['ttft_p50_s']:.2f} |")
    lines += ["", f"Compute floor of one query ({fl['prefill_gflop']:.1f} GFLOP prefill of ~{nq['rows'][-1]['prefill_tokens']} "
              f"link+question tokens over the documents' KV, {fl['decode_gflop']:.1f} GFLOP decode): at the measured "
              f"{fl['gemm_gflops']:.0f} GFLOP/s float32 GEMM rate ({fl['threads']} threads) no batch can exceed "
              f"{fl['floor_rps']:.2f} req/s; in bfloat16 ({fl['gemm_gflops_bf16']:.0f} GFLOP/s measured on this CPU) "
              f"{fl['floor_rps_bf16']:.2f} req/s."]
    d = s["dialogues"]
    lines += ["", "## Serving: 16 concurrent 5-turn dialogues (one system prompt, the same 5 documents)", "",
              "| prefix sharing | turns | turns/s | peak resident KV MB | TTFT p50 turn 1 s | turn 5 s | turn 5 / turn 1 "
              "| cached prompt share |", "|---|---|---|---|---|---|---|---|"]
    for name in ("shared", "unshared"):
        r = d[name]
        by = r["ttft_p50_by_turn_s"]
        first, last = by[min(by, key=int)], by[max(by, key=int)]
        lines.append(f"| {'on' if name == 'shared' else 'off'} | {r['turns']} | {r['turns_per_s']:.2f} "
                     f"| {r['peak_kv_bytes'] / 1e6:.0f} | {first:.2f} | {last:.2f} | {r['last_over_first_ttft']:.2f} "
                     f"| {r['cached_token_share']:.2f} |")
    saving = d["peak_kv_saving"]
    lines += ["", f"Sharing on vs off: throughput {d['throughput_ratio']:.2f}x, peak resident KV "
              + (f"{100 * saving:.0f}% lower." if saving is not None else "not sampled (the run was too short).")]
    i = s["interference"]
    lines += ["", "## Serving: a short cached query while ~4k-token documents are precomputed", "",
              "| idle p50 s | during precompute p50 s | ratio | samples | long document encode wall s |",
              "|---|---|---|---|---|",
              f"| {i['idle_p50_s']:.3f} | {i['busy_p50_s']:.3f} | {i['ratio']:.2f} | {i['samples']} "
              f"| {i['long_encode_wall_s']:.1f} |"]
    return lines
