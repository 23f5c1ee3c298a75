"""BENCHMARKS.md tables and PNG plots from a results dict of :func:`bench.run.run_suite`."""

from __future__ import annotations

from pathlib import Path


def _ms(s: float) -> str:
    return f"{s * 1000:.0f}"


def markdown(results: dict, command: str) -> str:
    """The BENCHMARKS.md body: the sections of the suites that ran."""
    from .fairness import fairness_section
    from .guidellm_sweep import guidellm_section
    from .routing_sim_report import routing_sim_section
    from .serving_report import serving_section
    from .shared_report import shared_section

    m = results["machine"]
    if m.get("model") is None:  # model-free suites only (bench.run.run_model_free)
        lines = [f"Produced by `{command}` on {results['started']} ({m['platform']}; no model loaded).", ""]
    else:
        lines = [f"Produced by `{command}` on {results['started']} ({m['platform']}, {m['threads']} threads, "
                 f"device {m['device']}, model {m['model']}, KV {m['kv_dtype']}, K={m['link_k']}, {m['encoding']}).",
                 "All figures of one table come from the same run, medians of repeats (min-max in brackets).", ""]
    sections = (("ttft", _ttft_section), ("bandwidth", _bandwidth_section), ("precompute", _precompute_section),
                ("scaling_documents", _scaling_section), ("concurrency", _concurrency_section),
                ("serving", serving_section), ("shared_tier", shared_section), ("fairness", fairness_section),
                ("routing_sim", routing_sim_section), ("guidellm", guidellm_section))
    for key, section in sections:
        if results.get(key):
            lines += section(results) + [""]
    return "\n".join(lines).rstrip() + "\n"


