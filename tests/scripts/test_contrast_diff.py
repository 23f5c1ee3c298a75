"""scripts/contrast_diff.py: the contrast prompts of a shipping check, shipped artifact against candidate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def _write(folder: Path, tag: str, rows: list[tuple[int, str, float, str]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"index": i, "gold_position": p, "em": em, "answer": a}) for i, p, em, a in rows]
    (folder / f"contrast-{tag}.rows.jsonl").write_text("\n".join(lines) + "\n")


def test_summary_counts_right_lost_won_wrong_items_and_words(tmp_path, script):
    check = tmp_path / "run" / "ship-check"
    _write(check, "shipped", [(0, "first", 1.0, "a faulty heating element"), (0, "last", 1.0, "defects"),
                              (1, "first", 0.0, "a monthly membership")])
    # case 0's contrast document names "dropping"; case 1's gold answer names the pool
    _write(check, "candidate", [(0, "first", 1.0, "defects"), (0, "last", 0.0, "damage from dropping the kettle"),
                                (1, "first", 1.0, "the swimming pool")])
    lines = script("contrast_diff").summary(check, "run/ship-check")
    assert lines == [
        "run/ship-check           shipped   right 2 {'first': 1, 'last': 1} words 2.67",
        "run/ship-check           candidate right 2 {'first': 2, 'last': 0} words 3.00",
        "run/ship-check           lost 1 (naming the contrast document's items: 1), won 1",
    ]


def test_a_missing_or_interrupted_check_is_a_one_line_error(tmp_path, script):
    diff = script("contrast_diff")
    with pytest.raises(SystemExit, match="contrast-shipped.rows.jsonl not found"):
        diff.summary(tmp_path / "nothing", "x")
    check = tmp_path / "half"
    _write(check, "shipped", [(0, "first", 1.0, "defects"), (0, "last", 1.0, "defects")])
    _write(check, "candidate", [(0, "first", 1.0, "defects")])
    with pytest.raises(SystemExit, match="cover 1 prompts, the shipped artifact's 2"):
        diff.summary(check, "half")
