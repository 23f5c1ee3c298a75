"""Answer-quality commands of the ``kvlink-rag`` CLI: eval and eval-report (train-links: :mod:`cli.train`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from cli.common import (NQ_DEFAULT, DtypeOpt, EncOpt, KOpt, NqOpt, checked_doc_cache, doc_cache_engine, fail,
                        make_settings, out, progress_bar, results_only_stdout)
from cli.eval_options import (ADAPTED, EvalDocCacheOpt, PositionsOpt, RatiosOpt, StartOpt, TagOpt, TaskOpt,
                              MinRelativeOpt, MinScoreOpt, RetrieveOpt, chunk_sizes, eval_choices, new_tokens, retrieving,
                              question_step, retention_variants, task_engines, task_examples, too_long_exits,
                              with_blend_ratios)
from training.modes import MODES

if TYPE_CHECKING:
    from kvlink_rag.engine import Engine
    from service.settings import Settings

app = typer.Typer()


def print_summary(summary: dict, title: str) -> None:
    """The per-mode table (accuracy, 95% CI, answer NLL, median TTFT, n) and, with several gold
    positions, one accuracy column per position."""
    positions = [p for p in ("first", "middle", "last", "random") if p in summary.get("by_position", {})]
    table = Table(title=title, min_width=100)
    for col in ("mode", "accuracy", "95% CI", "answer NLL", "TTFT s (median)", "n"):
        table.add_column(col)
    if len(positions) > 1:
        for p in positions:
            table.add_column(f"acc. {p}")
    for m, s in summary["modes"].items():
        cells = [m, f"{s['accuracy']:.3f}", f"[{s['ci95'][0]:.3f}, {s['ci95'][1]:.3f}]",
                 f"{s['answer_nll']:.3f}", f"{s['ttft_s']:.3f}", str(s["n"])]
        if len(positions) > 1:
            cells += [f"{summary['by_position'][p][m]['accuracy']:.3f}" if m in summary["by_position"][p] else "-"
                      for p in positions]
        table.add_row(*cells)
    (out if out.is_terminal else Console(width=160, soft_wrap=True)).print(table)  # no squeezed columns in logs


@app.command("eval")
def eval_cmd(
    data: NqOpt = NQ_DEFAULT,
    task: TaskOpt = "nq",
    pairs_per_doc: Annotated[int, typer.Option(help="kv-retrieval: key-value pairs per document.")] = 2,
    n: Annotated[int, typer.Option(help="Questions to evaluate (the first n).")] = 50,
    start: StartOpt = 0, doc_cache: EvalDocCacheOpt = "memory", tag: TagOpt = "",
    docs: Annotated[int, typer.Option("--docs")] = 10,
    gold_position: PositionsOpt = "random",
    modes: Annotated[str, typer.Option(help="Comma list of " + ", ".join(MODES) + ".")] = "full,naive,linked-untrained",
    k: KOpt = None, encoding: EncOpt = None, kv_dtype: DtypeOpt = None,
    links: Annotated[Optional[Path], typer.Option(help="Trained link tokens (mode 'linked').")] = None,
    adapter: Annotated[Optional[Path], typer.Option(help="Link tokens + query-side LoRA, a file or a named adapter (modes full-adapted, linked-query-lora).")] = None,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Write the summary JSON here (rows beside it, .json replaced by .rows.jsonl; a rerun resumes).")] = None,
    plot: Annotated[Optional[Path], typer.Option(help="PNG of accuracy by gold position per mode.")] = None,
    max_new_tokens: Annotated[Optional[int], typer.Option(help="Default 24; 100 for kv-retrieval.")] = None,
    int8: Annotated[bool, typer.Option("--int8", help="Serve document caches through an int8 LMDB store.")] = False,
    seed: Annotated[int, typer.Option(help="Seed of the distractor draw and the bootstrap.")] = 0, recompute_ratio: RatiosOpt = None,
    retention: Annotated[Optional[str], typer.Option(help="Comma list of retentions (0 < r <= 1) every linked mode "
                                                     "runs at (fraction of each document's tokens kept).")] = None,
    retention_methods: Annotated[str, typer.Option(help="Comma list of importance, random, recency: which tokens "
                                                   "a retention below 1 keeps.")] = "importance",
    explain: Annotated[bool, typer.Option("--explain", help="Also run every linked mode explained (attention "
                                          "captured): per-document attribution, the gold passage's rank, and "
                                          "the TTFT cost of explaining.")] = False,
    chunk_tokens: Annotated[Optional[str], typer.Option(help="long-docs: comma list of chunk sizes linked modes run at (0 = one block; default 0,512).")] = None, retrieve: RetrieveOpt = 0,
    min_relative_score: MinRelativeOpt = 0.0, min_score: MinScoreOpt = 0.0) -> None:
    """Accuracy, answer NLL and TTFT per mode on multi-document NQ or key-value retrieval.

    Accuracy is best_subspan_em (kv-retrieval: exact match) with a 95% bootstrap interval; TTFT is the median.
    --retention adds KV bytes per document per retention and method; --explain the attribution of the gold passage.
    """
    options = dict(locals())  # the command's arguments, recorded in --json's settings
    wanted, positions = eval_choices(modes, gold_position, links, adapter)
    sizes, max_new_tokens = chunk_sizes(task, chunk_tokens), new_tokens(task, max_new_tokens)
    variants = with_blend_ratios(retention_variants(wanted, retention, retention_methods, explain), recompute_ratio)
    examples, build, metric, title = task_examples(task, data, n, docs, pairs_per_doc, seed)  # before torch loads
    from training.eval import evaluate, position_for, summarise
    n = min(n, len(examples))
    build, recall = retrieving(task, retrieve, (min_relative_score, min_score), build, examples, n, start, docs, positions, seed)
    stored_docs = _check_run(start, n, doc_cache, task, int8, retention)
    settings = make_settings(k, encoding, kv_dtype, shipped_links=False)  # base = untrained link tokens
    by_mode = _eval_engines(settings, wanted, links, adapter, int8, stored_docs)
    engines, wanted = task_engines(task, sizes, {label: by_mode[mode] for label, (mode, _) in variants.items()})
    with progress_bar(f"evaluating {n - start} questions x {len(positions)} positions", (n - start) * len(positions)) as bar, \
            results_only_stdout(), too_long_exits():
        rows = evaluate(engines, examples, n, docs, positions, seed, max_new_tokens,
                        json_out.with_suffix(".rows.jsonl") if json_out is not None else None,
                        question_step(bar, engines, task), {lab: ret for lab, (_, ret) in variants.items() if ret is not None},
                        build, metric, start, f"@{tag}" if tag else "")
    if tag:
        wanted = [f"{m}@{tag}" for m in wanted]
    actual = {position_for(p, i) for p in positions for i in range(start, n)}
    rows = [r for r in rows if start <= r["index"] < n and r["mode"] in wanted and r["gold_position"] in actual]
    summary = summarise(rows, seed)
    print_summary(summary, f"{title}, {n - start} questions{f' ({start}-{n - 1})' if start else ''}, {docs} {'passages in one document' if sizes else 'documents'}, "
                           f"gold {gold_position}, {settings.encoding}, K={settings.link_k}")
    if json_out is not None:
        run = _run_settings(options, settings, metric, n=n, gold_positions=positions, max_new_tokens=max_new_tokens)
        json_out.write_text(json.dumps({**summary, **recall, "settings": run}, indent=2))
    _eval_reports(summary, rows, plot, retention is not None, explain)


def _run_settings(args: dict, settings: Settings, metric, **resolved) -> dict:
    """The ``settings`` block of ``eval --json``: the command's ``args`` (its parameters by name) as run, with
    the ``resolved`` values (``n`` capped at the questions there are, ``gold_positions``, ``max_new_tokens``)."""
    a = {**args, **resolved}
    task = a["task"]
    extra = ({"pairs_per_doc": a["pairs_per_doc"]} if task == "kv-retrieval"
             else {"chunk_tokens": a["chunk_tokens"]} if task == "long-docs" else {})
    return dict(n=a["n"], start=a["start"], tag=a["tag"] or None, docs=a["docs"], gold_positions=a["gold_positions"],
                encoding=settings.encoding, link_k=settings.link_k, kv_dtype=settings.kv_dtype, seed=a["seed"],
                data=str(a["data"]), links=str(a["links"]) if a["links"] else None,
                adapter=str(a["adapter"]) if a["adapter"] else None, max_new_tokens=a["max_new_tokens"],
                int8=a["int8"], retention=a["retention"], retention_methods=a["retention_methods"],
                recompute_ratio=a["recompute_ratio"], task=task, metric=metric.__name__, retrieve=a["retrieve"] or None,
                min_relative_score=a["min_relative_score"], min_score=a["min_score"], **extra)

def _eval_reports(summary: dict, rows: list[dict], plot: Path | None, retention: bool, explain: bool) -> None:
    """``--plot``: accuracy by gold position, and with ``--retention`` the retention curve beside it
    (``<plot>-retention.png``) and its markdown table on stdout; with ``--explain`` the attribution table."""
    from training.eval import plot_by_position

    if explain:
        from training.explain_report import attribution_markdown

        out.print(attribution_markdown(rows))
    if retention:
        from training.retention_report import plot_retention, retention_markdown

        out.print(retention_markdown(summary))
        if plot is not None:
            plot_retention(summary, plot.with_name(plot.stem + "-retention.png"))
    if plot is not None:
        plot_by_position(summary, plot)


def _artifact_path(settings: Settings, path: Path) -> Path:
    """``path``, or the named adapter when ``path`` is a name: ``$KVLINK_RAG_HOME/links/NAME.safetensors``, else
    the package's bundled adapter of that name (its model is checked when it loads)."""
    if path.exists() or path.suffix == ".safetensors":
        return path
    from kvlink_rag.adapter_registry import adapter_path, find_adapter
    from kvlink_rag.linking.link_tokens import BUNDLED

    try:
        bundled = {p.stem: p for p in BUNDLED.glob("*.safetensors")}
        return find_adapter(settings.links_dir, str(path), bundled) or adapter_path(settings.links_dir, str(path))
    except ValueError as e:
        fail(str(e))


