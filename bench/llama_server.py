"""End to end against llama-server: the same 10-document NQ prompts (the same token ids) answered by
llama.cpp's server with full prefill (with and without ``--cache-reuse``) and by this engine, full and
linked, at 24 and 200 new tokens (``ignore_eos``, so every answer has that length). Bench only: skipped
with its reason when the binary is absent (:func:`bench.llama_cpp.find_binary`)."""

from __future__ import annotations

import json
import signal
import socket
import statistics
import subprocess
import time
import urllib.request
from pathlib import Path

from evaluation.nq import NQExample, build_documents
from kvlink_rag.engine import Engine

from .llama_cpp import find_binary


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(port: int, body: dict, timeout: float = 600) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def _start(binary: Path, gguf: Path, threads: int, extra: list[str]) -> tuple[subprocess.Popen, int]:
    port = _free_port()
    proc = subprocess.Popen([str(binary), "-m", str(gguf), "-t", str(threads), "-c", "8192", "--host", "127.0.0.1",
                             "--port", str(port), "-np", "1", *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited with {_exit_reason(proc.returncode)} before serving")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc, port
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError("llama-server did not become healthy in 120 s")


def _exit_reason(code: int) -> str:
    """``code`` of an exited process in words (a signal by name: SIGILL is a build for instructions this CPU
    lacks, e.g. llama.cpp's native flags on a VM that advertises more than it runs)."""
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}" + (" (SIGILL: built for instructions this CPU lacks?)" if code == 132 else "")


def _server_rows(binary: Path, gguf: Path, threads: int, prompts: list[list[int]], new: int, extra: list[str]) -> dict:
    proc, port = _start(binary, gguf, threads, extra)
    try:
        ttft, e2e, tps = [], [], []
        for ids in prompts:
            t0 = time.perf_counter()
            out = _post(port, {"prompt": ids, "n_predict": new, "ignore_eos": True, "temperature": 0.0,
                               "cache_prompt": bool(extra)})
            e2e.append(time.perf_counter() - t0)
            t = out["timings"]
            ttft.append((t["prompt_ms"] + t["predicted_ms"] / max(1, t["predicted_n"])) / 1000)
            tps.append(float(t["predicted_per_second"]))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return {"ttft_s": statistics.median(ttft), "decode_tok_s": statistics.median(tps), "e2e_s": statistics.median(e2e)}


def _engine_rows(engine: Engine, cases: list, new: int, linked: bool) -> dict:
    ttft, e2e, tps = [], [], []
    for question, docs in cases:
        ans = (engine.answer if linked else engine.answer_full)(question, docs, max_new_tokens=new, ignore_eos=True,
                                                                 temperature=0.0)
        ttft.append(ans.ttft_s)
        e2e.append(ans.total_s)
        tps.append((len(ans.token_ids) - 1) / max(1e-9, ans.total_s - ans.ttft_s))
    return {"ttft_s": statistics.median(ttft), "decode_tok_s": statistics.median(tps), "e2e_s": statistics.median(e2e)}


def peer_e2e(engine: Engine, examples: list[NQExample], gguf: Path, threads: int, questions: int = 3,
             new_tokens: tuple[int, ...] = (24, 200), log=print) -> dict:
    """Rows per (system, new tokens): median TTFT, decode tok/s and end-to-end seconds; documents are cached
    for the linked rows before timing (the product's case), every other row prefills them. A llama-server that
    is absent, exits or is not healthy in 120 s leaves our rows and ``skipped`` says why."""
    binary = find_binary("llama-server")
    cases = [(examples[i].question, build_documents(examples, i, 10, "middle")[0]) for i in range(questions)]
    prompts = [engine.prompt_ids(q, d).tolist() for q, d in cases]
    for q, d in cases:  # warm the document caches (and the code paths) once
        engine.answer(q, d, max_new_tokens=1)
    rows, failed = [], None
    for new in new_tokens:
        log(f"peer e2e: {new} new tokens")
        rows.append({"system": "kvlink-rag linked (cached documents)", "new": new, **_engine_rows(engine, cases, new, True)})
        rows.append({"system": "kvlink-rag full prefill", "new": new, **_engine_rows(engine, cases, new, False)})
        if binary is None or failed is not None:
            continue
        try:
            rows.append({"system": "llama-server full prefill", "new": new,
                         **_server_rows(binary, gguf, threads, prompts, new, [])})
            rows.append({"system": "llama-server --cache-reuse 256", "new": new,
                         **_server_rows(binary, gguf, threads, prompts, new, ["--cache-reuse", "256"])})
        except (RuntimeError, OSError) as e:  # the peer failed: our rows stand, its own are skipped with why
            failed = f"llama-server failed: {e}"
    skipped = failed if binary else "no llama-server binary (set KVLINK_RAG_LLAMA_CPP to llama.cpp's build/bin)"
    return {"rows": rows, "skipped": skipped, "prompt_tokens": statistics.median(len(p) for p in prompts)}


def markdown(result: dict) -> str:
    lines = [f"## End to end: the same 10-document NQ prompts (~{result['prompt_tokens']:.0f} tokens), greedy, ignore_eos", "",
             "| system | new tokens | TTFT s | decode tok/s | end to end s |", "|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['system']} | {r['new']} | {r['ttft_s']:.2f} | {r['decode_tok_s']:.1f} | {r['e2e_s']:.2f} |")
    if result["skipped"]:
        lines.append(f"\nllama-server: skipped ({result['skipped']})")
    return "\n".join(lines) + "\n"
