"""BENCHMARKS.md tables of the model-free routing simulation (:mod:`bench.routing_sim_suite`)."""

from __future__ import annotations

BOUNDS = (("round_robin", "round-robin: one LRU tier over the whole stream (Che's approximation)"),
          ("partitioned_lru", "per-document routing: each document to one home, an LRU tier per quarter"),
          ("any_routing", "any routing: the most requested documents that fit in the 4 tiers together"),
          ("single_tier_best", "one tier's best (the most requested documents that fit in one)"))


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _bounds_table(b: dict) -> list[str]:
    rr = b["round_robin"]["docs"]
    lines = ["| bound | hit rate, documents | hit rate, tokens | x round-robin |", "|---|---|---|---|"]
    for key, label in BOUNDS:
        lines.append(f"| {label} | {_pct(b[key]['docs'])} | {_pct(b[key]['tokens'])} | {b[key]['docs'] / rr:.2f}x |")
    return lines


def _ttft_table(tb: dict) -> list[str]:
    lines = ["| service model | round-robin's mean service | at the any-routing bound | lowest TTFT ratio "
             "| token hit rate for 0.6x |", "|---|---|---|---|---|"]
    for name, t in tb.items():
        need = f"{_pct(t['hit_rate_for_target'])}" if t["hit_rate_for_target"] <= 1 else "over 100%: none"
        lines.append(f"| {name} | {t['round_robin_ms']:.0f} ms | {t['any_routing_ms']:.0f} ms | {t['best_ratio']:.2f}x "
                     f"| {need} |")
    return lines


def _policy_table(rows: dict) -> list[str]:
    rr = rows["round-robin"]
    lines = ["| policy | hit rate, documents | hit rate, tokens | x round-robin | max/min requests (worst seed) "
             "| TTFT p50 | x round-robin | TTFT p99 |", "|---|---|---|---|---|---|---|---|"]
    for label, r in rows.items():
        lo, hi = r["ttft_p50_s_range"]
        lines.append(f"| {label} | {_pct(r['hit_rate_docs'])} | {_pct(r['hit_rate_tokens'])} "
                     f"| {r['hit_rate_docs'] / rr['hit_rate_docs']:.2f}x | {r['max_min_load']:.2f} "
                     f"| {r['ttft_p50_s']:.2f} s [{lo:.2f}-{hi:.2f}] | {r['ttft_p50_s'] / rr['ttft_p50_s']:.2f}x "
                     f"| {r['ttft_p99_s']:.2f} s |")
    return lines


def routing_sim_section(results: dict) -> list[str]:
    """The section: setup, bounds, then one table per scenario and service model (medians over the seeds)."""
    res = results["routing_sim"]
    s = res["setup"]
    lines = ["## Router policies in a model-free simulation (issue 27)", "",
             f"A simulation of the real router code, not a measurement of processes: {s['replicas']} replicas, "
             f"host tiers of {100 * s['host_fraction']:.0f}% of the corpus' bytes each "
             f"({s['host_tier_bytes'] / 1e6:.0f} MB), {s['documents']} documents ({s['token_counts']}; "
             f"{s['corpus_tokens']} tokens), {s['queries']} queries of {s['docs_per_query']} distinct documents "
             f"drawn Zipf({s['zipf']}), {s['clients']} closed-loop clients, the router polling events every "
             f"{s['poll_s']} s; counted after {s['warmup']} queries; medians over query seeds {s['seeds']} "
             "(TTFT p50's range in brackets). TTFTs are modelled (a FIFO prefill server per replica).", "",
             "Host-tier hit-rate bounds (analytic, `bench/routing_bounds.py`):", ""]
    lines += _bounds_table(res["bounds"]) + [""]
    lines += [f"Modelled TTFT bounds (every replica busy: TTFT in proportion to the mean service time; a query "
              f"holds {res['bounds']['query_tokens']:.0f} document tokens on average):", ""]
    lines += _ttft_table(res["ttft_bounds"]) + [""]
    for scenario, run in res["runs"].items():
        for name, block in run.items():
            m = block["model"]
            lines += [f"**{scenario}, {name}** ({m['fixed_ms']:g} ms a request + {m['hit_us']:g} us per host-tier "
                      f"token, {m['miss_us']:g} us per missed token):", ""]
            lines += _policy_table(block["policies"]) + [""]
    return lines