def _check_run(start: int, n: int, doc_cache: str, task: str, int8: bool, retention: str | None) -> bool:
    """``--start`` within the ``n`` questions and ``--doc-cache`` checked (True: ``store``, which holds r=1
    caches of NQ passages: kv-retrieval's are throw-away, --int8 has a store of its own, and retention needs
    records written with importance scores); or exit."""
    if not 0 <= start < n:
        fail(f"--start {start}: must be at least 0 and below --n ({n})")
    stored = checked_doc_cache(doc_cache)
    if stored and (task == "kv-retrieval" or int8 or retention is not None):
        fail("--doc-cache store takes whole caches of nq or long-docs passages: not with --task kv-retrieval, "
             "--int8 or --retention")
    return stored


def _eval_engines(settings: Settings, wanted: list[str], links: Path | None, adapter: Path | None,
                  int8: bool, stored_docs: bool = False) -> dict[str, Engine]:
    """One engine per mode: the base engine (untrained link tokens, documents cached in memory, with
    ``stored_docs`` in the store under ``settings.home``, or with ``int8`` in a throw-away int8 store) and,
    sharing its model and cache, the trained artifacts'."""
    from kvlink_rag.linking.link_tokens import load_link_tokens

    paths = {m: _artifact_path(settings, links if m == "linked" else adapter) for m in wanted
             if m == "linked" or m in ADAPTED}  # names resolved before the model loads
    base = doc_cache_engine(settings, stored_docs)
    if int8:  # caches are served as the int8 round trip
        import tempfile

        from service.runtime import build_runtime

        tmp_home = Path(tempfile.mkdtemp(prefix="kvlink-eval-int8-"))
        build_runtime(settings.model_copy(update={"home": tmp_home, "store_int8": True}), base, queue="none",
                      recover=False)  # base.cache is now the store's
    trained: dict[Path, Engine] = {}
    for path in dict.fromkeys(paths.values()):  # same model, prefix and document cache as the base engine
        try:
            trained[path] = base.with_link_tokens(load_link_tokens(path, base.lm))
        except (ValueError, FileNotFoundError) as e:
            fail(str(e))
    return {m: trained[paths[m]] if m in paths else base for m in wanted}


