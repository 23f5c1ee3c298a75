"""The retention curve of an ``eval --retention`` run: accuracy, answer NLL, KV bytes per document and TTFT per
retention and method, as a markdown table and a PNG."""

from __future__ import annotations

import re
from pathlib import Path

_LABEL = re.compile(r"^(?P<mode>.+) r=(?P<r>[0-9.]+)(?: (?P<method>\w+))?$")


def curve(summary: dict) -> dict[str, dict[str, list[tuple[float, dict]]]]:
    """``{mode: {method: [(r, mode summary), ...] sorted by r}}`` from a :func:`training.eval.summarise` result
    whose mode labels are ``"<mode> r=<r> <method>"`` (r=1 belongs to every method)."""
    points: dict[str, dict[str, list[tuple[float, dict]]]] = {}
    full: dict[str, dict] = {}
    for label, s in summary["modes"].items():
        m = _LABEL.match(label)
        if m is None or m["method"] == "explain":
            continue
        r = float(m["r"])
        if r == 1.0:
            full[m["mode"]] = s
        else:
            points.setdefault(m["mode"], {}).setdefault(m["method"], []).append((r, s))
    for mode, s in full.items():
        for method in points.setdefault(mode, {"importance": []}).values():
            method.append((1.0, s))
    return {mode: {meth: sorted(pts, key=lambda p: p[0]) for meth, pts in by.items()} for mode, by in points.items()}


def retention_markdown(summary: dict) -> str:
    """Markdown table: per mode, method and retention: accuracy [95% CI], share of the r=1 accuracy, answer NLL,
    KV bytes per document, median TTFT, n."""
    head = ["mode", "method", "r", "accuracy [95% CI]", "vs r=1", "answer NLL", "KV bytes/doc", "median TTFT s", "n"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for mode, by in curve(summary).items():
        base = next((s["accuracy"] for pts in by.values() for r, s in pts if r == 1.0), 0.0)
        for method, pts in by.items():
            for r, s in pts:
                share = f"{s['accuracy'] / base:.0%}" if base else "-"
                lines.append("| " + " | ".join([
                    mode, method, f"{r:g}", f"{s['accuracy']:.3f} [{s['ci95'][0]:.3f}, {s['ci95'][1]:.3f}]", share,
                    f"{s['answer_nll']:.3f}", f"{s.get('bytes_per_doc', 0) / 1024:.0f} KiB", f"{s['ttft_s']:.3f}",
                    str(s["n"])]) + " |")
    return "\n".join(lines) + "\n"


def plot_retention(summary: dict, path: Path) -> None:
    """PNG: accuracy (95% CI) and answer NLL against retention, one line per method (first linked mode)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = curve(summary)
    if not data:
        return
    mode, by = next(iter(data.items()))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.6))
    for method, pts in by.items():
        rs = [r for r, _ in pts]
        acc = [s["accuracy"] for _, s in pts]
        err = [[a - s["ci95"][0] for a, (_, s) in zip(acc, pts)], [s["ci95"][1] - a for a, (_, s) in zip(acc, pts)]]
        ax1.errorbar(rs, acc, yerr=err, marker="o", capsize=3, label=method)
        ax2.plot(rs, [s["answer_nll"] for _, s in pts], marker="o", label=method)
    ax1.set_xlabel("retention r (fraction of each document's KV kept)")
    ax1.set_ylabel("accuracy (best_subspan_em)")
    ax2.set_xlabel("retention r")
    ax2.set_ylabel("answer NLL (nats/token)")
    ax1.set_title(mode, fontsize=9)
    ax1.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
