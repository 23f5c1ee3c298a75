"""Answer-quality commands of the ``kvlink-rag`` CLI: eval, train-links, eval-report."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from cli.common import (NQ_DEFAULT, DtypeOpt, EncOpt, KOpt, NqOpt, console, fail, make_engine, make_settings, out,
                        progress_bar, results_only_stdout)
from kvlink_rag.types import ContextTooLong
from training.modes import EVAL_POSITIONS, MODES

if TYPE_CHECKING:
    from kvlink_rag.engine import Engine
    from kvlink_rag.settings import Settings

app = typer.Typer()
ADAPTED = ("full-adapted", "linked-query-lora")
TaskOpt = Annotated[str, typer.Option(help="nq; kv-retrieval (generated UUID key-value pairs, exact match); "
                                      "long-docs (the --docs passages joined into ONE document).")]  # the modes that take --adapter
RatiosOpt = Annotated[Optional[str], typer.Option(
    "--recompute-ratio", help="Comma list of CacheBlend recompute ratios in [0, 1]: naive runs as cacheblend-X, "
    "a linked mode as <mode>+blend-X (0: the mode itself).")]


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
    docs: Annotated[int, typer.Option("--docs")] = 10,
    gold_position: Annotated[str, typer.Option(help="Comma list of first, middle, last, random, rotate "
                                               "(question i at first/middle/last in turn).")] = "random",
    modes: Annotated[str, typer.Option(help="Comma list of " + ", ".join(MODES) + ".")] = "full,naive,linked-untrained",
    k: KOpt = None, encoding: EncOpt = None, kv_dtype: DtypeOpt = None,
    links: Annotated[Optional[Path], typer.Option(help="Trained link tokens (mode 'linked').")] = None,
    adapter: Annotated[Optional[Path], typer.Option(help="Link tokens + query-side LoRA, a file or a named adapter (modes full-adapted, linked-query-lora).")] = None,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Write the summary JSON here (rows go to <json>.rows.jsonl; a rerun resumes).")] = None,
    plot: Annotated[Optional[Path], typer.Option(help="PNG of accuracy by gold position per mode.")] = None,
    max_new_tokens: Annotated[int, typer.Option()] = 24,
    int8: Annotated[bool, typer.Option("--int8", help="Serve document caches through an int8 LMDB store.")] = False,
    seed: Annotated[int, typer.Option(help="Seed of the distractor draw and the bootstrap.")] = 0, recompute_ratio: RatiosOpt = None,
    retention: Annotated[Optional[str], typer.Option(help="Comma list of retentions (0 < r <= 1) every linked mode "
                                                     "runs at (fraction of each document's tokens kept).")] = None,
    retention_methods: Annotated[str, typer.Option(help="Comma list of importance, random, recency: which tokens "
                                                   "a retention below 1 keeps.")] = "importance",
    explain: Annotated[bool, typer.Option("--explain", help="Also run every linked mode explained (attention "
                                          "captured): per-document attribution, the gold passage's rank, and "
                                          "the TTFT cost of explaining.")] = False,
    chunk_tokens: Annotated[str, typer.Option(help="long-docs: comma list of chunk sizes linked modes run at (0 = one block).")] = "0,512",
) -> None:
    """Accuracy, answer NLL and TTFT per mode on multi-document NQ or key-value retrieval.

    Accuracy is best_subspan_em (kv-retrieval: exact match) with a 95% bootstrap interval; TTFT is the median.
    --retention adds KV bytes per document per retention and method; --explain the attribution of the gold passage.
    """
    wanted, positions = _eval_choices(modes, gold_position, links, adapter)
    sizes = _task_sizes(task, chunk_tokens)
    variants = _blend_variants(_retention_variants(wanted, retention, retention_methods, explain), recompute_ratio)
    examples, build, metric, title = _eval_task(task, data, n, docs, pairs_per_doc, seed)
    from training.eval import evaluate, position_for, summarise

    n = min(n, len(examples))
    settings = make_settings(k, encoding, kv_dtype, shipped_links=False)  # base = untrained link tokens
    by_mode = _eval_engines(settings, wanted, links, adapter, int8)
    engines, wanted = _task(task, sizes, {label: by_mode[mode] for label, (mode, _) in variants.items()})
    with progress_bar(f"evaluating {n} questions x {len(positions)} positions", n * len(positions)) as bar, \
            results_only_stdout(), _too_long_exits():
        rows = evaluate(engines, examples, n, docs, positions, seed, max_new_tokens,
                        json_out.with_suffix(".rows.jsonl") if json_out is not None else None, _step(bar, engines, task), {lab: ret for lab, (_, ret) in variants.items() if ret is not None},
                        build, metric)
    actual = {position_for(p, i) for p in positions for i in range(n)}
    rows = [r for r in rows if r["index"] < n and r["mode"] in wanted and r["gold_position"] in actual]
    summary = summarise(rows, seed)
    print_summary(summary, f"{title}, {n} questions, {docs} {'passages in one document' if sizes else 'documents'}, "
                           f"gold {gold_position}, {settings.encoding}, K={settings.link_k}")
    if json_out is not None:
        run = dict(n=n, docs=docs, gold_positions=positions, encoding=settings.encoding, link_k=settings.link_k,
                   kv_dtype=settings.kv_dtype, seed=seed, data=str(data), links=str(links) if links else None,
                   adapter=str(adapter) if adapter else None, max_new_tokens=max_new_tokens, int8=int8,
                   retention=retention, retention_methods=retention_methods, recompute_ratio=recompute_ratio,
                   task=task, metric=metric.__name__, **({"pairs_per_doc": pairs_per_doc} if task == "kv-retrieval"
                                                         else {"chunk_tokens": chunk_tokens} if task == "long-docs" else {}))
        json_out.write_text(json.dumps({**summary, "settings": run}, indent=2))
    _eval_reports(summary, rows, plot, retention is not None, explain)


def _eval_task(task: str, data: Path, n: int, docs: int, pairs: int, seed: int) -> tuple[list, object, object, str]:
    """``(examples, build_documents, metric, title)`` of ``eval --task``: NQ read from ``data``, or ``n``
    generated key-value retrieval questions (:mod:`training.kv_retrieval`); or exit on a bad value."""
    if task == "kv-retrieval":
        from training import kv_retrieval as kv

        try:
            examples = kv.make_examples(n, docs, pairs, seed)
        except ValueError as e:
            fail(str(e))
        return examples, kv.build_documents, kv.exact_match, f"KV retrieval ({pairs} pairs/document, exact match)"
    from kvlink_rag.nq import DataFormatError, best_subspan_em, build_documents, load_nq

    if task == "long-docs":
        from training.long_docs import long_documents as build_documents  # noqa: F811 - one long document
    try:
        return (load_nq(data), build_documents, best_subspan_em,
                "NQ-open" + (" (passages in one long document)" if task == "long-docs" else ""))
    except DataFormatError as e:
        fail(str(e))


def _step(bar, engines: dict[str, Engine], task: str):
    """``evaluate``'s per-question callback: the bar's step and, for kv-retrieval, the in-memory document
    caches dropped (every question's documents are fresh UUIDs, never reused; 150 questions of 50 documents
    would otherwise hold ~25 GB of bfloat16 KV of the default model)."""
    caches = {id(e.cache): e.cache for e in engines.values() if isinstance(e.cache, dict)} if task != "nq" else {}

    def step() -> None:
        bar.advance()
        for cache in caches.values():
            cache.clear()
    return step


@contextmanager
def _too_long_exits():
    """Exit with a one-line error when a prompt does not fit the model's context (too many --docs)."""
    try:
        yield
    except ContextTooLong as e:
        fail(f"{e} (fewer --docs or --max-new-tokens)")


