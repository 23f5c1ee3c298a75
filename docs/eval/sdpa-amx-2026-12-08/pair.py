"""Paired comparison of this run's rows (q4q8-bf16 on the AMX Xeon, prefill rows attending by SDPA) with the float32
rows the weight-format rule pairs against (docs/eval/rows.jsonl `full`, docs/eval/rows-mlp550.jsonl
`linked-query-lora@mlp550`) and with 2026-12-07i's rows (the same code but prefill rows on the AVX512-BF16 kernel, on
the family-25 EPYC): accuracy, paired difference with a 95% bootstrap interval (10,000 resamples, seed 0), identical
answers, mean answer NLL.
Usage (repository root): python docs/eval/sdpa-amx-2026-12-08/pair.py > docs/eval/sdpa-amx-2026-12-08/pair.txt"""
import json
import random

D = "docs/eval/sdpa-amx-2026-12-08"
K = "docs/eval/q4q8-online-2026-12-07i"


def rows(paths, mode):
    out = {}
    for p in paths:
        for line in open(p):
            r = json.loads(line)
            if r["mode"] == mode:
                out[r["index"]] = r
    return out


def ci(diffs, n=10000, seed=0):
    rng = random.Random(seed)
    means = sorted(sum(rng.choice(diffs) for _ in diffs) / len(diffs) for _ in range(n))
    return means[int(0.025 * n)], means[int(0.975 * n)]


new_files = [f"{D}/eval-0.rows.jsonl", f"{D}/eval-150.rows.jsonl"]
old_files = [f"{K}/eval-0.rows.jsonl", f"{K}/eval-150.rows.jsonl"]
for mode, f32_file, f32_mode in (("full", "docs/eval/rows.jsonl", "full"),
                                 ("linked-query-lora", "docs/eval/rows-mlp550.jsonl", "linked-query-lora@mlp550")):
    new, f32, old = rows(new_files, f"{mode}@sdpaamx"), rows([f32_file], f32_mode), rows(old_files, f"{mode}@q4q8on")
    idx = sorted(set(new) & set(f32) & set(old))
    for name, ref in (("float32", f32), ("the kernel, 2026-12-07i", old)):
        d = [new[i]["em"] - ref[i]["em"] for i in idx]
        lo, hi = ci(d)
        same = sum(new[i]["answer"] == ref[i]["answer"] for i in idx)
        nll = (sum(ref[i]["nll"] for i in idx) / len(idx), sum(new[i]["nll"] for i in idx) / len(idx))
        print(f"{mode} n={len(idx)} vs {name}: {sum(ref[i]['em'] for i in idx) / len(idx):.3f} -> "
              f"{sum(new[i]['em'] for i in idx) / len(idx):.3f}, paired {sum(d) / len(d):+.3f} [{lo:+.3f}, {hi:+.3f}], "
              f"identical answers {same}/{len(idx)}, answer NLL {nll[0]:.3f} / {nll[1]:.3f}")
