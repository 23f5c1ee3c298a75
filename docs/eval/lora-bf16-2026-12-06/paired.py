"""Paired accuracy / answer-NLL difference of rows B against rows A on the questions both hold: mean with a 95%
percentile bootstrap (2,000 resamples, seed 0), and identical answers.

python paired.py MODE_A FILES_A MODE_B FILES_B   (FILES_* comma-separated rows files; MODE_* the mode label in them)
"""
import json, random, sys


def rows(paths, mode):
    out = {}
    for path in paths.split(","):
        for line in open(path):
            r = json.loads(line)
            if r["mode"] == mode:
                out[r["index"]] = r
    return out


def boot(d, n=2000, seed=0):
    rng = random.Random(seed)
    means = sorted(sum(rng.choice(d) for _ in d) / len(d) for _ in range(n))
    return means[int(0.025 * n)], means[int(0.975 * n) - 1]


a, b = rows(sys.argv[2], sys.argv[1]), rows(sys.argv[4], sys.argv[3])
ix = sorted(set(a) & set(b))
d = [b[i]["em"] - a[i]["em"] for i in ix]
dn = [b[i]["nll"] - a[i]["nll"] for i in ix]
lo, hi = boot(d)
print(f"n={len(ix)} A {sum(a[i]['em'] for i in ix) / len(ix):.3f} B {sum(b[i]['em'] for i in ix) / len(ix):.3f} "
      f"B-A {sum(d) / len(d):+.3f} [{lo:+.3f}, {hi:+.3f}] identical {sum(a[i]['answer'] == b[i]['answer'] for i in ix)}"
      f"/{len(ix)} NLL {sum(a[i]['nll'] for i in ix) / len(ix):.3f} / {sum(b[i]['nll'] for i in ix) / len(ix):.3f} "
      f"(B-A {sum(dn) / len(dn):+.4f})")
