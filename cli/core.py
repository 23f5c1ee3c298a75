"""The core commands of ``kvlink-rag``: ``ask`` (one question over document files or one NQ question),
``demo`` (the main job on real NQ questions) and ``model fetch``."""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

import typer

from cli.common import (NQ_DEFAULT, DtypeOpt, EncOpt, KOpt, NqOpt, check_adapter_name, console, fail,
                        fetch_default_model, make_engine, make_settings, out, progress_bar, results_only_stdout)
from cli.documents import FIT_HINT, NQ_HINT, ask_inputs, check_fits
from cli.explain import RecomputeOpt, RetentionOpt, attribution_dict, checked_recompute, checked_retention, \
    print_attribution

app = typer.Typer()
model_app = typer.Typer(no_args_is_help=True, help="Model management.")


@model_app.command("fetch")
def model_fetch() -> None:
    """Download and convert the default model (once; a no-op after that).

    Prints the converted model's folder; the download and conversion report on stderr.
    """
    out.print(str(fetch_default_model(make_settings())))


@app.command()
def ask(
    question: Annotated[Optional[str], typer.Argument(help="The question (omit with --nq).")] = None,
    doc: Annotated[list[Path], typer.Option("--doc", help="A document file; repeat for several.")] = [],
    nq: Annotated[Optional[Path], typer.Option("--nq", "--data", help="NQ-open oracle JSONL(.gz): answer question --index.")] = None,
    index: Annotated[int, typer.Option(help="Question index in --nq.")] = 0,
    docs: Annotated[int, typer.Option("--docs", help="Documents per question with --nq (gold + distractors).")] = 10,
    gold_position: Annotated[str, typer.Option(help="first | middle | last | random")] = "random",
    k: KOpt = None, encoding: EncOpt = None, kv_dtype: DtypeOpt = None,
    max_new_tokens: Annotated[Optional[int], typer.Option()] = None,
    temperature: Annotated[Optional[float], typer.Option()] = None,
    top_p: Annotated[Optional[float], typer.Option()] = None,
    seed: Annotated[Optional[int], typer.Option(min=0, max=2**64 - 1, help="Sampling seed (with --temperature "
                                                ">= 1e-5); without one, sampling is nondeterministic.")] = None,
    adapter: Annotated[Optional[str], typer.Option(help="default, none, lookup (bundled: exact "
                                                   "lookups such as key-value retrieval) or a named adapter in "
                                                   "$KVLINK_RAG_HOME/links (train-links --name).")] = None,
    compare: Annotated[bool, typer.Option("--full/--no-full", help="Also answer with full prefill, for comparison "
                                          "(slow on long documents).")] = True,
    retention: RetentionOpt = None,
    explain: Annotated[bool, typer.Option("--explain", help="Also print each document's share of the answer's "
                                          "attention and its top passages.")] = False,
    recompute_ratio: RecomputeOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output (only JSON on stdout).")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Also print where the time went.")] = False,
) -> None:
    """Answer a question over --doc files or one NQ question (--nq).

    Answers with the documents' cached KV re-linked and, unless --no-full, with full prefill too.
    """
    start = time.perf_counter()
    retention, recompute_ratio = checked_retention(retention), checked_recompute(recompute_ratio)
    if recompute_ratio and explain:
        fail("--recompute-ratio and --explain do not combine (explain reads the reused caches' attention)")
    question, documents, gold = ask_inputs(question, doc, nq, index, docs, gold_position)
    settings = make_settings(k, encoding, kv_dtype)
    check_adapter_name(settings, adapter)
    timings: dict[str, float] = {}
    with _timings_on_failure(timings, start, verbose):
        engine = _with_adapter(make_engine(settings, timings, adhoc=True), adapter)
        check_fits(engine, question, documents, NQ_HINT if nq else FIT_HINT)  # before any document is encoded
        sampling = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed)
        with results_only_stdout():
            linked, full, hits, att = _answer(engine, question, documents, compare, sampling, timings, retention,
                                              explain, recompute_ratio)
    timings["total_s"] = time.perf_counter() - start
    _print_answer(question, gold, linked, full, hits, len(documents), settings, timings, as_json, verbose,
                  attribution_dict(att) if att is not None else None, engine.recompute_ratio(recompute_ratio))
    if att is not None and not as_json:
        print_attribution(att, documents, settings.attribution)


