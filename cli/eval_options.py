"""``kvlink-rag eval``'s argument handling: the task (nq, kv-retrieval, long-docs, contrast), the mode variants
(retention, CacheBlend ratios, chunk sizes) and the checks that run before the model loads."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from cli.common import fail
from kvlink_rag.types import ContextTooLong
from training.modes import EVAL_POSITIONS, MODES

if TYPE_CHECKING:
    from kvlink_rag.engine import Engine

ADAPTED = ("full-adapted", "linked-query-lora")  # the modes that take --adapter
TaskOpt = Annotated[str, typer.Option(help="nq; kv-retrieval (generated UUID key-value pairs, exact match); "
                                      "long-docs (the --docs passages joined into ONE document); contrast (16 "
                                      "hand-written questions over their answer and a document saying the "
                                      "opposite: --docs 2 --gold-position first,last).")]
PositionsOpt = Annotated[str, typer.Option(help="Comma list of first, middle, last, random, rotate "
                                          "(question i at first/middle/last in turn).")]
RatiosOpt = Annotated[Optional[str], typer.Option(
    "--recompute-ratio", help="Comma list of CacheBlend recompute ratios in [0, 1]: naive runs as cacheblend-X, "
    "a linked mode as <mode>+blend-X (0: the mode itself).")]


def new_tokens(task: str, max_new_tokens: int | None) -> int:
    """``--max-new-tokens``, by default 24 (NQ's short answers) or 100 for kv-retrieval (a UUID is 30-36
    tokens and full prefill restates the key first, as in lost-in-the-middle)."""
    return max_new_tokens if max_new_tokens is not None else (100 if task == "kv-retrieval" else 24)


def task_examples(task: str, data: Path, n: int, docs: int, pairs: int, seed: int) -> tuple[list, object, object, str]:
    """``(examples, documents builder, metric, title)`` of ``eval --task``: NQ read from ``data`` (for
    long-docs, each question's passages joined into one document, :func:`training.long_docs.long_documents`),
    or ``n`` generated key-value retrieval questions (:mod:`training.kv_retrieval`); or exit on a bad value."""
    if task == "kv-retrieval":
        from training import kv_retrieval as kv

        try:
            examples = kv.make_examples(n, docs, pairs, seed)
        except ValueError as e:
            fail(str(e))
        return examples, kv.build_documents, kv.exact_match, f"KV retrieval ({pairs} pairs/document, exact match)"
    if task == "contrast":
        from evaluation import contrast

        if not 2 <= docs <= contrast.MAX_DOCS:
            fail(f"--task contrast takes --docs 2..{contrast.MAX_DOCS} (a question's answering document, "
                 f"its contrast and other cases' documents), not {docs}")
        return (contrast.make_examples(), contrast.build_documents, contrast.contrast_match,
                "contrast questions (answer from the answering document, nothing from its contrast)")
    from evaluation.nq import DataFormatError, best_subspan_em, build_documents, load_nq
    from training.long_docs import long_documents

    try:
        return (load_nq(data), long_documents if task == "long-docs" else build_documents, best_subspan_em,
                "NQ-open" + (" (passages in one long document)" if task == "long-docs" else ""))
    except DataFormatError as e:
        fail(str(e))


def question_step(bar, engines: dict[str, Engine], task: str):
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
def too_long_exits():
    """Exit with a one-line error when a prompt does not fit the model's context (too many --docs)."""
    try:
        yield
    except ContextTooLong as e:
        fail(f"{e} (fewer --docs or --max-new-tokens)")


def chunk_sizes(task: str, chunk_tokens: str | None) -> list[int]:
    """``--chunk-tokens`` of ``--task long-docs`` (each 0 or >= 64; default 0,512); ``[]`` for the other tasks,
    which take no such option; or exit."""
    if task not in ("nq", "kv-retrieval", "long-docs", "contrast"):
        fail(f"unknown task {task!r}; choose nq, kv-retrieval, long-docs or contrast")
    if task != "long-docs" and chunk_tokens is not None:
        fail(f"--chunk-tokens is an option of --task long-docs (task {task} links whole documents)")
    chunk_tokens = chunk_tokens or "0,512"
    try:
        sizes = [int(x) for x in chunk_tokens.split(",") if x.strip()] if task == "long-docs" else []
    except ValueError:
        fail(f"--chunk-tokens takes comma-separated integers, got {chunk_tokens!r}")
    if task == "long-docs" and (not sizes or any(0 < s < 64 or s < 0 for s in sizes)):
        fail(f"--chunk-tokens: each size is 0 (one block) or at least 64 tokens, got {chunk_tokens!r}")
    return sizes


def task_engines(task: str, sizes: list[int], engines: dict) -> tuple[dict, list[str]]:
    """``(label -> engine, labels)`` of ``--task``: as given, or for long-docs every linked mode once per
    chunk size in ``sizes`` (:func:`training.long_docs.long_doc_engines`)."""
    if task != "long-docs":
        return engines, list(engines)
    from training.long_docs import long_doc_engines

    engines = long_doc_engines(engines, sizes)
    return engines, list(engines)


def retention_variants(wanted: list[str], retention: str | None, methods: str, explain: bool = False) -> dict:
    """Mode label -> (mode, :class:`training.eval.Retention` or None): each linked mode at every retention and
    method (r=1 once), or the modes as they are without ``--retention``; with ``explain`` also each linked mode
    explained at r=1 (``"<mode> r=1 explain"``); or exit on a bad value."""
    from kvlink_rag.bounds import METHODS, check_retention
    from training.modes import Retention

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


def with_blend_ratios(variants: dict, ratios: str | None) -> dict:
    """``variants`` with each reuse mode at every ``--recompute-ratio`` (:mod:`training.blend_modes`; none: as
    they are), or exit."""
    from training.blend_modes import blend_variants, parse_ratios

    if ratios is None:
        return variants
    try:
        values = parse_ratios(ratios)
    except ValueError as e:
        fail(f"--recompute-ratio: {e}")
    blended = blend_variants(variants, values)
    if blended.keys() == variants.keys() and any(r > 0 for r in values):
        fail("--recompute-ratio applies to reused caches (naive and linked modes), not to full prefill")
    return blended


def eval_choices(modes: str, gold_position: str, links: Path | None, adapter: Path | None) -> tuple[list[str], list[str]]:
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


StartOpt = Annotated[int, typer.Option(help="First question evaluated (questions start..n-1): shards a run across "
                                       "processes; eval-report merges their row files.")]
EvalDocCacheOpt = Annotated[str, typer.Option(help="memory: document caches in this process only; store: in the store "
                                              "under KVLINK_RAG_HOME, shared by parallel and later runs (nq, "
                                              "long-docs; not with --int8 or --retention).")]
TagOpt = Annotated[str, typer.Option(help="Appended to every mode label as @TAG (e.g. the artifact's name), so "
                                     "eval-report compares runs of one mode with different artifacts.")]
RetrieveOpt = Annotated[int, typer.Option(help="nq: link only the K best BM25 matches of the question among its "
                                          "--docs candidates (after the cut-off below); 0 links every candidate. "
                                          "Prints recall@1/3/5/10 of the gold passage over the candidates, the "
                                          "documents kept per question and how often the gold one is among them.")]
MinRelativeOpt = Annotated[float, typer.Option(help="--retrieve: keep matches scoring at least this fraction of the "
                                             "best (the server's KVLINK_RAG_RETRIEVAL_MIN_RELATIVE_SCORE; 0: all K).")]
MinScoreOpt = Annotated[float, typer.Option(help="--retrieve: keep matches scoring at least this (BM25).")]


def retrieving(task: str, top_k: int, cutoff: tuple[float, float], build, examples, n: int, start: int,
               n_docs: int, positions: list[str], seed: int) -> tuple[object, dict]:
    """``(documents builder, {"retrieval": recall@k})`` of ``--retrieve``: ``build`` followed by BM25 over the
    candidates (:class:`training.retrieved.Retrieve`) and the recall printed; ``(build, {})`` without it; or
    exit on a bad value."""
    relative, floor = cutoff
    if not top_k and (relative or floor):
        fail("--min-relative-score and --min-score apply with --retrieve K")
    if not top_k:
        return build, {}
    if task != "nq" or top_k < 0 or not 0 <= relative <= 1 or floor < 0:
        fail("--retrieve K (K >= 1) is an option of --task nq, with --min-relative-score in [0, 1] and --min-score >= 0")
    from training.retrieved import Retrieve, recall_at

    retrieve = Retrieve(top_k, relative, floor)
    recall = recall_at(examples, n, start, n_docs, positions, seed, build, retrieve)
    print("retrieval over the candidates: " + ", ".join(f"{k} {v:.3f}" if k != "n" else f"n {v}"
                                                           for k, v in recall.items()), flush=True)
    return retrieve.build(build), {"retrieval": recall}
