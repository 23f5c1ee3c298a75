"""``kvlink-rag`` command line (typer)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from .settings import Settings, get_settings

app = typer.Typer(add_completion=False, no_args_is_help=True, help="KVLink document-cache RAG.")
model_app = typer.Typer(no_args_is_help=True, help="Model management.")
app.add_typer(model_app, name="model")
console = Console(stderr=True, soft_wrap=True)
out = Console(soft_wrap=True)

KOpt = Annotated[Optional[int], typer.Option("--k", help="Link tokens per document (0 = naive reuse).")]
EncOpt = Annotated[Optional[str], typer.Option("--encoding", help="anchored | isolated")]
DtypeOpt = Annotated[Optional[str], typer.Option("--kv-dtype", help="float32 | bfloat16 | float16")]


def fail(message: str, code: int = 2) -> None:
    """Print ``message`` to stderr and exit non-zero (no traceback)."""
    console.print(f"[red]error:[/red] {message}")
    raise typer.Exit(code)


def make_settings(k: int | None = None, encoding: str | None = None, kv_dtype: str | None = None,
                  **extra) -> Settings:
    """Settings from the environment with CLI overrides; a bad value exits with a message."""
    overrides = {"link_k": k, "encoding": encoding, "kv_dtype": kv_dtype, **extra}
    try:
        return get_settings(**{k_: v for k_, v in overrides.items() if v is not None})
    except Exception as e:  # pydantic ValidationError: show the messages only
        errors = getattr(e, "errors", None)
        msg = "; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in errors()) if errors else str(e)
        fail(f"invalid setting: {msg}")


def make_engine(settings: Settings):
    """Load the engine (model, prefix, link tokens, document store); errors exit with a message."""
    from .engine import Engine

    if settings.torch_threads > 0:
        import torch

        torch.set_num_threads(settings.torch_threads)
    try:
        return Engine(settings, cache=open_cache(settings))
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        fail(str(e))


def open_cache(settings: Settings):
    """The persistent document cache under ``settings.home``: memory tiers over the LMDB store."""
    from store.factory import open_store

    try:
        return open_store(settings).cache
    except Exception as e:  # noqa: BLE001 - any store failure becomes one clear message
        fail(f"cannot open the store under {settings.store_dir}: {e}")


@model_app.command("fetch")
def model_fetch() -> None:
    """Download and convert the default model once (no-op when already converted)."""
    from .convert import ModelFetchError, ensure_default_model

    settings = make_settings()
    try:
        path = ensure_default_model(settings.models_dir)
    except ModelFetchError as e:
        fail(str(e))
    out.print(str(path))


def _read_docs(paths: list[Path]):
    """Documents from files (text files, or JSONL with a ``text`` field); exits on bad input."""
    from .engine import Document
    from .service_cli import read_documents

    return [Document(text=d["text"], title=d["title"] or None) for d in read_documents(paths)]


@app.command()
def ask(
    question: Annotated[Optional[str], typer.Argument(help="The question (omit with --nq).")] = None,
    doc: Annotated[list[Path], typer.Option("--doc", help="A document file; repeat for several.")] = [],
    nq: Annotated[Optional[Path], typer.Option(help="NQ-open oracle JSONL(.gz): answer question --index.")] = None,
    index: Annotated[int, typer.Option(help="Question index in --nq.")] = 0,
    docs: Annotated[int, typer.Option("--docs", help="Documents per question with --nq (gold + distractors).")] = 10,
    gold_position: Annotated[str, typer.Option(help="first | middle | last | random")] = "random",
    k: KOpt = None, encoding: EncOpt = None, kv_dtype: DtypeOpt = None,
    max_new_tokens: Annotated[Optional[int], typer.Option()] = None,
    temperature: Annotated[Optional[float], typer.Option()] = None,
    top_p: Annotated[Optional[float], typer.Option()] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Answer a question over documents from files (--doc) or one real NQ question (--nq)."""
    from .nq import DataFormatError, best_subspan_em, build_documents, load_nq

    gold: list[str] = []
    if nq is not None:
        try:
            examples = load_nq(nq)
            documents, _ = build_documents(examples, index, docs, gold_position)
        except (DataFormatError, ValueError) as e:
            fail(str(e))
        question, gold = examples[index].question, list(examples[index].answers)
    else:
        if not question or not question.strip():
            fail("give a question (or --nq FILE)")
        if not doc:
            fail("give at least one --doc FILE (a question alone has no documents)")
        documents = _read_docs(doc)
    settings = make_settings(k, encoding, kv_dtype)
    engine = make_engine(settings)
    sampling = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p)
    try:
        hits = sum(engine.cache.get(engine.cache_key(d)) is not None for d in documents)
        for d in documents:  # ingest: precompute what is not cached yet (outside the TTFT)
            engine.get_or_encode(d)
        linked = engine.answer(question, documents, **sampling)
        full = engine.answer_full(question, documents, **sampling)
    except ValueError as e:
        fail(str(e))
    result = {
        "question": question, "answer": linked.text, "answer_full": full.text, "gold_answers": gold,
        "match": best_subspan_em(linked.text, gold) if gold else None,
        "match_full": best_subspan_em(full.text, gold) if gold else None,
        "ttft_full_s": full.ttft_s, "ttft_linked_s": linked.ttft_s, "cache_hits": hits,
        "documents": len(documents), "context_tokens": linked.context_tokens, "link_k": settings.link_k,
        "encoding": settings.encoding, "timings_linked": linked.timings,
    }
    if as_json:
        out.print_json(json.dumps(result))
        return
    out.print(f"[bold]Q:[/bold] {question}")
    out.print(f"[bold]linked:[/bold] {linked.text}")
    out.print(f"[bold]full prefill:[/bold] {full.text}")
    if gold:
        out.print(f"[bold]gold:[/bold] {gold}  match linked={result['match']:.0f} full={result['match_full']:.0f}")
    out.print(f"TTFT full {full.ttft_s * 1000:.0f} ms, linked {linked.ttft_s * 1000:.0f} ms "
              f"({full.ttft_s / max(linked.ttft_s, 1e-9):.1f}x), {hits}/{len(documents)} cached before this run, "
              f"{linked.context_tokens} context tokens")