def _ttft_section(results: dict) -> list[str]:
    lines = ["## TTFT vs context length (10 documents)", "",
             "| context tokens | full prefill ms | linked (host) ms | linked (LMDB warm) ms | linked (LMDB cold) ms "
             "| speed-up host | speed-up LMDB warm | floor ms | linked / floor |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results["ttft"]:
        full, host, warm, cold = r["full"], r["linked_host"]["total"], r["linked_lmdb_warm"]["total"], r["linked_lmdb_cold"]
        cold_s = _ms(cold["total"]["median_s"]) if cold else "n/a (page cache could not be dropped)"
        lines.append(f"| {r['context_tokens']} | {_ms(full['median_s'])} [{_ms(full['min_s'])}-{_ms(full['max_s'])}] "
                     f"| {_ms(host['median_s'])} [{_ms(host['min_s'])}-{_ms(host['max_s'])}] | {_ms(warm['median_s'])} "
                     f"| {cold_s} | {r['speedup_host']:.1f}x | {r['speedup_lmdb_warm']:.1f}x | {_ms(r['floor']['floor_s'])} "
                     f"| {r['linked_over_floor']:.2f} |")
    lines += ["", "Linked TTFT breakdown (host tier, medians, ms): load = lookup and waiting on reads; RoPE = "
              "re-rotation and copies into the cache; link+question = the one forward pass computing link tokens "
              "and question together; first decode step = the second token.", "",
              "| context tokens | load | RoPE | link+question forward | first decode step | floor: KV copy | floor: forward |",
              "|---|---|---|---|---|---|---|"]
    for r in results["ttft"]:
        h = r["linked_host"]
        lines.append(f"| {r['context_tokens']} | {_ms(h['load_s'])} | {_ms(h['rope_s'])} | {_ms(h['link_forward_s'])} "
                     f"| {_ms(r['first_decode_step']['median_s'])} | {_ms(r['floor']['copy']['median_s'])} "
                     f"| {_ms(r['floor']['forward']['median_s'])} |")
    return lines


def _bandwidth_section(results: dict) -> list[str]:
    lines = ["## Load bandwidth (LMDB, page cache warm) vs a memory-copy floor of the same KV", "",
             "Floor: the same bytes copied into preallocated, already-touched buffers by one thread (the load's "
             "decode is one memcpy per tensor on one thread); `clone` allocates and page-faults (the earlier "
             "reference).", "",
             "Streamed into blocks: the query path's load (layers streamed at retention 1 and written into a "
             "request's KV blocks of the records' dtype, no memory-tier fill); with RoPE: the keys rotated at "
             "their positions on the way, as a query writes them.", "",
             "Streamed writes spread each layer's documents over torch's threads (one call per layer); "
             "`blocks / threads floor`: against the same bytes copied by torch's `copy_` on those threads.", "",
             "| format | bytes/token stored | LMDB load GB/s | floor copy GB/s | clone GB/s | load / floor "
             "| streamed into blocks GB/s | blocks / floor | with RoPE / floor | blocks / threads floor |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for fmt, b in results["bandwidth"].items():
        clone = f"{b['clone_gbps']:.2f}" if "clone_gbps" in b else "n/a"
        blocks = b.get("blocks")
        streamed = (f"| {blocks['stream_gbps']:.2f} | {blocks['stream_vs_copy']:.2f} "
                    f"| {blocks.get('stream_rope_vs_copy', float('nan')):.2f} "
                    f"| {blocks.get('stream_vs_copy_threads', float('nan')):.2f} |") if blocks else "| n/a | n/a | n/a | n/a |"
        lines.append(f"| {fmt} | {b['bytes_per_token']:.0f} | {b['load_gbps']:.2f} | {b['copy_gbps']:.2f} | {clone} "
                     f"| {b['load_vs_copy']:.2f} {streamed}")
    return lines


def _precompute_section(results: dict) -> list[str]:
    p = results["precompute"]
    return ["## Precompute throughput (one process)", "",
              "| tokens | raw forward tok/s | encode + LMDB write tok/s | ratio |", "|---|---|---|---|",
              f"| {p['tokens']} | {p['raw_tokens_per_s']:.0f} | {p['precompute_tokens_per_s']:.0f} | {p['ratio']:.2f} |"]


def _scaling_section(results: dict) -> list[str]:
    lines = ["## TTFT vs number of documents", "", "| documents | context tokens | full ms | linked ms | speed-up |",
              "|---|---|---|---|---|"]
    for r in results["scaling_documents"]:
        lines.append(f"| {r['documents']} | {r['context_tokens']} | {_ms(r['full_s'])} | {_ms(r['linked_s'])} "
                     f"| {r['speedup']:.1f}x |")
    lines += ["", "## Store size and lookup time vs stored entries (synthetic)", "",
              "| entries | store MB | index get µs | near-duplicates µs | blob get µs |", "|---|---|---|---|---|"]
    for r in results["scaling_store"]:
        lines.append(f"| {r['entries']} | {r['store_bytes'] / 1e6:.1f} | {r['index_get_us']:.0f} "
                     f"| {r['near_duplicates_us']:.0f} | {r['blob_get_us']:.0f} |")
    return lines


def _concurrency_section(results: dict) -> list[str]:
    lines = ["## Concurrency through the HTTP API (60% short / 30% medium / 10% long; 2, 5, 10 documents)", "",
              "| clients | requests | throughput req/s | p50 s | p99 s | hit rate | p50 short s | p50 long s | long / short |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in results["concurrency"]:
        f = lambda x: "n/a" if x is None else f"{x:.2f}"  # noqa: E731
        lines.append(f"| {r['clients']} | {r['requests']} | {r['throughput_rps']:.2f} | {r['p50_s']:.2f} "
                     f"| {r['p99_s']:.2f} | {r['hit_rate']:.2f} | {f(r['p50_short_s'])} | {f(r['p50_long_s'])} "
                     f"| {f(r['long_over_short'])} |")
    return lines


def _log_plot(path: Path, xlabel: str, xs: list, series: list[tuple[list, str, str]]) -> Path:
    """PNG of TTFT (s, log scale) against ``xs``; ``series`` holds ``(ys, matplotlib style, label)``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.8))
    for ys, style, label in series:
        ax.plot(xs, ys, style, label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("TTFT (s)")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plots(results: dict, folder: Path) -> list[Path]:
    """TTFT vs context and vs documents (log scale)."""
    folder.mkdir(parents=True, exist_ok=True)
    ttft, docs = results["ttft"], results["scaling_documents"]
    return [
        _log_plot(folder / "ttft_vs_context.png", "context tokens", [r["context_tokens"] for r in ttft], [
            ([r["full"]["median_s"] for r in ttft], "o-", "full prefill"),
            ([r["linked_host"]["total"]["median_s"] for r in ttft], "o-", "linked (host tier)"),
            ([r["linked_lmdb_warm"]["total"]["median_s"] for r in ttft], "o-", "linked (LMDB warm)"),
            ([r["floor"]["floor_s"] for r in ttft], "k--", "physical floor")]),
        _log_plot(folder / "ttft_vs_documents.png", "documents", [r["documents"] for r in docs], [
            ([r["full_s"] for r in docs], "o-", "full prefill"),
            ([r["linked_s"] for r in docs], "o-", "linked")]),
    ]
