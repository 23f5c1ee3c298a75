"""Paired accuracy / answer-NLL differences of a format's rows against the float32 rows, per mode, on the questions
both hold: mean difference with a 95% percentile bootstrap (2,000 resamples, seed 0), identical answers.

python paired.py REF_FULL REF_LINKED NEW_ROWS...  (REF_* are rows files and the mode label in them, FILE:MODE)
"""
import json, random, sys


def rows(path, mode=None):
    out = {}
    for line in open(path):
        r = json.loads(line)
        if mode is None or r["mode"] == mode:
            out.setdefault(r["mode"].split("@")[0], {})[r["index"]] = r
    return out


def boot(d, n=2000, seed=0):
    rng = random.Random(seed)
    means = sorted(sum(rng.choice(d) for _ in d) / len(d) for _ in range(n))
    return means[int(0.025 * n)], means[int(0.975 * n) - 1]


ref = {}
for spec in sys.argv[1:3]:
    path, mode = spec.rsplit(":", 1)
    ref.update(rows(path, mode))
new = {}
for path in sys.argv[3:]:
    for m, r in rows(path).items():
        new.setdefault(m, {}).update(r)
for m in ("full", "linked-query-lora"):
    a, b = ref[m], new.get(m, {})
    ix = sorted(set(a) & set(b))
    d = [b[i]["em"] - a[i]["em"] for i in ix]
    dn = [b[i]["nll"] - a[i]["nll"] for i in ix]
    same = sum(a[i]["answer"] == b[i]["answer"] for i in ix)
    lo, hi = boot(d)
    print(f"{m}: n={len(ix)} float32 {sum(a[i]['em'] for i in ix)/len(ix):.3f} new {sum(b[i]['em'] for i in ix)/len(ix):.3f} "
          f"diff {sum(d)/len(d):+.3f} [{lo:+.3f}, {hi:+.3f}] identical {same}/{len(ix)} "
          f"NLL {sum(a[i]['nll'] for i in ix)/len(ix):.3f} / {sum(b[i]['nll'] for i in ix)/len(ix):.3f} "
          f"(diff {sum(dn)/len(dn):+.4f})")
