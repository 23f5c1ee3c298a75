"""``kvlink-rag explain``: which documents and passages an answer drew on, printed and as a token heatmap PNG;
also the printing and option checks behind ``ask --explain`` and ``--retention``."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from cli.common import DtypeOpt, EncOpt, KOpt, fail, make_engine, make_settings, out, results_only_stdout

if TYPE_CHECKING:
    from kvlink_rag.explain.attribution import Attribution
    from kvlink_rag.types import Document

app = typer.Typer()

RetentionOpt = Annotated[Optional[float], typer.Option(
    help="Fraction of each document's cached tokens kept (0 < r <= 1; default KVLINK_RAG_RETENTION): the most "
    "important ones at their original positions.")]


def _checked(value: float, option: str, check) -> float:
    """``check(value)``, else a one-line error naming ``option`` and exit (before the model loads)."""
    try:
        return check(value)
    except ValueError as e:
        fail(f"{option}: {e}")


def checked_retention(retention: float | None) -> float | None:
    """``retention`` when in (0, 1] (or None), else a one-line error and exit (before the model loads)."""
    if retention is None:
        return None
    from kvlink_rag.bounds import check_retention

    return _checked(retention, "--retention", check_retention)


RecomputeOpt = Annotated[Optional[float], typer.Option(
    "--recompute-ratio", help="CacheBlend: fraction of document tokens (0..1; default KVLINK_RAG_RECOMPUTE_RATIO) "
    "recomputed in the joined context, those whose reused KV deviates most.")]


def checked_recompute(ratio: float | None) -> float | None:
    """``ratio`` when in [0, 1] (or None), else a one-line error and exit (before the model loads)."""
    if ratio is None:
        return None
    from kvlink_rag.bounds import check_recompute_ratio

    return _checked(ratio, "--recompute-ratio", check_recompute_ratio)


METHOD_TEXT = {"attention": "share of the question and answer tokens' attention",
               "leave_one_out": "share of the answer log-likelihood lost when the document is left out"}

AttributionOpt = Annotated[Optional[str], typer.Option(
    "--attribution", help="leave_one_out (one more link forward per document) or attention (default "
    "KVLINK_RAG_ATTRIBUTION); passages come from the attention either way.")]


def checked_attribution(method: str | None) -> str | None:
    """``method`` when one of the attribution methods (or None), else a one-line error and exit."""
    from kvlink_rag.settings import ATTRIBUTION_METHODS

    if method is not None and method not in ATTRIBUTION_METHODS:
        fail(f"--attribution {method!r}: must be one of {', '.join(ATTRIBUTION_METHODS)}")
    return method


def print_attribution(att: Attribution, documents: list[Document], method: str = "attention") -> None:
    """Per document: its share, title, and top passages quoted (character offsets in brackets)."""
    from kvlink_rag.encodable import normalize_text

    out.print(f"[bold]attribution[/bold] ({METHOD_TEXT[method]}); system prompt's attention share "
              f"{att.prefix:.1%}")
    order = sorted(range(len(documents)), key=lambda i: -att.documents[i].share)
    for i in order:
        d, a = documents[i], att.documents[i]
        out.print(f"  {a.share:6.1%}  doc {i + 1}: {(d.title or normalize_text(d.text))[:60]}")
        text = normalize_text(d.text)
        for start, end, share in a.passages:
            out.print(f"          [{start}:{end}] ({share:.0%}) \"{text[start:end].strip()[:100]}\"")


def attribution_dict(att: Attribution) -> dict:
    """JSON-able attribution (:func:`kvlink_rag.explain.answers.attribution_json`)."""
    from kvlink_rag.explain.answers import attribution_json

    return attribution_json(att)


def draw_heatmap(att: Attribution, documents: list[Document], path: Path, method: str = "attention") -> None:
    """PNG: one row per document, one cell per token, colour = the token's share of that document's attention
    mass (white: none, or a token not kept by retention); rows labelled ``doc i``, the document's share by
    ``method`` and its title; a colour bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch

    width = max(a.token_mass.numel() for a in att.documents)
    grid = torch.full((len(documents), width), float("nan"))
    for i, a in enumerate(att.documents):
        total = float(a.token_mass.sum()) or 1.0
        grid[i, : a.token_mass.numel()] = a.token_mass / total
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(documents) + 1.2))
    im = ax.imshow(grid.numpy(), aspect="auto", cmap="viridis", interpolation="nearest")
    ax.set_yticks(range(len(documents)))
    ax.set_yticklabels([f"doc {i + 1}  {a.share:.0%}  {(d.title or d.text)[:28]}"
                        for i, (d, a) in enumerate(zip(documents, att.documents))], fontsize=7)
    ax.set_ylabel(f"document (share: {method.replace('_', '-')})", fontsize=8)
    ax.set_xlabel("document token")
    ax.set_title(f"attention of question + answer tokens per document token (system prompt {att.prefix:.0%})",
                 fontsize=9)
    fig.colorbar(im, ax=ax, label="share of the document's mass")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


