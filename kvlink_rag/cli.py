"""``kvlink-rag`` command line (typer).

Start-up stays light (no torch, transformers, peft, fastapi or celery at module level, here or in the
command modules registered below), so ``--help`` and bad arguments answer at once; the model loads
inside the commands that need it. Results go to stdout, everything else to stderr (``terminal``).
"""

from __future__ import annotations

import atexit
import gc
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from .settings import Settings, get_settings
from .terminal import console, out, progress_bar, results_only_stdout

if TYPE_CHECKING:
    from service.runtime import Runtime

    from .engine import Engine

app = typer.Typer(add_completion=False, no_args_is_help=True, help="KVLink document-cache RAG.")
model_app = typer.Typer(no_args_is_help=True, help="Model management.")
app.add_typer(model_app, name="model")

KOpt = Annotated[Optional[int], typer.Option("--k", help="Link tokens per document (0 = naive reuse).")]
EncOpt = Annotated[Optional[str], typer.Option("--encoding", help="anchored (default: documents see the system prompt) | isolated")]
DtypeOpt = Annotated[Optional[str], typer.Option("--kv-dtype", help="float32 | bfloat16 | float16")]


def fail(message: str, code: int = 2) -> None:
    """Print ``message`` to stderr and exit non-zero (no traceback)."""
    console.print(f"[red]error:[/red] {message}")
    raise typer.Exit(code)


def make_settings(k: int | None = None, encoding: str | None = None, kv_dtype: str | None = None,
                  **extra) -> Settings:
    """Settings from the environment with CLI overrides; a bad value exits with a message."""
    overrides = {"link_k": k, "encoding": encoding, "kv_dtype": kv_dtype, **extra}
    from pydantic import ValidationError

    try:
        return get_settings(**{k_: v for k_, v in overrides.items() if v is not None})
    except ValidationError as e:  # the messages only
        fail("invalid setting: " + "; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors()))
    except Exception as e:  # noqa: BLE001 - any other bad value: one line, no traceback
        fail(f"invalid setting: {e}")


def make_engine(settings: Settings, timings: dict[str, float] | None = None, cache=None,
                runtime: Runtime | None = None) -> Engine:
    """Load the engine (model, prefix, link tokens, document store) through :mod:`service.runtime`;
    errors exit with a message.

    Args:
        cache: the document cache (no store is opened then).
        runtime: a runtime whose engine to load (on its store's cache); by default one is built
            (``build_runtime``: the store under ``settings.home``, no queue, no recovery).
        timings: if given, filled with seconds spent in ``import_s`` (torch, transformers, the engine),
            ``store_open_s``, ``model_load_s`` (weights, tokenizer, fingerprint; converts the default
            model on first use) and ``engine_setup_s`` (prefix KV, link tokens, query-side LoRA).
    """
    t = {} if timings is None else timings
    t0 = time.perf_counter()
    with results_only_stdout():
        import torch  # noqa: F401 - imported here so that import_s counts it

        from service.runtime import apply_torch_threads, build_runtime, load_engine

        from . import engine, model  # noqa: F401 - imported here so that import_s counts them

        apply_torch_threads(settings)
        t1 = time.perf_counter()
        stages: dict[str, float] = {}
        try:
            if cache is None:
                runtime = runtime or build_runtime(settings, queue="none", recover=False, load_engine=False)
                loaded = runtime.load_engine()
                stages = runtime.timings
            else:
                loaded = load_engine(settings, cache, stages)
        except (ValueError, FileNotFoundError, RuntimeError) as e:  # StoreOpenError is a RuntimeError
            fail(str(e))
    t.update(import_s=t1 - t0, **{k: stages.get(k, 0.0) for k in ("store_open_s", "model_load_s", "engine_setup_s")})
    atexit.register(gc.freeze)  # at exit, skip the interpreter's last collections over torch's objects (~1-2 s)
    return loaded


@model_app.command("fetch")
def model_fetch() -> None:
    """Download and convert the default model once (no-op when already converted)."""
    from .convert import ModelFetchError, ensure_default_model

    settings = make_settings()
    try:
        with results_only_stdout():
            path = ensure_default_model(settings.models_dir)
    except ModelFetchError as e:
        fail(str(e))
    out.print(str(path))


def _read_docs(paths: list[Path]):
    """Documents from files (text files, or JSONL with a ``text`` field); exits on bad input."""
    from .types import Document
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
    adapter: Annotated[Optional[str], typer.Option(help="default, none, or a named adapter in "
                                                   "$KVLINK_RAG_HOME/links (train-links --name).")] = None,
    compare: Annotated[bool, typer.Option("--full/--no-full", help="Also answer with full prefill, for comparison "
                                          "(slow on long documents).")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output (only JSON on stdout).")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Also print where the time went.")] = False,
) -> None:
    """Answer a question over documents from files (--doc) or one real NQ question (--nq)."""
    start = time.perf_counter()
    question, documents, gold = _ask_inputs(question, doc, nq, index, docs, gold_position)
    settings = make_settings(k, encoding, kv_dtype)
    timings: dict[str, float] = {}
    engine = make_engine(settings, timings)
    if adapter is not None:
        from .named_adapters import AdapterVariants

        try:
            engine = AdapterVariants(engine).get(adapter)
        except (KeyError, ValueError) as e:  # UnknownAdapter, LinkTokensMismatch
            fail(str(e))
    sampling = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p)
    with results_only_stdout():
        linked, full, hits = _answer(engine, question, documents, compare, sampling, timings)
    timings["total_s"] = time.perf_counter() - start
    _print_answer(question, gold, linked, full, hits, len(documents), settings, timings, as_json, verbose)