@app.command("eval-report")
def eval_report(
    rows: Annotated[list[Path], typer.Argument(help="Row files (<json>.rows.jsonl) of one or more eval runs.")],
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Write the merged summary JSON here.")] = None,
    plot: Annotated[Optional[Path], typer.Option(help="PNG of accuracy by gold position per mode.")] = None,
    markdown: Annotated[Optional[Path], typer.Option(help="Write the table as markdown here.")] = None,
    against: Annotated[Optional[str], typer.Option(help="Also print every mode's paired accuracy difference "
                                                   "to this mode (and to 95% of it) and answer-NLL difference, "
                                                   "with 95% intervals.")] = None,
    seed: Annotated[int, typer.Option()] = 0,
) -> None:
    """Merge the rows of several eval runs into one table.

    E.g. modes run in parallel processes, each with its own --json rows file.
    """
    from training.eval import paired_difference, plot_by_position, read_rows, summarise, summary_markdown

    try:
        merged = read_rows(rows)
    except ValueError as e:
        fail(str(e))
    summary = summarise(merged, seed)
    n = len({r["index"] for r in merged})
    print_summary(summary, f"{_tasks_of(rows)}, {n} questions, merged from {len(rows)} row file(s)")
    if against is not None:
        if against not in summary["modes"]:
            fail(f"--against {against!r}: no rows of that mode; modes: {', '.join(summary['modes'])}")
        for m in summary["modes"]:
            if m == against:
                continue
            for scale in (1.0, 0.95):
                d, lo, hi = paired_difference(merged, m, against, scale, seed=seed)
                out.print(f"{m} - {scale:g} x {against}: {d:+.3f} [{lo:+.3f}, {hi:+.3f}]")
            d, lo, hi = paired_difference(merged, m, against, seed=seed, field="nll")
            out.print(f"{m} - {against}, answer NLL: {d:+.3f} [{lo:+.3f}, {hi:+.3f}] nats/token")
    if json_out is not None:
        json_out.write_text(json.dumps({**summary, "settings": {"rows": [str(p) for p in rows]}}, indent=2))
    if plot is not None:
        plot_by_position(summary, plot)
    if markdown is not None:
        markdown.write_text(summary_markdown(summary))


def _tasks_of(rows: list[Path]) -> str:
    """The task(s) of row files, from the summary JSON beside each (``x.rows.jsonl`` -> ``x.json``,
    ``settings.task``; NQ-open where a summary names none, as before tasks were recorded). A file without a readable
    summary (a run stopped before its end writes none) names no task; "task not recorded" when none does."""
    names = []
    for path in rows:
        summary = path.with_name(path.name.removesuffix(".rows.jsonl") + ".json")
        try:
            task = json.loads(summary.read_text()).get("settings", {}).get("task", "nq")
        except (OSError, ValueError, AttributeError):
            continue
        names.append("NQ-open" if task in (None, "nq") else str(task))
    return " + ".join(dict.fromkeys(names)) or "task not recorded"  # each task once, in order
