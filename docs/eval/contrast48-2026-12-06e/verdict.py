"""The shipping rule's verdict on the two candidates with the 96-prompt contrast check (this folder's rows) and
the validation NLL their ship checks measured in 2026-12-06d (docs/eval/polarity-2026-12-06d/ship-check*,
unchanged: the rule's validation inputs did not change).   .venv/bin/python docs/eval/contrast48-2026-12-06e/verdict.py
"""
import dataclasses
import json
import pathlib

from training.ship_rule import verdict

D = pathlib.Path("docs/eval/contrast48-2026-12-06e")
P = pathlib.Path("docs/eval/polarity-2026-12-06d")


def scores(name: str, mode: str) -> list[float]:
    rows = [json.loads(line) for line in (D / f"contrast-{name}.rows.jsonl").read_text().splitlines()]
    return [r["em"] for r in sorted((r for r in rows if r["mode"] == mode), key=lambda r: (r["index"], r["gold_position"]))]


def newcomer(name: str, mode: str) -> bool:
    rows = [json.loads(line) for line in (D / f"contrast-{name}.rows.jsonl").read_text().splitlines()]
    return all(r["em"] == 1.0 for r in rows if r["mode"] == mode and r["index"] == 0)


shipped = scores("shipped", "linked-query-lora@shipped")
out = {}
for name, check in (("polarity", P / "ship-check" / "verdict.json"), ("mixture", P / "ship-check-previous" / "verdict.json")):
    nll = json.loads(check.read_text())["validation_nll"]
    mode = f"linked-query-lora@{name}"
    v = verdict(nll["shipped"], nll["candidate"], shipped, scores(name, mode), newcomer(name, mode))
    out[name] = dataclasses.asdict(v)
print(json.dumps(out, indent=1))
