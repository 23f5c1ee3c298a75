"""The shipped artifact's NQ 10 rows on two machines, the same 100 questions: how often the answer is the same and
each machine's accuracy (this session's AMX Xeon rows against the 2026-12-05b AVX512 EPYC rows). Printed:
    full@shipped 100 same answer 54 em new 0.27 em old 0.29
    linked-query-lora@shipped 100 same answer 94 em new 0.32 em old 0.32

    python docs/eval/mixture-2026-12-06/cross_machine.py
"""
import json


def rows(path):
    return {(r["index"], r["mode"]): r for r in map(json.loads, open(path))}


new = rows("docs/eval/mixture-2026-12-06/nq10-A.rows.jsonl")
old = rows("docs/eval/mixture-2026-12-05/nq10-a.rows.jsonl")
common = sorted(set(new) & set(old))
for mode in ("full@shipped", "linked-query-lora@shipped"):
    ks = [k for k in common if k[1] == mode]
    same = sum(new[k]["answer"] == old[k]["answer"] for k in ks)
    print(mode, len(ks), "same answer", same, "em new", sum(new[k]["em"] for k in ks) / len(ks),
          "em old", sum(old[k]["em"] for k in ks) / len(ks))
