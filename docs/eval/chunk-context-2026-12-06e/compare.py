"""Paired accuracy of the chunk-context lanes on the questions both have answered (python3 compare.py)."""
import json
import pathlib

rows = {}
for f in pathlib.Path(__file__).parent.glob("long-*.rows.jsonl"):
    for line in open(f):
        r = json.loads(line)
        rows.setdefault(r["mode"], {})[r["index"]] = r["em"]
common = set.intersection(*(set(v) for v in rows.values()))
print(f"{len(common)} questions answered in every mode")
for m, v in sorted(rows.items()):
    print(f"{m:45s} {sum(v[i] for i in common) / max(1, len(common)):.3f}")