@app.command()
def demo(
    nq: Annotated[Path, typer.Option(help="NQ-open oracle JSONL(.gz).")] = Path("../shared/data/nq-open-oracle-dev.jsonl.gz"),
    questions: Annotated[int, typer.Option(help="How many questions.")] = 5,
    docs: Annotated[int, typer.Option("--docs", help="Documents per question.")] = 10,
    k: KOpt = None, encoding: EncOpt = None, kv_dtype: DtypeOpt = None,
) -> None:
    """The main job: precompute real NQ documents, then answer questions over them, full prefill vs reuse."""
    from rich.progress import track

    from .nq import DataFormatError, best_subspan_em, build_documents, load_nq

    try:
        examples = load_nq(nq)
        sets = [build_documents(examples, i, docs, "random")[0] for i in range(min(questions, len(examples)))]
    except (DataFormatError, ValueError) as e:
        fail(str(e))
    engine = make_engine(make_settings(k, encoding, kv_dtype))
    unique = {engine.cache_key(d): d for s in sets for d in s}
    hits = 0
    for d in track(list(unique.values()), description="precomputing documents", console=console):
        hits += engine.get_or_encode(d)[1]
    console.print(f"{len(unique)} documents: {hits} already cached, {len(unique) - hits} precomputed now")
    out.print(f"[bold]NQ-open, {docs} documents per question (gold among distractors), K={engine.settings.link_k} "
              f"link tokens, {engine.settings.encoding} encoding[/bold]")
    score = {"full": 0.0, "linked": 0.0}
    speedups = []
    mark = lambda m: "[green]✓[/green]" if m else "[red]✗[/red]"  # noqa: E731
    for i, documents in enumerate(sets):
        ex = examples[i]
        full = engine.answer_full(ex.question, documents)
        linked = engine.answer(ex.question, documents)
        mf, ml = best_subspan_em(full.text, ex.answers), best_subspan_em(linked.text, ex.answers)
        score["full"] += mf
        score["linked"] += ml
        speedups.append(full.ttft_s / max(linked.ttft_s, 1e-9))
        out.print(f"\n[bold]Q{i + 1}:[/bold] {ex.question}?  [dim]gold: {' | '.join(ex.answers[:3])}[/dim]")
        out.print(f"  full prefill {mark(mf)} TTFT {full.ttft_s * 1000:6.0f} ms  {full.text[:100]}")
        out.print(f"  linked       {mark(ml)} TTFT {linked.ttft_s * 1000:6.0f} ms  {linked.text[:100]}  "
                  f"[dim]({linked.cache_hits}/{len(documents)} cached, {linked.context_tokens} context tokens)[/dim]")
    n = len(sets)
    speedups.sort()
    out.print(f"\naccuracy over {n} questions: full prefill {score['full'] / n:.2f}, linked {score['linked'] / n:.2f}; "
              f"median TTFT speed-up of linked caches over full prefill {speedups[n // 2]:.1f}x")