def _task_sizes(task: str, chunk_tokens: str) -> list[int]:
    """``--chunk-tokens`` of ``--task long-docs`` (each 0 or >= 64); ``[]`` for ``--task nq``; or exit."""
    if task not in ("nq", "kv-retrieval", "long-docs"):
        fail(f"unknown task {task!r}; choose nq, kv-retrieval or long-docs")
    try:
        sizes = [int(x) for x in chunk_tokens.split(",") if x.strip()] if task == "long-docs" else []
    except ValueError:
        fail(f"--chunk-tokens takes comma-separated integers, got {chunk_tokens!r}")
    if task == "long-docs" and (not sizes or any(0 < s < 64 or s < 0 for s in sizes)):
        fail(f"--chunk-tokens: each size is 0 (one block) or at least 64 tokens, got {chunk_tokens!r}")
    return sizes


def _task(task: str, sizes: list[int], engines: dict) -> tuple[dict, list[str]]:
    """``(label -> engine, labels)`` of ``--task``: as given, or for long-docs every linked mode once per
    chunk size in ``sizes`` (:func:`training.long_docs.long_doc_engines`)."""
    if task != "long-docs":
        return engines, list(engines)
    from training.long_docs import long_doc_engines

    engines = long_doc_engines(engines, sizes)
    return engines, list(engines)


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