def _with_adapter(engine, adapter: str | None):
    """``engine`` with the named adapter (None: as it is); a one-line error for one made for another model."""
    if adapter is None:
        return engine
    from kvlink_rag.adapter_registry import AdapterVariants

    try:
        return AdapterVariants(engine).get(adapter)
    except (KeyError, ValueError) as e:  # UnknownAdapter, LinkTokensMismatch
        fail(str(e))


@contextmanager
def _timings_on_failure(timings: dict[str, float], start: float, verbose: bool):
    """With ``--verbose``, a command that fails after measuring something still prints what it measured (its
    ``time:`` line, ``total`` up to the failure) on stderr, after the error."""
    try:
        yield
    except typer.Exit as e:
        if verbose and timings and e.exit_code:
            console.print(_time_line({**timings, "total_s": time.perf_counter() - start}))
        raise


def _time_line(timings: dict[str, float]) -> str:
    """``time: import 1.20 s, model load 2.31 s, ...`` (``--verbose``: seconds per stage)."""
    return "time: " + ", ".join(f"{name[:-2].replace('_', ' ')} {v:.2f} s" for name, v in timings.items())


def _answer(engine, question, documents, compare, sampling, timings, retention=None, explain=False,
            recompute_ratio=None):
    """Precompute what is not cached, then answer linked at ``retention`` and ``recompute_ratio`` (explained:
    with its attribution), and with full prefill when ``compare``.

    Returns ``(linked Answer, full Answer or None, CacheHits, Attribution or None)``; adds ``documents_s``,
    ``answer_s`` and (when ``compare``) ``answer_full_s`` to ``timings``."""
    try:
        t0 = time.perf_counter()
        hits = _warm(engine, documents)  # precompute outside the TTFT
        t1 = time.perf_counter()
        timings["documents_s"] = t1 - t0  # now: a failure below still reports it (--verbose)
        att = None
        if explain:
            from kvlink_rag.explain.answers import explain_answer

            linked, att = explain_answer(engine, question, documents, retention=retention, **sampling)
            if engine.settings.attribution == "leave_one_out":  # KVLINK_RAG_ATTRIBUTION, as the service
                from kvlink_rag.explain.leave_one_out import apply_leave_one_out, leave_one_out

                att = apply_leave_one_out(att, leave_one_out(engine, question, documents, linked.token_ids,
                                                             retention=retention))
        else:
            linked = engine.answer(question, documents, retention=retention, recompute_ratio=recompute_ratio,
                                   **sampling)
        t2 = time.perf_counter()
        timings["answer_s"] = t2 - t1
        full = engine.answer_full(question, documents, **sampling) if compare else None
    except ValueError as e:
        fail(str(e))
    if compare:
        timings["answer_full_s"] = time.perf_counter() - t2
    return linked, full, hits, att


@dataclass(frozen=True)
class CacheHits:
    """What was cached before ``ask`` ran: documents all of whose chunks were (a repeated document counts once),
    and chunks (a document that is not chunked is one chunk) out of ``chunks``."""

    documents: int
    chunk_hits: int
    chunks: int


def _warm(engine, documents) -> CacheHits:
    """Encode and cache what is not cached yet (each chunk of a long document); what was cached before."""
    docs = chunk_hits = chunks = 0
    seen: set[str] = set()
    for d in documents:
        key, fresh = engine.cache_key(d), [not engine.get_or_encode(c)[1] for c in engine.chunks(d)]
        if key not in seen:
            docs += not any(fresh)
            chunk_hits += fresh.count(False)
            chunks += len(fresh)
        seen.add(key)
    return CacheHits(docs, chunk_hits, chunks)


def _print_answer(question, gold, linked, full, hits: CacheHits, n_docs, settings, timings, as_json, verbose,
                  attribution=None, recompute_ratio: float = 0.0):
    """The ``ask`` result: JSON (``--json``), else lines; ``--verbose`` adds the time breakdown."""
    from evaluation.nq import best_subspan_em

    result = {
        "question": question, "answer": linked.text, "answer_full": full.text if full else None, "gold_answers": gold,
        "match": best_subspan_em(linked.text, gold) if gold else None,
        "match_full": best_subspan_em(full.text, gold) if gold and full else None,
        "ttft_full_s": full.ttft_s if full else None, "ttft_linked_s": linked.ttft_s, "cache_hits": hits.documents,
        "chunk_cache_hits": hits.chunk_hits, "chunks": hits.chunks, "recompute_ratio": recompute_ratio,
        "documents": n_docs, "context_tokens": linked.context_tokens, "link_k": settings.link_k,
        "encoding": settings.encoding, "timings_linked": linked.timings, "timings": timings,
    }
    if attribution is not None:
        result["attribution"] = attribution
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
    chunked = f" ({hits.chunk_hits}/{hits.chunks} chunks)" if hits.chunks > n_docs else ""
    out.print(f"{speed}, {hits.documents}/{n_docs} cached before this run{chunked}, {linked.context_tokens} context tokens")
    if verbose:
        out.print(_time_line(timings))


