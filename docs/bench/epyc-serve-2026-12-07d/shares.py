"""Shares of the scheduler thread's py-spy samples (run1/spy.txt, raw stacks) per frame, inclusive: the figures of
BENCHMARKS.md's 2026-12-07d section. Run: python shares.py run1/spy.txt"""
import collections
import re
import sys

tot, inc = 0, collections.Counter()
for line in open(sys.argv[1]):
    stack, n = line.rstrip().rsplit(" ", 1)
    frames = stack.split(";")
    if "kvlink-scheduler" not in frames[0]:
        continue
    tot += int(n)
    for f in {re.sub(r" \(.*", "", f) for f in frames[1:]}:
        inc[f] += int(n)
print("scheduler samples", tot)
for k, v in inc.most_common(50):
    print(f"{100 * v / tot:5.1f}% {k}")