def _retention_variants(wanted: list[str], retention: str | None, methods: str, explain: bool = False) -> dict:
    """Mode label -> (mode, :class:`training.eval.Retention` or None): each linked mode at every retention and
    method (r=1 once), or the modes as they are without ``--retention``; with ``explain`` also each linked mode
    explained at r=1 (``"<mode> r=1 explain"``); or exit on a bad value."""
    from kvlink_rag.retention import METHODS, check_retention
    from training.eval import Retention

    if explain:
        retention = retention or "1"
    if retention is None:
        return {m: (m, None) for m in wanted}

    try:
        rs = [check_retention(x.strip()) for x in retention.split(",") if x.strip()]
    except ValueError as e:
        fail(f"--retention: {e}")
    ms = [m.strip() for m in methods.split(",") if m.strip()]
    if not rs or not ms or set(ms) - set(METHODS):
        fail(f"--retention needs values in (0, 1] and --retention-methods some of {', '.join(METHODS)}")
    out: dict = {}
    for m in wanted:
        if m in ("full", "full-adapted"):
            out[m] = (m, None)
            continue
        for r in rs:
            for method in (["importance"] if r == 1.0 else ms):
                label = f"{m} r=1" if r == 1.0 else f"{m} r={r:g} {method}"
                out[label] = (m, Retention(r, method))
        if explain:
            out[f"{m} r=1 explain"] = (m, Retention(1.0, "importance", explain=True))
    return out


def _blend_variants(variants: dict, ratios: str | None) -> dict:
    """``variants`` with each reuse mode at every ``--recompute-ratio`` (:mod:`training.blend_modes`; none: as
    they are), or exit."""
    from training.blend_modes import blend_variants, parse_ratios

    if ratios is None:
        return variants
    try:
        return blend_variants(variants, parse_ratios(ratios))
    except ValueError as e:
        fail(f"--recompute-ratio: {e}")


def _eval_choices(modes: str, gold_position: str, links: Path | None, adapter: Path | None) -> tuple[list[str], list[str]]:
    """The modes and gold positions of ``eval`` (checked, and the artifacts they need given), or exit."""
    wanted = [m.strip() for m in modes.split(",") if m.strip()]
    positions = [p.strip() for p in gold_position.split(",") if p.strip()]
    bad = [m for m in wanted if m not in MODES] + [p for p in positions if p not in EVAL_POSITIONS]
    if bad or not wanted or not positions:
        fail(f"unknown mode(s) or position(s) {bad}; modes: {', '.join(MODES)}; positions: {', '.join(EVAL_POSITIONS)}")
    if "linked" in wanted and links is None:
        fail("mode 'linked' needs --links FILE (trained link tokens)")
    if set(ADAPTED) & set(wanted) and adapter is None:
        fail("modes full-adapted and linked-query-lora need --adapter FILE")
    return wanted, positions


def _artifact_path(settings: Settings, path: Path) -> Path:
    """``path``, or the named adapter ``$KVLINK_RAG_HOME/links/NAME.safetensors`` when ``path`` is a name."""
    if path.exists() or path.suffix == ".safetensors":
        return path
    from kvlink_rag.adapter_registry import adapter_path

    try:
        return adapter_path(settings.links_dir, str(path))
    except ValueError as e:
        fail(str(e))


def _eval_engines(settings: Settings, wanted: list[str], links: Path | None, adapter: Path | None,
                  int8: bool) -> dict[str, Engine]:
    """One engine per mode: the base engine (untrained link tokens, documents cached in memory or, with
    ``int8``, in a throw-away int8 store) and, sharing its model and cache, the trained artifacts'."""
    from kvlink_rag.cache import MemoryCache
    from kvlink_rag.link_tokens import load_link_tokens

    paths = {m: _artifact_path(settings, links if m == "linked" else adapter) for m in wanted
             if m == "linked" or m in ADAPTED}  # names resolved before the model loads
    base = make_engine(settings, cache=MemoryCache())
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


