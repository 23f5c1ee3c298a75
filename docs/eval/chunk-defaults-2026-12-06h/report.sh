#!/bin/bash
# The merged table of this folder (run from the repository root): the defaults' chunked rows against this machine
# class's one block of 2026-12-06g (Intel Xeon with AMX) -> merged.txt / merged.json; and rows.diff.txt, question by
# question against 2026-12-06g's run with the same settings given explicitly (FROM=cache, LINKS=last, FRAMES=first).
set -u
D=$(dirname "$0"); G=docs/eval/chunk-cache-2026-12-06g; R=${KV:-.venv/bin/kvlink-rag}
export COLUMNS=200
$R eval-report $D/long-defaults-0.rows.jsonl $D/long-defaults-150.rows.jsonl $G/long-block-0.rows.jsonl \
  $G/long-block-150.rows.jsonl --against "linked-query-lora one-block@amx" --json $D/merged.json > $D/merged.txt
${PY:-.venv/bin/python} - "$D" "$G" > $D/rows.diff.txt <<'PY'
import json, sys
d, g = sys.argv[1:]
def rows(paths):
    out = {}
    for p in paths:
        for line in open(p):
            r = json.loads(line)
            if r["mode"].startswith("linked-query-lora chunks=512"):
                out[r["index"]] = r
    return out
new = rows([f"{d}/long-defaults-{s}.rows.jsonl" for s in (0, 150)])
old = rows([f"{g}/long-cache-{s}.rows.jsonl" for s in (0, 150)])
both = sorted(set(new) & set(old))
print(f"questions in both: {len(both)}")
for field in ("answer", "em", "nll", "bytes_per_doc"):
    print(f"{field}: equal on {sum(new[i][field] == old[i][field] for i in both)}")
print(f"accuracy: defaults {sum(new[i]['em'] for i in both) / len(both):.3f}, explicit {sum(old[i]['em'] for i in both) / len(both):.3f}")
PY