@app.command()
def explain(
    question: Annotated[Optional[str], typer.Argument(help="The question (omit with --nq).")] = None,
    doc: Annotated[list[Path], typer.Option("--doc", help="A document file; repeat for several.")] = [],
    nq: Annotated[Optional[Path], typer.Option("--nq", "--data", help="NQ-open oracle JSONL(.gz): question --index.")] = None,
    index: Annotated[int, typer.Option(help="Question index in --nq.")] = 0,
    docs: Annotated[int, typer.Option("--docs", help="Documents per question with --nq (gold + distractors).")] = 10,
    gold_position: Annotated[str, typer.Option(help="first | middle | last | random")] = "random",
    k: KOpt = None, encoding: EncOpt = None, kv_dtype: DtypeOpt = None, retention: RetentionOpt = None,
    attribution: AttributionOpt = None,
    png: Annotated[Optional[Path], typer.Option("--png", help="Write a token heatmap per document here.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output (only JSON on stdout).")] = False,
) -> None:
    """Answer linked and show which documents and passages the answer drew on.

    Each document's share by --attribution: leave_one_out (the answer's log-likelihood lost without it) or
    attention (the question and answer tokens' attention), with each document's most-attended passages;
    --png draws every document's tokens as a heatmap.
    """
    from cli.documents import FIT_HINT, NQ_HINT, ask_inputs, check_fits
    from kvlink_rag.explain.answers import explain_answer
    from kvlink_rag.explain.leave_one_out import apply_leave_one_out, leave_one_out

    retention = checked_retention(retention)
    method = checked_attribution(attribution)
    question, documents, gold = ask_inputs(question, doc, nq, index, docs, gold_position)
    engine = make_engine(make_settings(k, encoding, kv_dtype), adhoc=True)
    method = method or engine.settings.attribution
    check_fits(engine, question, documents, NQ_HINT if nq else FIT_HINT)  # before any document is encoded
    with results_only_stdout():
        try:
            for d in documents:  # precompute outside the timed answer: each chunk, as the answer links them
                engine.warm(d)
            t0 = time.perf_counter()
            answer, att = explain_answer(engine, question, documents, retention=retention)
            if method == "leave_one_out":
                loo = leave_one_out(engine, question, documents, answer.token_ids, retention=retention)
                att = apply_leave_one_out(att, loo)
        except ValueError as e:
            fail(str(e))
    if png is not None:
        draw_heatmap(att, documents, png, method)
    if as_json:
        print(json.dumps({"question": question, "answer": answer.text, "gold_answers": gold,
                          "seconds": time.perf_counter() - t0,
                          "attribution": {**attribution_dict(att), "method": method}}, indent=2))
        return
    out.print(f"[bold]Q:[/bold] {question}\n[bold]A:[/bold] {answer.text}" + (f"   [dim]gold: {gold}[/dim]" if gold else ""))
    print_attribution(att, documents, method)
    if png is not None:
        out.print(f"heatmap: {png}")


@app.command("attribution-eval")
def attribution_eval(
    nq: Annotated[Path, typer.Option("--nq", "--data", help="NQ-open oracle JSONL(.gz).")],
    rows: Annotated[Path, typer.Option(help="Row file (JSONL; appended, a stopped run resumes).")],
    n: Annotated[int, typer.Option(help="Questions 0..n-1 (gold position rotated first/middle/last).")] = 300,
    start: Annotated[int, typer.Option(help="First question (a shard; merge shards with --report).")] = 0,
    docs: Annotated[int, typer.Option("--docs", help="Documents per question (gold + distractors).")] = 10,
    report: Annotated[list[Path], typer.Option(help="Only print the table of these row files (no model).")] = [],
) -> None:
    """Attention share against leave-one-document-out: how often each ranks the gold passage's document
    first, and its extra seconds per question, on the same linked answers (the engine's link tokens)."""
    import json as _json

    from training.explain_report import methods_markdown

    if report:
        try:
            print(methods_markdown([_json.loads(x) for p in report for x in p.read_text().splitlines() if x.strip()]))
        except (OSError, ValueError, KeyError) as e:
            fail(f"--report: {e}")
        return
    if not 0 <= start < n:
        fail(f"--start {start}: must be at least 0 and below --n ({n})")
    from evaluation.nq import DataFormatError, load_nq
    from training.attribution_eval import run_attribution_eval

    try:
        examples = load_nq(nq)
    except (OSError, DataFormatError) as e:
        fail(str(e))
    engine = make_engine(make_settings(), adhoc=True)
    done = run_attribution_eval(engine, examples, n, docs, rows, start=start,
                                progress=lambda r: out.print(f"question {r['index']}: loo {r['loo_s']:.1f} s"))
    print(methods_markdown(done))