@app.command("train-links")
def train_links(
    data: NqOpt = NQ_DEFAULT,
    out: Annotated[Path, typer.Option(help="Output safetensors (link tokens + adapter).")] = Path("links.safetensors"),
    name: Annotated[Optional[str], typer.Option(help="Save as the named adapter $KVLINK_RAG_HOME/links/NAME.safetensors "
                                                "(instead of --out), selectable per query.")] = None,
    steps: Annotated[int, typer.Option(help="Optimiser steps (each over --accumulate examples).")] = 150,
    k: Annotated[int, typer.Option("--k", help="Link tokens per document.")] = 5,
    docs: Annotated[int, typer.Option("--docs", help="Documents per training example (gold + distractors).")] = 10,
    lr: Annotated[float, typer.Option(help="LoRA learning rate.")] = 3e-4,
    link_lr: Annotated[float, typer.Option(help="Link-embedding learning rate.")] = 1e-3,
    accumulate: Annotated[int, typer.Option(help="Examples per optimiser step (gradient accumulation).")] = 4,
    adapter: Annotated[str, typer.Option(help="query-lora (link tokens + query-side LoRA) or none.")] = "query-lora",
    lora: Annotated[bool, typer.Option("--lora", help="Same as --adapter query-lora.")] = False,
    rank: Annotated[int, typer.Option(help="LoRA rank.")] = 16,
    targets: Annotated[str, typer.Option(help="LoRA target projections, comma-separated.")] = "q_proj,k_proj,v_proj,o_proj",
    slots: Annotated[int, typer.Option(help="1: link tokens shared by every document slot; S: per-slot "
                                       "[S, K, hidden] (slot i >= S uses the last).")] = 1,
    exclude_first: Annotated[int, typer.Option(help="Questions reserved for evaluation (not trained on).")] = 500,
    val_n: Annotated[int, typer.Option(help="Held-out validation questions (end of the file).")] = 50,
    seed: Annotated[int, typer.Option(help="Seed of example order, distractors and initialisation (runs are deterministic).")] = 0,
    encoding: EncOpt = None,
    init: Annotated[Optional[Path], typer.Option(help="Start from this saved artifact (same K, slots, rank, targets) "
                                                 "with a fresh optimiser; --steps more steps, on the examples after "
                                                 "those it was trained on.")] = None,
    val_every: Annotated[int, typer.Option(help="Validation answer NLL every N steps (and at the start and end; "
                                           "0: never); the best step's artifact is saved as --out.")] = 50,
    curriculum: Annotated[Optional[str], typer.Option(help="MIN-MAX: documents per training example drawn per "
                                                      "example in [MIN, MAX] instead of --docs (validation: --docs).")] = None,
    time_limit: Annotated[float, typer.Option(help="Stop after this many seconds of training (validated, saved; "
                                              "rerun to resume); 0: no limit.")] = 0.0,
    doc_side: Annotated[bool, typer.Option("--doc-side", help="The adapter encodes documents too (gradients through "
                                           "the document encodings); an upper bound: such caches depend on the "
                                           "adapter, so only `eval` takes the artifact.")] = False,
) -> None:
    """Train link tokens and a query-side LoRA on NQ; resumable.

    Trains on multi-document QA examples and saves link tokens (and the adapter) as one safetensors file:
    the best validation step's (the last one's beside it as <out>-last), the curve in <out>.json.
    """
    from kvlink_rag.nq import DataFormatError
    from training.data import split_examples

    out, target_list = _train_checks(out, name, adapter, targets, steps, k, docs, accumulate, slots, rank)
    span = _train_variant_checks(init, val_every, curriculum, doc_side, lora or adapter == "query-lora")
    try:
        split = split_examples(data, exclude_first, val_n)
    except (DataFormatError, ValueError) as e:
        fail(str(e))
    from training.loop import TrainConfig

    cfg = TrainConfig(steps=steps, accumulate=accumulate, k=k, docs=docs, lr=lr, link_lr=link_lr,
                      lora=lora or adapter == "query-lora", rank=rank, alpha=2 * rank, targets=target_list,
                      slots=slots, seed=seed, init=str(init) if init else "", curriculum=span, doc_side=doc_side)
    # untrained init; no importance scores: training keeps its document caches in memory at full retention, and
    # scoring (eager attention per layer) made each step ~3x slower (17 steps in 100 s on an H200)
    _train(make_settings(k, encoding, shipped_links=False, importance_scores=False), split, cfg, out, val_every,
           time_limit)