@app.command()
def demo(
    nq: NqOpt = NQ_DEFAULT,
    questions: Annotated[int, typer.Option(help="How many questions.")] = 5,
    docs: Annotated[int, typer.Option("--docs", help="Documents per question.")] = 10,
    k: KOpt = None, encoding: EncOpt = None, kv_dtype: DtypeOpt = None,
) -> None:
    """The main job: NQ answers, full prefill vs reused caches.

    Precomputes the real NQ documents of the first --questions questions, then answers each with full
    prefill and with the linked caches, side by side.
    """
    from evaluation.nq import DataFormatError, best_subspan_em, build_documents, load_nq

    if questions < 1:
        fail("--questions must be >= 1")
    try:
        examples = load_nq(nq)
        sets = [build_documents(examples, i, docs, "random")[0] for i in range(min(questions, len(examples)))]
    except (DataFormatError, ValueError) as e:
        fail(str(e))
    engine = make_engine(make_settings(k, encoding, kv_dtype), adhoc=True)
    for i, documents in enumerate(sets):  # every question fits before any document is encoded
        check_fits(engine, examples[i].question, documents, f"{NQ_HINT} (question {i + 1} does not fit)")
    unique = {engine.cache_key(d): d for s in sets for d in s}
    hits = 0
    with progress_bar("precomputing documents", len(unique)) as bar, results_only_stdout():
        for d in unique.values():
            hits += engine.warm(d)
            bar.advance()
    console.print(f"{len(unique)} documents: {hits} already cached, {len(unique) - hits} precomputed now")
    out.print(f"[bold]NQ-open, {docs} documents per question (gold among distractors), K={engine.settings.link_k} "
              f"link tokens, {engine.settings.encoding} encoding[/bold]")
    score: dict[str, list[float]] = {"full": [], "linked": []}
    speedups = []
    mark = lambda m: "[green]✓[/green]" if m else "[red]✗[/red]"  # noqa: E731
    for i, documents in enumerate(sets):
        ex = examples[i]
        full = engine.answer_full(ex.question, documents)
        linked = engine.answer(ex.question, documents)
        mf, ml = best_subspan_em(full.text, ex.answers), best_subspan_em(linked.text, ex.answers)
        score["full"].append(mf)
        score["linked"].append(ml)
        speedups.append(full.ttft_s / max(linked.ttft_s, 1e-9))
        out.print(f"\n[bold]Q{i + 1}:[/bold] {ex.question}?  [dim]gold: {' | '.join(ex.answers[:3])}[/dim]")
        out.print(f"  full prefill {mark(mf)} TTFT {full.ttft_s * 1000:6.0f} ms  {full.text[:100]}")
        out.print(f"  linked       {mark(ml)} TTFT {linked.ttft_s * 1000:6.0f} ms  {linked.text[:100]}  "
                  f"[dim]({linked.cache_hits}/{len(documents)} cached, {linked.context_tokens} context tokens)[/dim]")
    _summary(score, sorted(speedups))


def _summary(score: dict[str, list[float]], speedups: list[float]) -> None:
    """Accuracy per mode with its 95% bootstrap interval, and what so few questions can say."""
    from training.eval import bootstrap_ci

    n = len(speedups)
    parts = []
    for mode, name in (("full", "full prefill"), ("linked", "linked")):
        lo, hi = bootstrap_ci(score[mode])
        parts.append(f"{name} {sum(score[mode]) / n:.2f} [95% CI {lo:.2f}-{hi:.2f}]")
    out.print(f"\naccuracy over {n} questions: {', '.join(parts)}; "
              f"median TTFT speed-up of linked caches over full prefill {speedups[n // 2]:.1f}x")
    if n < 100:
        out.print(f"[dim]{n} questions cannot tell the two modes apart (the intervals overlap); the measured "
                  "comparison, on hundreds of questions, is in EVALUATION.md ([cyan]kvlink-rag eval[/cyan]).[/dim]")