@app.command("eval")
def eval_cmd(
    data: Annotated[Path, typer.Option(help="NQ-open oracle format JSONL(.gz).")] = Path("../shared/data/nq-open-oracle-dev.jsonl.gz"),
    n: Annotated[int, typer.Option(help="Questions to evaluate (the first n).")] = 50,
    docs: Annotated[int, typer.Option("--docs")] = 10,
    gold_position: Annotated[str, typer.Option(help="Comma list of first, middle, last, random.")] = "random",
    modes: Annotated[str, typer.Option(help="Comma list of " + ", ".join(("full", "naive", "linked", "linked-untrained", "full-adapted", "linked-query-lora")) + ".")] = "full,naive,linked-untrained",
    k: KOpt = None, encoding: EncOpt = None, kv_dtype: DtypeOpt = None,
    links: Annotated[Optional[Path], typer.Option(help="Trained link tokens (mode 'linked').")] = None,
    adapter: Annotated[Optional[Path], typer.Option(help="Link tokens + query-side LoRA (modes full-adapted, linked-query-lora).")] = None,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Write the summary JSON here (rows go to <json>.rows.jsonl; a rerun resumes).")] = None,
    plot: Annotated[Optional[Path], typer.Option(help="PNG of accuracy by gold position per mode.")] = None,
    max_new_tokens: Annotated[int, typer.Option()] = 24,
    int8: Annotated[bool, typer.Option("--int8", help="Serve document caches through an int8 LMDB store.")] = False,
    seed: Annotated[int, typer.Option()] = 0,
) -> None:
    """Accuracy (best_subspan_em, 95% CI), answer NLL and TTFT per mode on multi-document NQ."""
    from rich.progress import Progress

    from training.eval import MODES, evaluate, plot_by_position, summarise

    from .engine import Engine, MemoryCache
    from .nq import GOLD_POSITIONS, DataFormatError, load_nq

    wanted = [m.strip() for m in modes.split(",") if m.strip()]
    positions = [p.strip() for p in gold_position.split(",") if p.strip()]
    bad = [m for m in wanted if m not in MODES] + [p for p in positions if p not in GOLD_POSITIONS]
    if bad or not wanted or not positions:
        fail(f"unknown mode(s) or position(s) {bad}; modes: {', '.join(MODES)}; positions: {', '.join(GOLD_POSITIONS)}")
    if "linked" in wanted and links is None:
        fail("mode 'linked' needs --links FILE (trained link tokens)")
    if {"full-adapted", "linked-query-lora"} & set(wanted) and adapter is None:
        fail("modes full-adapted and linked-query-lora need --adapter FILE")
    try:
        examples = load_nq(data)
    except DataFormatError as e:
        fail(str(e))
    n = min(n, len(examples))
    settings = make_settings(k, encoding, kv_dtype, shipped_links=False)  # base = untrained link tokens
    base = make_engine(settings)
    base.cache = cache = MemoryCache()
    if int8:  # a throw-away int8 store: caches are served as the int8 round trip
        import tempfile

        from store.factory import open_store

        tmp_home = Path(tempfile.mkdtemp(prefix="kvlink-eval-int8-"))
        base.cache = cache = open_store(settings.model_copy(update={"home": tmp_home, "store_int8": True})).cache
    trained: dict[Path, Engine] = {}

    def engine_for(path: Path) -> Engine:
        if path not in trained:
            try:
                trained[path] = Engine(settings.model_copy(update={"link_tokens_path": path}), lm=base.lm, cache=cache)
            except (ValueError, FileNotFoundError) as e:
                fail(str(e))
        return trained[path]

    engines = {m: engine_for(links) if m == "linked" else engine_for(adapter) if m in ("full-adapted", "linked-query-lora")
               else base for m in wanted}
    rows_path = json_out.with_suffix(".rows.jsonl") if json_out is not None else None
    with Progress(console=console) as progress:
        task = progress.add_task(f"evaluating {n} questions x {len(positions)} positions", total=n * len(positions))
        rows = evaluate(engines, examples, n, docs, positions, seed, max_new_tokens, rows_path,
                        progress=lambda: progress.advance(task))
    rows = [r for r in rows if r["index"] < n and r["mode"] in wanted and r["gold_position"] in positions]
    summary = summarise(rows, seed)
    table = Table(title=f"NQ-open, {n} questions, {docs} documents, gold {gold_position}, "
                        f"{settings.encoding}, K={settings.link_k}")
    for col in ("mode", "accuracy", "95% CI", "answer NLL", "TTFT s (median)", "n"):
        table.add_column(col)
    for m, s in summary["modes"].items():
        table.add_row(m, f"{s['accuracy']:.3f}", f"[{s['ci95'][0]:.3f}, {s['ci95'][1]:.3f}]",
                      f"{s['answer_nll']:.3f}", f"{s['ttft_s']:.3f}", str(s["n"]))
    out.print(table)
    if json_out is not None:
        payload = {**summary, "settings": {"n": n, "docs": docs, "gold_positions": positions,
                   "encoding": settings.encoding, "link_k": settings.link_k, "kv_dtype": settings.kv_dtype,
                   "seed": seed, "data": str(data), "links": str(links) if links else None,
                   "adapter": str(adapter) if adapter else None, "max_new_tokens": max_new_tokens,
                   "int8": int8}}
        json_out.write_text(json.dumps(payload, indent=2))
    if plot is not None:
        plot_by_position(summary, plot)