def _ask_inputs(question, doc, nq, index, docs, gold_position):
    """``(question, documents, gold answers)`` of ``ask``, read and checked before the model loads."""
    from .nq import DataFormatError, build_documents, load_nq

    if nq is None:
        if not question or not question.strip():
            fail("give a question (or --nq FILE)")
        if not doc:
            fail("give at least one --doc FILE (a question alone has no documents)")
        return question, _read_docs(doc), []
    try:
        examples = load_nq(nq)
        documents, _ = build_documents(examples, index, docs, gold_position)
    except (DataFormatError, ValueError) as e:
        fail(str(e))
    return examples[index].question, documents, list(examples[index].answers)


def _answer(engine, question, documents, compare, sampling, timings):
    """Precompute what is not cached, then answer linked (and with full prefill when ``compare``).

    Returns ``(linked Answer, full Answer or None, documents cached before this call)``; adds
    ``documents_s``, ``answer_s`` and (when ``compare``) ``answer_full_s`` to ``timings``."""
    try:
        t0 = time.perf_counter()
        hits, seen = 0, set()
        for d in documents:  # precompute outside the TTFT; a repeated document counts once
            key = engine.cache_key(d)
            hits += engine.get_or_encode(d)[1] and key not in seen
            seen.add(key)
        t1 = time.perf_counter()
        linked = engine.answer(question, documents, **sampling)
        t2 = time.perf_counter()
        full = engine.answer_full(question, documents, **sampling) if compare else None
    except ValueError as e:
        fail(str(e))
    timings.update(documents_s=t1 - t0, answer_s=t2 - t1)
    if compare:
        timings["answer_full_s"] = time.perf_counter() - t2
    return linked, full, hits


def _print_answer(question, gold, linked, full, hits, n_docs, settings, timings, as_json, verbose):
    """The ``ask`` result: JSON (``--json``), else lines; ``--verbose`` adds the time breakdown."""
    from .nq import best_subspan_em

    result = {
        "question": question, "answer": linked.text, "answer_full": full.text if full else None, "gold_answers": gold,
        "match": best_subspan_em(linked.text, gold) if gold else None,
        "match_full": best_subspan_em(full.text, gold) if gold and full else None,
        "ttft_full_s": full.ttft_s if full else None, "ttft_linked_s": linked.ttft_s, "cache_hits": hits,
        "documents": n_docs, "context_tokens": linked.context_tokens, "link_k": settings.link_k,
        "encoding": settings.encoding, "timings_linked": linked.timings, "timings": timings,
    }
    if as_json:
        print(json.dumps(result, indent=2))
        return
    out.print(f"[bold]Q:[/bold] {question}")
    out.print(f"[bold]linked:[/bold] {linked.text}")
    if full is not None:
        out.print(f"[bold]full prefill:[/bold] {full.text}")
    if gold:
        out.print(f"[bold]gold:[/bold] {gold}  match linked={result['match']:.0f}"
                  + (f" full={result['match_full']:.0f}" if full else ""))
    speed = (f"TTFT full {full.ttft_s * 1000:.0f} ms, linked {linked.ttft_s * 1000:.0f} ms "
             f"({full.ttft_s / max(linked.ttft_s, 1e-9):.1f}x)" if full else f"TTFT linked {linked.ttft_s * 1000:.0f} ms")
    out.print(f"{speed}, {hits}/{n_docs} cached before this run, {linked.context_tokens} context tokens")
    if verbose:
        out.print("time: " + ", ".join(f"{name[:-2].replace('_', ' ')} {v:.2f} s" for name, v in timings.items()))


