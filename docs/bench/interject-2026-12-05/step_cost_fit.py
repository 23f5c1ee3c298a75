"""The fit of a long prompt's chunk forward in trace-old.json (interf_trace.py's output on daa3476): ms = a + b n +
c n (keys + n / 2) over the single-forward chunk steps."""
import json, sys
import numpy as np
tr = json.load(open(sys.argv[1] if len(sys.argv) > 1 else "trace-old.json"))["trace"]
X, Y, done = [], [], None
for s in tr:
    f = s["fwd"]
    toks = [t for ff in f for t in ff["tokens"]]
    if len(f) == 1 and len(toks) == 1 and toks[0] > 30 and s["admitted"] == 0:
        n = toks[0]
        done = done or 0
        X.append([1, n, n * (done + n / 2)]); Y.append(f[0]["ms"])
        done += n
        if n == 225 or done > 3300:
            done = None
    elif s["admitted"] == 1 and toks and toks[0] > 100:
        done = toks[0]
coef, *_ = np.linalg.lstsq(np.array(X, float), np.array(Y), rcond=None)
print(f"{len(Y)} steps: a={coef[0]:.1f} ms, b={coef[1]:.3f} ms/token, c={coef[2]:.6f} ms/(token*key), "
      f"key weight 1/{coef[1] / coef[2]:.0f}")