def _train_checks(out: Path, name: str | None, adapter: str, targets: str, *counts: int) -> tuple[Path, tuple[str, ...]]:
    """``train-links``' output path (``--name`` resolved) and LoRA targets, its arguments checked; or exit."""
    if adapter not in ("query-lora", "none"):
        fail(f"unknown adapter {adapter!r}; choose query-lora or none")
    if name is not None:
        from kvlink_rag.adapter_registry import adapter_path

        try:
            out = adapter_path(make_settings().links_dir, name)
        except ValueError as e:
            fail(str(e))
    if min(counts) < 1:
        fail("--steps, --k, --docs, --accumulate, --slots and --rank must be >= 1")
    target_list = tuple(x.strip() for x in targets.split(",") if x.strip())
    if not target_list:
        fail("--targets needs at least one projection name, e.g. q_proj,v_proj")
    return out, target_list


def _train_variant_checks(init: Path | None, val_every: int, curriculum: str | None, doc_side: bool,
                          lora: bool) -> tuple[int, int] | None:
    """``--init``, ``--val-every``, ``--doc-side`` checked and ``--curriculum MIN-MAX`` parsed; or exit."""
    if init is not None and not init.is_file():
        fail(f"--init {init}: no such file")
    if val_every < 0:
        fail("--val-every must be >= 0")
    if doc_side and not lora:
        fail("--doc-side trains the adapter on document tokens; it needs --adapter query-lora")
    if curriculum is None:
        return None
    lo, _, hi = curriculum.partition("-")
    if not (lo.strip().isdigit() and hi.strip().isdigit()) or not 1 <= int(lo) <= int(hi):
        fail(f"--curriculum {curriculum!r}: expected MIN-MAX with 1 <= MIN <= MAX, e.g. 1-20")
    return int(lo), int(hi)


def _train(settings: Settings, split, cfg, out: Path, val_every: int = 50, time_limit: float = 0.0) -> None:
    """Train (resuming from ``<out>.ckpt``), validate and save the best artifact, the loss curve and the summary."""
    from kvlink_rag.cache import MemoryCache
    from training.loop import Trainer
    from training.outputs import save_outputs

    engine = make_engine(settings, cache=MemoryCache())  # training memoises document encodings in memory
    try:
        trainer = Trainer(engine, split, cfg, out.with_suffix(".ckpt"))
    except (ValueError, FileNotFoundError) as e:
        fail(str(e))
    last = trainer.state.losses[-1] if trainer.state.losses else float("nan")
    with progress_bar("training link tokens", cfg.steps, completed=trainer.state.step, loss=last) as bar, \
            results_only_stdout():
        trainer.run(lambda step, loss: bar.update(completed=step, loss=loss), val_every=val_every,
                    max_seconds=time_limit)
    s = save_outputs(trainer, split, out, {"encoding": settings.encoding})
    console.print(f"saved {out} (K={cfg.k}, adapter={'query-lora' if cfg.lora else 'none'}, best validation step "
                  f"{s['best_step']} of {s['steps']}), validation accuracy {s['val_accuracy_best']:.3f} on "
                  f"{s['val_n']} held-out questions; {s['seconds_per_step'] or 0:.2f} s/step on {s['device']}; "
                  f"curve {out.with_suffix('.json')}")


@app.command("eval-report")
def eval_report(
    rows: Annotated[list[Path], typer.Argument(help="Row files (<json>.rows.jsonl) of one or more eval runs.")],
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Write the merged summary JSON here.")] = None,
    plot: Annotated[Optional[Path], typer.Option(help="PNG of accuracy by gold position per mode.")] = None,
    markdown: Annotated[Optional[Path], typer.Option(help="Write the table as markdown here.")] = None,
    against: Annotated[Optional[str], typer.Option(help="Also print every mode's paired accuracy difference "
                                                   "to this mode (and to 95% of it), with 95% intervals.")] = None,
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
    print_summary(summary, f"NQ-open, {n} questions, merged from {len(rows)} row file(s)")
    if against is not None:
        if against not in summary["modes"]:
            fail(f"--against {against!r}: no rows of that mode; modes: {', '.join(summary['modes'])}")
        for m in summary["modes"]:
            if m == against:
                continue
            for scale in (1.0, 0.95):
                d, lo, hi = paired_difference(merged, m, against, scale, seed=seed)
                out.print(f"{m} - {scale:g} x {against}: {d:+.3f} [{lo:+.3f}, {hi:+.3f}]")
    if json_out is not None:
        json_out.write_text(json.dumps({**summary, "settings": {"rows": [str(p) for p in rows]}}, indent=2))
    if plot is not None:
        plot_by_position(summary, plot)
    if markdown is not None:
        markdown.write_text(summary_markdown(summary))
