"""The A/B's rows: per run, host / LMDB-warm / LMDB-cold TTFT (median [min-max]) with their parts, and the target's
ratio (LMDB-warm speed-up over the host tier's = host median / warm median). Run: python summary.py out"""
import json, sys
from pathlib import Path
for f in sorted(Path(sys.argv[1]).glob("ttft-*.json")):
    d = json.loads(f.read_text())["ttft"][0]
    parts = []
    for k in ("linked_host", "linked_lmdb_warm", "linked_lmdb_cold"):
        x = d[k]
        parts.append("%s %.0f [%.0f-%.0f] (rows %.0f, forward %.0f)" % (k.split("_", 1)[1], x["total"]["median_s"] * 1e3,
                     x["total"]["min_s"] * 1e3, x["total"]["max_s"] * 1e3, x["rope_s"] * 1e3, x["link_forward_s"] * 1e3))
    ratio = d["linked_host"]["total"]["median_s"] / d["linked_lmdb_warm"]["total"]["median_s"]
    print(f.stem, "; ".join(parts), "; warm/host speed-up %.2f" % ratio)
