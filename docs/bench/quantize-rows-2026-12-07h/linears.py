"""A decoder layer's four Q4 x Q8 linears of SmolLM2-135M (q|k|v 960x576, o 576x576, gate|up 3072x576, down
576x1536; random weights) at 1 and 16 activation rows, microseconds a call summed over the four, two threads; and
the down projection alone. Run in each checkout (old: 22d1c90's scalar rounding, new: bedb754's vectorised one):

    PYTHONPATH=. .venv/bin/python docs/bench/quantize-rows-2026-12-07h/linears.py LABEL
"""
import sys
import time

import torch

from kvlink_rag.runtime.q4q8 import Q4Q8Linear

SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}


def timed(f, n: int = 300) -> float:
    for _ in range(10):
        f()
    t0 = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - t0) / n


def main() -> None:
    torch.set_num_threads(2)
    g = torch.Generator().manual_seed(0)
    layer, down = {1: 0.0, 16: 0.0}, {}
    for name, (n, k) in SHAPES.items():
        lin = Q4Q8Linear(torch.randn(n, k, generator=g) * 0.02)
        for m in layer:
            x = torch.randn(m, k, generator=g)
            t = timed(lambda: lin(x))
            layer[m] += t
            if name == "down":
                down[m] = t
    print(f"{sys.argv[1]}: four linears of a layer {layer[1] * 1e6:.0f} us at 1 row, {layer[16] * 1e6:.0f} us at 16 rows; "
          f"down alone {down[1] * 1e6:.1f} / {down[16] * 1e6:.1f} us")


if __name__ == "__main__":
    main()