@app.command()
def demo(
    nq: Annotated[Path, typer.Option(help="NQ-open oracle JSONL(.gz).")] = Path("../shared/data/nq-open-oracle-dev.jsonl.gz"),
    questions: Annotated[int, typer.Option(help="How many questions.")] = 5,
    docs: Annotated[int, typer.Option("--docs", help="Documents per question.")] = 10,
    k: KOpt = None, encoding: EncOpt = None, kv_dtype: DtypeOpt = None,
) -> None:
    """The main job: precompute real NQ documents, then answer questions over them, full prefill vs reuse."""
    from .nq import DataFormatError, best_subspan_em, build_documents, load_nq

    try:
        examples = load_nq(nq)
        sets = [build_documents(examples, i, docs, "random")[0] for i in range(min(questions, len(examples)))]
    except (DataFormatError, ValueError) as e:
        fail(str(e))
    engine = make_engine(make_settings(k, encoding, kv_dtype))
    unique = {engine.cache_key(d): d for s in sets for d in s}
    hits = 0
    with progress_bar("precomputing documents", len(unique)) as bar, results_only_stdout():
        for d in unique.values():
            hits += engine.get_or_encode(d)[1]
            bar.advance()
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


from .quality_cli import register as _register_quality_commands  # noqa: E402 - needs the helpers above
from .service_cli import register as _register_service_commands  # noqa: E402

_register_quality_commands(app)  # eval, eval-report, train-links
_register_service_commands(app)  # serve, worker, ingest, query


@app.command()
def bench(
    nq: Annotated[Path, typer.Option(help="NQ-open oracle JSONL(.gz) for real documents.")] = Path("../shared/data/nq-open-oracle-dev.jsonl.gz"),
    lengths: Annotated[str, typer.Option(help="Context lengths in tokens (10 documents).")] = "1000,2000,4000,8000",
    doc_counts: Annotated[str, typer.Option(help="Document counts for TTFT scaling.")] = "1,5,10,20",
    store_sizes: Annotated[str, typer.Option(help="Synthetic entry counts for store scaling.")] = "100,1000,10000",
    clients: Annotated[str, typer.Option(help="Concurrent HTTP clients ('' to skip).")] = "1,4,16",
    requests: Annotated[int, typer.Option(help="HTTP queries per concurrency level (60/30/10% short/medium/long).")] = 32,
    repeats: Annotated[int, typer.Option()] = 3,
    device: Annotated[str, typer.Option(help="cpu | cuda")] = "cpu",
    json_out: Annotated[Optional[Path], typer.Option("--json")] = None,
    plots: Annotated[Optional[Path], typer.Option("--plots", help="Folder for PNG plots.")] = None,
    markdown_out: Annotated[Optional[Path], typer.Option("--markdown", help="Write the tables here (e.g. BENCHMARKS.md).")] = None,
) -> None:
    """TTFT (full vs linked vs floor), load bandwidth, precompute throughput and scaling, side by side."""
    try:
        ints = lambda s: [int(x) for x in s.split(",") if x.strip()]  # noqa: E731
        lens, counts, sizes, n_clients = ints(lengths), ints(doc_counts), ints(store_sizes), ints(clients)
    except ValueError:
        fail("--lengths, --doc-counts and --store-sizes take comma-separated integers")
    if requests < 1:
        fail("--requests must be >= 1")
    from bench.report import markdown, plots as make_plots
    from bench.run import run_suite

    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            fail("--device cuda: no CUDA device is available on this machine")
    engine = make_engine(make_settings(device=device))
    with results_only_stdout():
        results = run_suite(engine, nq, lens, repeats, counts, sizes, n_clients, log=lambda m: console.print(m),
                            requests=requests)
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