@app.command("train-links")
def train_links(
    data: Annotated[Path, typer.Option(help="NQ-open oracle format JSONL(.gz).")] = Path("../shared/data/nq-open-oracle-dev.jsonl.gz"),
    out: Annotated[Path, typer.Option(help="Output safetensors (link tokens + adapter).")] = Path("links.safetensors"),
    steps: Annotated[int, typer.Option()] = 150,
    k: Annotated[int, typer.Option("--k")] = 5,
    docs: Annotated[int, typer.Option("--docs")] = 10,
    lr: Annotated[float, typer.Option(help="LoRA learning rate.")] = 3e-4,
    link_lr: Annotated[float, typer.Option(help="Link-embedding learning rate.")] = 1e-3,
    accumulate: Annotated[int, typer.Option()] = 4,
    adapter: Annotated[str, typer.Option(help="query-lora (link tokens + query-side LoRA) or none.")] = "query-lora",
    lora: Annotated[bool, typer.Option("--lora", help="Same as --adapter query-lora.")] = False,
    rank: Annotated[int, typer.Option()] = 16,
    exclude_first: Annotated[int, typer.Option(help="Questions reserved for evaluation (not trained on).")] = 500,
    val_n: Annotated[int, typer.Option(help="Held-out validation questions (end of the file).")] = 50,
    seed: Annotated[int, typer.Option()] = 0,
    encoding: EncOpt = None,
) -> None:
    """Train link tokens (and a query-side LoRA adapter) on multi-document QA; resumable."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from training.data import split_examples
    from training.loop import TrainConfig, Trainer
    from training.report import plot_losses, validation_accuracy

    from .nq import DataFormatError

    if adapter not in ("query-lora", "none"):
        fail(f"unknown adapter {adapter!r}; choose query-lora or none")
    if steps < 1 or k < 1 or docs < 1 or accumulate < 1:
        fail("--steps, --k, --docs and --accumulate must be >= 1")
    try:
        split = split_examples(data, exclude_first, val_n)
    except (DataFormatError, ValueError) as e:
        fail(str(e))
    settings = make_settings(k, encoding, shipped_links=False)  # train from the untrained initialisation
    engine = make_engine(settings)
    from .engine import MemoryCache

    engine.cache = MemoryCache()  # training memoises document encodings in memory
    cfg = TrainConfig(steps=steps, accumulate=accumulate, k=k, docs=docs, lr=lr, link_lr=link_lr,
                      lora=lora or adapter == "query-lora", rank=rank, seed=seed)
    work = out.with_suffix(".ckpt")
    try:
        trainer = Trainer(engine, split, cfg, work)
    except ValueError as e:
        fail(str(e))
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TextColumn("loss {task.fields[loss]:.3f}"), TimeRemainingColumn(), console=console) as progress:
        last = trainer.state.losses[-1] if trainer.state.losses else float("nan")
        task = progress.add_task("training link tokens", total=steps, completed=trainer.state.step, loss=last)
        trainer.run(lambda step, loss: progress.update(task, completed=step, loss=loss))
    acc = validation_accuracy(engine, trainer, split)
    artifact = trainer.artifact({"val_accuracy": acc, "val_n": len(split.val), "encoding": settings.encoding})
    artifact.save(out)
    plot_losses(trainer.state, out.with_suffix(".png"))
    console.print(f"saved {out} (K={k}, adapter={'query-lora' if cfg.lora else 'none'}), validation accuracy "
                  f"{acc:.3f} on {len(split.val)} held-out questions; loss curve {out.with_suffix('.png')}")


from .service_cli import register as _register_service_commands  # noqa: E402 - needs the helpers above

_register_service_commands(app)  # serve, worker, ingest, query


@app.command()
def bench(
    nq: Annotated[Path, typer.Option(help="NQ-open oracle JSONL(.gz) for real documents.")] = Path("../shared/data/nq-open-oracle-dev.jsonl.gz"),
    lengths: Annotated[str, typer.Option(help="Context lengths in tokens (10 documents).")] = "1000,2000,4000,8000",
    doc_counts: Annotated[str, typer.Option(help="Document counts for TTFT scaling.")] = "1,5,10,20",
    store_sizes: Annotated[str, typer.Option(help="Synthetic entry counts for store scaling.")] = "100,1000,10000",
    clients: Annotated[str, typer.Option(help="Concurrent HTTP clients ('' to skip).")] = "1,4,16",
    repeats: Annotated[int, typer.Option()] = 3,
    device: Annotated[str, typer.Option(help="cpu | cuda")] = "cpu",
    json_out: Annotated[Optional[Path], typer.Option("--json")] = None,
    plots: Annotated[Optional[Path], typer.Option("--plots", help="Folder for PNG plots.")] = None,
    markdown_out: Annotated[Optional[Path], typer.Option("--markdown", help="Write the tables here (e.g. BENCHMARKS.md).")] = None,
) -> None:
    """TTFT (full vs linked vs floor), load bandwidth, precompute throughput and scaling, side by side."""
    from bench.report import markdown, plots as make_plots
    from bench.run import run_suite

    try:
        ints = lambda s: [int(x) for x in s.split(",") if x.strip()]  # noqa: E731
        lens, counts, sizes, n_clients = ints(lengths), ints(doc_counts), ints(store_sizes), ints(clients)
    except ValueError:
        fail("--lengths, --doc-counts and --store-sizes take comma-separated integers")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            fail("--device cuda: no CUDA device is available on this machine")
    engine = make_engine(make_settings(device=device))
    results = run_suite(engine, nq, lens, repeats, counts, sizes, n_clients, log=lambda m: console.print(m))
    command = "kvlink-rag bench " + " ".join(sys.argv[2:]) if len(sys.argv) > 2 else "kvlink-rag bench"
    text = markdown(results, command)
    out.print(text)
    if json_out is not None:
        json_out.write_text(json.dumps(results, indent=2))
    if plots is not None:
        for p in make_plots(results, plots):
            console.print(f"plot: {p}")
    if markdown_out is not None:
        markdown_out.write_text("# Benchmarks\n\n" + text)


def main() -> None:  # pragma: no cover
    app()

