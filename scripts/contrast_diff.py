"""The shipping checks' contrast prompts side by side: per check folder (``scripts/ship_check.py --out``), the
prompts right per order for the shipped artifact and the candidate, the prompts the candidate lost and won, how
many lost answers name the contrast document's items, and the mean answer length in words.

    .venv/bin/python scripts/contrast_diff.py docs/eval/kv-weighted-2026-12-07e/ship-check [MORE_CHECK_DIRS...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from evaluation.contrast import CASES  # noqa: E402


def _rows(check: Path, tag: str) -> dict[tuple[int, str], dict]:
    path = check / f"contrast-{tag}.rows.jsonl"
    if not path.is_file():
        raise SystemExit(f"error: {path} not found (is {check} a ship_check.py --out folder?)")
    return {(r["index"], r["gold_position"]): r for r in map(json.loads, path.read_text().splitlines())}


def summary(check: Path, name: str, width: int = 24) -> list[str]:
    """The lines of one check folder, each starting with ``name`` padded to ``width``.

    Raises:
        SystemExit: a rows file is missing, or the two artifacts' rows cover other prompts (an interrupted check).
    """
    rows = {t: _rows(check, t) for t in ("shipped", "candidate")}
    s, c = rows["shipped"], rows["candidate"]
    if s.keys() != c.keys():
        raise SystemExit(f"error: {check}: the candidate's rows cover {len(c)} prompts, the shipped artifact's "
                         f"{len(s)}, not the same ones (an interrupted check?)")
    lost = [k for k in s if s[k]["em"] == 1 and c[k]["em"] == 0]
    won = [k for k in s if s[k]["em"] == 0 and c[k]["em"] == 1]
    wrong = sum(any(w.lower() in c[k]["answer"].lower() for w in CASES[k[0]].wrong) for k in lost)
    out = []
    for t, r in rows.items():
        right = {p: int(sum(x["em"] for k, x in r.items() if k[1] == p)) for p in ("first", "last")}
        words = sum(len(x["answer"].split()) for x in r.values()) / len(r)
        out.append(f"{name:{width}s} {t:9s} right {sum(right.values())} {right} words {words:.2f}")
    out.append(f"{name:{width}s} lost {len(lost)} (naming the contrast document's items: {wrong}), won {len(won)}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description="The contrast prompts of shipping checks side by side.")
    ap.add_argument("checks", nargs="+", type=Path, help="ship_check.py --out folders")
    a = ap.parse_args()
    checks = [c.resolve() for c in a.checks]
    root = Path(os.path.commonpath(checks))
    root = root.parent if root in checks else root  # names relative to the folder above them all
    names = [str(check.relative_to(root)) for check in checks]
    width = max(24, *map(len, names))
    for check, name in zip(checks, names):
        print("\n".join(summary(check, name, width)))


if __name__ == "__main__":
    main()
