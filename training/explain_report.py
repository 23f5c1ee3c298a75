"""Attribution quality of an ``eval --explain`` run: how often the gold passage's document gets the highest
attribution among the documents (random: 1 / documents), overall and on correctly answered questions, and
what explaining costs in TTFT (paired against the same mode at r=1 without capture)."""

from __future__ import annotations

from statistics import median

from .eval import bootstrap_ci


def _top(values: list[float]) -> int:
    return max(range(len(values)), key=lambda i: values[i])


def gold_top_rates(rows: list[dict]) -> dict[str, dict]:
    """Per explained mode: ``{"share": (rate, lo, hi), "peak": (rate, lo, hi), "share_correct": ..., "n",
    "n_correct", "docs"}``: gold document ranked first by its attention share, and by its top passage's mass."""
    out: dict[str, dict] = {}
    for mode in sorted({r["mode"] for r in rows if "attribution" in r}):
        sel = [r for r in rows if r["mode"] == mode and "attribution" in r]
        share = [float(_top(r["attribution"]) == r["gold_slot"]) for r in sel]
        peak = [float(_top(r["passage_peak"]) == r["gold_slot"]) for r in sel]
        correct = [s for s, r in zip(share, sel) if r["em"] > 0]
        out[mode] = {"n": len(sel), "n_correct": len(correct), "docs": len(sel[0]["attribution"]) if sel else 0}
        for name, vals in (("share", share), ("peak", peak), ("share_correct", correct)):
            lo, hi = bootstrap_ci(vals)
            out[mode][name] = (sum(vals) / len(vals) if vals else 0.0, lo, hi)
    return out


def explain_overhead(rows: list[dict]) -> dict[str, tuple[float, float, int]]:
    """Per explained mode ``"<m> r=1 explain"``: ``(median TTFT explained, median TTFT of "<m> r=1", n)``
    over the questions both answered."""
    out = {}
    for mode in {r["mode"] for r in rows if r["mode"].endswith(" explain")}:
        base = mode[: -len(" explain")]
        a = {(r["index"], r["gold_position"]): r["ttft_s"] for r in rows if r["mode"] == mode}
        b = {(r["index"], r["gold_position"]): r["ttft_s"] for r in rows if r["mode"] == base}
        keys = sorted(a.keys() & b.keys())
        if keys:
            out[mode] = (median(a[k] for k in keys), median(b[k] for k in keys), len(keys))
    return out


def attribution_markdown(rows: list[dict]) -> str:
    """Markdown table of :func:`gold_top_rates` and :func:`explain_overhead`."""
    head = ["mode", "gold doc top by share [95% CI]", "by top-passage mass", "share, correct answers", "random",
            "median TTFT explained / plain", "n"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    overhead = explain_overhead(rows)

    def cell(t) -> str:
        return f"{t[0]:.3f} [{t[1]:.3f}, {t[2]:.3f}]"

    for mode, s in gold_top_rates(rows).items():
        ttft = overhead.get(mode)
        cost = f"{ttft[0]:.3f} s / {ttft[1]:.3f} s ({ttft[0] / ttft[1] - 1:+.0%})" if ttft else "-"
        lines.append("| " + " | ".join([mode, cell(s["share"]), cell(s["peak"]),
                                        f"{cell(s['share_correct'])} (n={s['n_correct']})",
                                        f"{1 / max(1, s['docs']):.3f}", cost, str(s["n"])]) + " |")
    return "\n".join(lines) + "\n"


def method_rates(rows: list[dict]) -> dict[str, dict]:
    """Per attribution method of :mod:`training.attribution_eval` rows (``attention``, ``loo``): ``{"top1":
    (rate, lo, hi), "top1_correct": (rate, lo, hi), "n_correct", "seconds": mean extra seconds per question,
    "n_timed", "n"}``; top-1 is the gold slot holding the highest score (ties: the first slot). The attention's
    extra seconds are explained minus plain answer time, over the rows that timed a plain answer."""
    out: dict[str, dict] = {}
    plain = [r for r in rows if r.get("plain_s") is not None]
    cost = {"attention": [r["explain_s"] - r["plain_s"] for r in plain], "loo": [r["loo_s"] for r in rows]}
    for method, seconds in cost.items():
        top = [float(_top(r[method]) == r["gold_slot"]) for r in rows]
        correct = [t for t, r in zip(top, rows) if r["em"] > 0]
        out[method] = {"n": len(rows), "n_correct": len(correct), "n_timed": len(seconds),
                       "seconds": sum(seconds) / max(1, len(seconds))}
        for name, vals in (("top1", top), ("top1_correct", correct)):
            lo, hi = bootstrap_ci(vals)
            out[method][name] = (sum(vals) / len(vals) if vals else 0.0, lo, hi)
    return out


def methods_markdown(rows: list[dict]) -> str:
    """Markdown table of :func:`method_rates` (mean plain-answer seconds in the header)."""
    names = {"attention": "attention share (capture while answering)", "loo": "leave-one-document-out"}
    timed = [r["plain_s"] for r in rows if r.get("plain_s") is not None]
    plain = sum(timed) / max(1, len(timed))
    lines = ["| method | gold doc top-1 [95% CI] | top-1, correct answers | extra s / question "
             f"(plain answer {plain:.2f} s) | n (timed) |", "|---|---|---|---|---|"]
    for m, s in method_rates(rows).items():
        t, c = s["top1"], s["top1_correct"]
        lines.append(f"| {names[m]} | {t[0]:.3f} [{t[1]:.3f}, {t[2]:.3f}] | {c[0]:.3f} [{c[1]:.3f}, {c[2]:.3f}] "
                     f"(n={s['n_correct']}) | {s['seconds']:.2f} | {s['n']} ({s['n_timed']}) |")
    exp, loo = [r["explain_s"] for r in rows], [r["loo_s"] for r in rows]
    if rows:
        lines += ["", f"Medians, seconds per question: plain answer {median(timed) if timed else float('nan'):.2f} "
                  f"(n={len(timed)}), the same answer under attention capture {median(exp):.2f}, leave-one-out after "
                  f"it {median(loo):.2f} (n={len(rows)})."]
    return "\n".join(lines) + "\n"
