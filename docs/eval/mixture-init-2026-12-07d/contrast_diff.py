"""Per shipping check of this folder: the contrast prompts right per order, prompts lost and won against the shipped
artifact, how many lost answers name the contrast document's items, and the mean answer length in words.
Run from the repository root: python docs/eval/mixture-init-2026-12-07d/contrast_diff.py"""
import json
import os
import sys

sys.path.insert(0, os.getcwd())
from evaluation.contrast import CASES  # noqa: E402

D = "docs/eval/mixture-init-2026-12-07d"
for name in ("ship-check", "lora-1e-4/ship-check", "links-only/ship-check"):
    rows = {t: {(r["index"], r["gold_position"]): r for r in map(json.loads, open(f"{D}/{name}/contrast-{t}.rows.jsonl"))}
            for t in ("shipped", "candidate")}
    s, c = rows["shipped"], rows["candidate"]
    lost = [k for k in s if s[k]["em"] == 1 and c[k]["em"] == 0]
    won = [k for k in s if s[k]["em"] == 0 and c[k]["em"] == 1]
    wrong = sum(any(w.lower() in c[k]["answer"].lower() for w in CASES[k[0]].wrong) for k in lost)
    for t, r in rows.items():
        right = {p: int(sum(x["em"] for k, x in r.items() if k[1] == p)) for p in ("first", "last")}
        words = sum(len(x["answer"].split()) for x in r.values()) / len(r)
        print(f"{name:24s} {t:9s} right {sum(right.values())} {right} words {words:.2f}")
    print(f"{name:24s} lost {len(lost)} (naming the contrast document's items: {wrong}), won {len(won)}")
