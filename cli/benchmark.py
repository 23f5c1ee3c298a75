"""``kvlink-rag bench``: TTFT, load bandwidth, precompute throughput and scaling (:mod:`bench`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from cli.common import NQ_DEFAULT, console, fail, make_engine, make_settings, out, results_only_stdout

app = typer.Typer()


@app.command()
def bench(
    nq: Annotated[Path, typer.Option("--nq", "--data", help="NQ-open oracle JSONL(.gz) for real documents.")] = NQ_DEFAULT,
    lengths: Annotated[str, typer.Option(help="Context lengths in tokens (10 documents).")] = "1000,2000,4000,8000",
    doc_counts: Annotated[str, typer.Option(help="Document counts for TTFT scaling.")] = "1,5,10,20",
    store_sizes: Annotated[str, typer.Option(help="Synthetic entry counts for store scaling.")] = "100,1000,10000",
    clients: Annotated[str, typer.Option(help="Concurrent HTTP clients ('' to skip).")] = "1,4,16",
    requests: Annotated[int, typer.Option(help="HTTP queries per concurrency level (60/30/10% short/medium/long).")] = 32,
    repeats: Annotated[int, typer.Option()] = 3,
    suites: Annotated[str, typer.Option(help="Comma-separated groups: ttft, bandwidth, precompute, scaling, "
                                             "concurrency, serving, shared (the shared Redis tier), routing (the router's "
                                             "policies over replica processes), routing-sim (the router's policies "
                                             "on a simulated fleet, no model loaded), fairness (admission policies, two "
                                             "tenants), guidellm (vLLM's client over --clients "
                                             "levels, skipped when not installed; default all).")] = "all",
    device: Annotated[str, typer.Option(help="cpu | cuda")] = "cpu",
    json_out: Annotated[Optional[Path], typer.Option("--json")] = None,
    plots: Annotated[Optional[Path], typer.Option("--plots", help="Folder for PNG plots.")] = None,
    markdown_out: Annotated[Optional[Path], typer.Option("--markdown", help="Write the tables here (e.g. BENCHMARKS.md).")] = None,
) -> None:
    """Benchmark TTFT, cache loading, precompute and scaling.

    TTFT full vs linked vs floor, load bandwidth, precompute throughput and scaling, side by side.
    """
    try:
        ints = lambda s: [int(x) for x in s.split(",") if x.strip()]  # noqa: E731
        lens, counts, sizes, n_clients = ints(lengths), ints(doc_counts), ints(store_sizes), ints(clients)
    except ValueError:
        fail("--lengths, --doc-counts and --store-sizes take comma-separated integers")
    if requests < 1:
        fail("--requests must be >= 1")
    from bench.run import MODEL_FREE, SUITES, run_suite

    picked = SUITES if suites == "all" else tuple(x.strip() for x in suites.split(",") if x.strip())
    if not picked or set(picked) - set(SUITES):
        fail(f"--suites takes a comma-separated subset of {', '.join(SUITES)} (or all); got {suites!r}")

    if set(picked) <= set(MODEL_FREE):  # no model to load (the routing simulation)
        from bench.run import run_model_free, tokenizer_file

        with results_only_stdout():
            results = run_model_free(nq, tokenizer_file(make_settings()), log=lambda m: console.print(m), suites=picked)
        _write(results, json_out, plots, markdown_out)
        return
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            fail("--device cuda: no CUDA device is available on this machine")
    # documents stay whole (chunk_tokens=0): the suites size contexts by document (an 8k context is 10 documents
    # of ~800 tokens, which chunking would split into ~50 slots, each with its own link tokens and framing)
    engine = make_engine(make_settings(device=device, chunk_tokens=0))
    with results_only_stdout():
        results = run_suite(engine, nq, lens, repeats, counts, sizes, n_clients, log=lambda m: console.print(m),
                            requests=requests, suites=picked)
    _write(results, json_out, plots, markdown_out)


def _write(results: dict, json_out: Path | None, plots: Path | None, markdown_out: Path | None) -> None:
    """The tables on stdout, and the JSON, plots and markdown file where asked."""
    from bench.report import markdown, plots as make_plots

    command = "kvlink-rag bench " + " ".join(sys.argv[2:]) if len(sys.argv) > 2 else "kvlink-rag bench"
    text = markdown(results, command)
    out.print(text)
    if json_out is not None:
        json_out.write_text(json.dumps(results, indent=2))
    if plots is not None and not {"ttft", "scaling_documents"} <= set(results):
        console.print("no plots: they draw the ttft and scaling suites, which did not run")
    elif plots is not None:
        for p in make_plots(results, plots):
            console.print(f"plot: {p}")
    if markdown_out is not None:
        markdown_out.write_text("# Benchmarks\n\n" + text)



@app.command("bench-edit")
def bench_edit(
    nq: Annotated[Path, typer.Option("--nq", "--data", help="NQ-open oracle JSONL(.gz): passages of the document.")] = NQ_DEFAULT,
    tokens: Annotated[int, typer.Option(help="Document length (tokens; at most what one block can hold).")] = 8000,
    chunk_tokens: Annotated[int, typer.Option(help="Chunk size of the chunked document (>= 64).")] = 512,
    parts: Annotated[str, typer.Option(help="Comma list of chunked, block: which to encode.")] = "chunked,block",
    importance: Annotated[bool, typer.Option(help="Score token importance while encoding (the service's default; "
                                             "eager attention, quadratic in a block's length).")] = True,
    json_out: Annotated[Optional[Path], typer.Option("--json")] = None,
) -> None:
    """Bytes and seconds re-encoded after a one-paragraph edit of a long document: chunked vs one block."""
    picked = tuple(p.strip() for p in parts.split(",") if p.strip())
    if chunk_tokens < 64 or tokens < 1 or not picked or set(picked) - {"chunked", "block"}:
        fail("--chunk-tokens must be >= 64, --tokens >= 1 and --parts some of chunked, block")
    from bench.chunk_edit import markdown, measure
    from evaluation.nq import DataFormatError, load_nq

    try:
        examples = load_nq(nq)
    except DataFormatError as e:
        fail(str(e))
    from kvlink_rag.cache import MemoryCache

    engine = make_engine(make_settings(importance_scores=importance), cache=MemoryCache())  # no store: the measure counts its own caches
    with results_only_stdout():
        result = measure(engine, examples, tokens, chunk_tokens, log=lambda m: console.print(m), parts=picked)
    out.print(markdown(result))
    if json_out is not None:
        json_out.write_text(json.dumps(result, indent=2))


@app.command("bench-engine")
def bench_engine(
    formats: Annotated[str, typer.Option(help="Comma list of runner weight formats.")] = "native,bfloat16,int8,int4,int4-bf16,int4-f32,q4q8-bf16,q4q8-f32",
    context: Annotated[int, typer.Option(help="Prefill length (tokens).")] = 1300,
    new: Annotated[int, typer.Option(help="Decode steps (tokens).")] = 24,
    repeats: Annotated[int, typer.Option(help="Runs per engine (the best is reported).")] = 2,
    e2e_questions: Annotated[int, typer.Option(help="NQ questions answered end to end against llama-server "
                                               "(0 = skip).")] = 0,
    nq: Annotated[Path, typer.Option("--nq", "--data", help="NQ-open oracle JSONL(.gz) for --e2e-questions.")] = NQ_DEFAULT,
    json_out: Annotated[Optional[Path], typer.Option("--json")] = None,
) -> None:
    """Prefill and decode tokens/s: the model runner in each weight format, transformers' eager forward and
    llama.cpp's llama-bench (skipped with its reason when not built), side by side in one run; with
    --e2e-questions, the same NQ prompts end to end against llama-server."""
    from kvlink_rag.runtime.linear import WEIGHT_FORMATS

    picked = [f.strip() for f in formats.split(",") if f.strip()]
    if not picked or set(picked) - set(WEIGHT_FORMATS) or context < 1 or new < 1 or repeats < 1:
        fail(f"--formats takes a comma list of {', '.join(WEIGHT_FORMATS)}; --context, --new and --repeats >= 1")
    import torch

    from bench.engine import engine_rows, markdown
    from bench.llama_cpp import llama_bench
    from kvlink_rag.model.convert import GGUF_NAME
    from kvlink_rag.runtime import q4q8

    if not q4q8.available():  # the q4q8 formats need the runner's CPU kernels (AVX512-VNNI and g++)
        skipped = [f for f in picked if f.startswith("q4q8")]
        picked = [f for f in picked if not f.startswith("q4q8")]
        if skipped:
            console.print(f"skipping {', '.join(skipped)}: the runner's CPU kernels do not run on this CPU")
    settings = make_settings()
    from kvlink_rag.cache import MemoryCache

    engine = make_engine(settings, cache=MemoryCache())
    threads = torch.get_num_threads()
    with results_only_stdout():
        rows = engine_rows(engine.lm, picked, context, new, repeats, log=lambda m: console.print(m))
        console.print("engine: llama.cpp llama-bench")
        peer = llama_bench(settings.models_dir / "downloads" / GGUF_NAME, threads, context, new)
    out.print(markdown(rows, peer, context, new, threads))
    e2e = _peer_e2e(engine, nq, settings, threads, e2e_questions) if e2e_questions > 0 else None
    if json_out is not None:
        json_out.write_text(json.dumps({"rows": rows, "llama_cpp": peer, "threads": threads, "e2e": e2e}, indent=2))


def _peer_e2e(engine, nq: Path, settings, threads: int, questions: int) -> dict:
    from bench.llama_server import markdown, peer_e2e
    from evaluation.nq import DataFormatError, load_nq
    from kvlink_rag.model.convert import GGUF_NAME

    try:
        examples = load_nq(nq)
    except DataFormatError as e:
        fail(str(e))
    with results_only_stdout():
        result = peer_e2e(engine, examples, settings.models_dir / "downloads" / GGUF_NAME, threads, questions,
                          log=lambda m: console.print(m))
    out.print(markdown(result))
    return result


@app.command("bench-attention")
def bench_attention(
    contexts: Annotated[str, typer.Option(help="Comma list of key counts per request.")] = "1300,4096",
    blocks: Annotated[str, typer.Option(help="Comma list of block sizes (tokens) for the paged layouts.")] = "16,256",
    flex: Annotated[bool, typer.Option(help="Also FlexAttention (torch.compile; ~2 min of compile per shape).")] = False,
    repeats: Annotated[int, typer.Option(help="Timed repeats (the best is reported).")] = 3,
    json_out: Annotated[Optional[Path], typer.Option("--json")] = None,
) -> None:
    """One layer's attention over a request's KV in each candidate layout (contiguous, prefix pieces, a paged
    block pool gathered or read per block, FlexAttention), decode and chunked-prefill steps, side by side."""
    try:
        ctx = [int(x) for x in contexts.split(",") if x.strip()]
        sizes = [int(x) for x in blocks.split(",") if x.strip()]
    except ValueError:
        fail("--contexts and --blocks take comma-separated integers")
    if not ctx or min(ctx) < 128 or (sizes and min(sizes) < 1) or repeats < 1:
        fail("--contexts must be >= 128 keys each, --blocks >= 1 token, --repeats >= 1")
    from bench.attention_layouts import attention_layouts, markdown

    with results_only_stdout():
        rows = attention_layouts(ctx, sizes, flex, repeats, log=lambda m: console.print(m))
    out.print(markdown(rows))
    if json_out is not None:
        json_out.write_text(json.dumps(rows, indent=2))


@app.command("bench-interference")
def bench_interference(
    nq: Annotated[Path, typer.Option("--nq", "--data", help="NQ-open oracle JSONL(.gz) for real documents.")] = NQ_DEFAULT,
    tokens: Annotated[int, typer.Option(help="Length of the full-prefill request's document (tokens).")] = 3300,
    samples: Annotated[int, typer.Option(help="Cached queries timed idle and while the long prefill runs.")] = 3,
    json_out: Annotated[Optional[Path], typer.Option("--json")] = None,
) -> None:
    """A cached query's TTFT idle and while a long full-mode prefill runs, chunked (KVLINK_RAG_MAX_STEP_TOKENS, with
    and without KVLINK_RAG_LONG_PREFILL_BUDGET's cap) and unchunked, side by side."""
    if tokens < 100 or samples < 1:
        fail("--tokens must be >= 100 and --samples >= 1")
    from bench.prefill_interference import markdown, prefill_interference
    from evaluation.nq import DataFormatError, load_nq

    try:
        examples = load_nq(nq)
    except DataFormatError as e:
        fail(str(e))
    settings = make_settings(max_document_tokens=max(tokens + 200, 4096))
    engine = make_engine(settings)
    with results_only_stdout():
        result = prefill_interference(engine, examples, tokens, samples, settings.max_step_tokens,
                                      settings.long_prefill_budget, log=lambda m: console.print(m))
    out.print(markdown(result))
    if json_out is not None:
        json_out.write_text(json.dumps(result, indent=2))
