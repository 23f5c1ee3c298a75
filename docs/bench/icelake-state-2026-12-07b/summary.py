"""Issue 24's targets from a state.sh run folder (argv[1]): one line per target, the figures of every run in it.
Run: .venv/bin/python docs/bench/icelake-state-2026-12-07b/summary.py docs/bench/icelake-state-2026-12-07b/c49267d"""
import json
import sys
from pathlib import Path

o = Path(sys.argv[1])
for f in sorted(o.glob("serving-*.jsonl")):
    rows = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    one, sixteen, floor = rows[0], rows[1], rows[2]
    print(f"{f.name}: 1 client {one['throughput_rps']:.2f} req/s, 16 clients {sixteen['throughput_rps']:.2f} req/s "
          f"({sixteen['throughput_rps'] / one['throughput_rps']:.1f}x one); float32 floor {floor['floor_rps']:.2f} req/s "
          f"-> {sixteen['throughput_rps'] / floor['floor_rps']:.0%}; bfloat16 floor {floor['floor_rps_bf16']:.2f} -> "
          f"{sixteen['throughput_rps'] / floor['floor_rps_bf16']:.0%}; 16-client p50 {sixteen['p50_s']:.2f} s, "
          f"TTFT p50 {sixteen['ttft_p50_s']:.2f} s; one client {one['tokens_per_s'] / 1:.1f} tok/s")
for f in sorted(o.glob("ttft-*.json")):
    d = json.loads(f.read_text())
    t = d["ttft"][0]
    b = d["bandwidth"]["bfloat16"]["blocks"]
    print(f"{f.name}: {t['context_tokens']} tokens, full {t['full']['median_s']:.2f} s, host {t['linked_host']['total']['median_s'] * 1e3:.0f} ms "
          f"({t['speedup_host']:.1f}x), LMDB warm {t['linked_lmdb_warm']['total']['median_s'] * 1e3:.0f} ms "
          f"({t['speedup_lmdb_warm']:.1f}x) -> warm / host {t['speedup_lmdb_warm'] / t['speedup_host']:.2f}; "
          f"blocks / floor {b['stream_vs_copy']:.2f}, with RoPE {b['stream_rope_vs_copy']:.2f}")
if (f := o / "interf.json").exists():
    for r in json.loads(f.read_text())["rows"]:
        print(f"interf.json: step {r['step_tokens']} budget {r['long_prefill_budget']}: idle TTFT p50 "
              f"{r['idle_ttft_p50_s'] * 1e3:.0f} ms, busy {r['busy_ttft_p50_s'] * 1e3:.0f} ms -> {r['ratio']:.2f}x")
if (f := o / "dialogues.json").exists():
    d = json.loads(f.read_text())
    print(f"dialogues.json: shared {d['shared']['turns_per_s']:.2f} turns/s, unshared {d['unshared']['turns_per_s']:.2f}"
          f" -> {d['ratio']:.2f}x")
