"""guidellm (vLLM's benchmark client, https://github.com/vllm-project/guidellm) against this server: a
concurrency sweep (1/4/16 streams by default) of synthetic chat requests through ``/v1/chat/completions``,
with TTFT, inter-token latency and throughput as guidellm measures them.

The output length is fixed: guidellm sends ``max_completion_tokens`` with ``ignore_eos: true`` for the
``output_tokens`` of its synthetic data, and the suite adds vLLM's ``min_tokens`` through the backend's
``extras`` (both honoured by the server); the parsed rows carry the mean output tokens so a run shows it.
guidellm is a bench-only extra (``pip install -e '.[bench]'``); without it the suite is skipped with the
reason. Its synthetic prompts need a tokenizer: the converted model's folder (its ``tokenizer.json``), so
nothing is fetched from the network.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LEVELS = (1, 4, 16)


def guidellm_executable() -> str | None:
    """The ``guidellm`` command beside this interpreter (the venv's), else on ``PATH``, else None."""
    here = Path(sys.executable).with_name("guidellm")
    return str(here) if here.exists() else shutil.which("guidellm")


def guidellm_missing() -> str | None:
    """Why the guidellm suite cannot run (None when it can)."""
    if guidellm_executable() is None:
        return "guidellm is not installed (a bench-only extra: pip install -e '.[bench]')"
    return None


def guidellm_argv(exe: str, target: str, model: str, tokenizer: str, levels: list[int], requests: int,
                  prompt_tokens: int, output_tokens: int, out_json: Path) -> list[str]:
    """The ``guidellm run`` command line: concurrent profile over ``levels`` streams, ``requests`` per level
    (at least the level), synthetic text of ``prompt_tokens`` / ``output_tokens`` tokens, JSON report at
    ``out_json``; ``min_tokens`` = ``output_tokens`` in each request body."""
    backend = {"kind": "openai_http", "target": target, "model": model, "request_format": "/v1/chat/completions",
               "extras": {"body": {"min_tokens": output_tokens}}}
    return [exe, "run", "--backend", json.dumps(backend),
            "--profile", json.dumps({"kind": "concurrent", "streams": list(levels)}),
            "--constraint", json.dumps({"kind": "max_requests", "count": [max(requests, n) for n in levels]}),
            "--data", json.dumps({"kind": "synthetic_text", "prompt_tokens": prompt_tokens,
                                  "output_tokens": output_tokens}),
            "--tokenizer", json.dumps({"kind": "hf_auto", "model": tokenizer}),
            "--output", json.dumps({"kind": "json", "path": str(out_json)}), "--disable-console-interactive"]


def _stat(metrics: dict, name: str, field: str = "median", scale: float = 1.0) -> float | None:
    """``metrics[name]["successful"][field]`` (guidellm's distribution summaries) times ``scale``."""
    try:
        value = metrics[name]["successful"][field]
    except (KeyError, TypeError):
        return None
    return None if value is None else float(value) * scale


def parse_report(report: dict) -> list[dict]:
    """One row per benchmark (concurrency level) of a guidellm JSON report: ``{"streams", "requests",
    "errors", "ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50", "itl_ms_p99", "output_tokens_per_s",
    "requests_per_s", "output_tokens_mean"}`` (None where the report lacks a figure; TTFT and ITL as
    guidellm reports them, in ms).

    Raises:
        ValueError: not a guidellm report (no ``benchmarks`` list).
    """
    benches = report.get("benchmarks") if isinstance(report, dict) else None
    if not isinstance(benches, list):
        raise ValueError("not a guidellm report: no 'benchmarks' list")
    rows = []
    for b in benches:
        m, strategy = b.get("metrics", {}), b.get("config", {}).get("strategy", {})
        totals = m.get("request_totals", {})
        rows.append({"streams": strategy.get("streams"), "requests": totals.get("successful"),
                     "errors": totals.get("errored"),
                     "ttft_ms_p50": _stat(m, "time_to_first_token_ms"),
                     "ttft_ms_p99": _percentile(m, "time_to_first_token_ms", "p99"),
                     "itl_ms_p50": _stat(m, "inter_token_latency_ms"),
                     "itl_ms_p99": _percentile(m, "inter_token_latency_ms", "p99"),
                     "output_tokens_per_s": _stat(m, "output_tokens_per_second", "mean"),
                     "requests_per_s": _stat(m, "requests_per_second", "mean"),
                     "output_tokens_mean": _stat(m, "output_token_count", "mean")})
    return rows


def _percentile(metrics: dict, name: str, p: str) -> float | None:
    try:
        value = metrics[name]["successful"]["percentiles"][p]
    except (KeyError, TypeError):
        return None
    return None if value is None else float(value)


@contextmanager
def serving(app) -> Iterator[str]:
    """``app`` on a free loopback port under uvicorn in a thread; yields its base URL."""
    import socket

    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 300
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the server did not start")
        time.sleep(0.1)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(60)


def guidellm_suite(engine, levels: list[int] | None = None, requests: int = 4, prompt_tokens: int = 128,
                   output_tokens: int = 16, timeout_s: float = 3600, log=print) -> dict:
    """Run guidellm's sweep against a server over ``engine`` (plain chat: no documents stored); returns
    ``{"rows": parse_report(...), "command": [...]}``, ``{"skipped": reason}`` without guidellm, or
    ``{"failed": reason}`` when guidellm exits non-zero or writes no report."""
    reason = guidellm_missing()
    if reason is not None:
        log(f"guidellm: skipped ({reason})")
        return {"skipped": reason}
    from api.main import create_app
    from api.openai_format import MODEL_ID

    levels = list(levels or LEVELS)
    home = Path(tempfile.mkdtemp(prefix="kvlink-bench-guidellm-"))
    app = create_app(engine.settings.model_copy(update={"home": home}), engine)
    out_json = home / "guidellm.json"
    tokenizer = str(engine.lm.tokenizer.name_or_path)
    with serving(app) as url:
        argv = guidellm_argv(guidellm_executable(), url, MODEL_ID, tokenizer, levels, requests, prompt_tokens,
                             output_tokens, out_json)
        log(f"guidellm: {len(levels)} levels against {url}")
        env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "GUIDELLM__LOGGING__CONSOLE_LOG_LEVEL": "WARNING"}
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                              env={**_environ(), **env})
    if proc.returncode != 0 or not out_json.exists():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"failed": f"guidellm exited {proc.returncode}: " + " | ".join(tail), "command": argv}
    return {"rows": parse_report(json.loads(out_json.read_text())), "command": argv,
            "prompt_tokens": prompt_tokens, "output_tokens": output_tokens}


def _environ() -> dict:
    import os

    return dict(os.environ)


def guidellm_section(results: dict) -> list[str]:
    """BENCHMARKS.md lines of a ``results["guidellm"]`` entry: the skip or failure reason, else the table."""
    g = results["guidellm"]
    lines = ["## guidellm sweep (vLLM's benchmark client, /v1/chat/completions)", ""]
    if "rows" not in g:
        return lines + [f"Not run: {g.get('skipped') or g.get('failed')}."]
    lines += [f"Synthetic prompts of {g['prompt_tokens']} tokens, {g['output_tokens']} output tokens forced "
              "(ignore_eos + min_tokens), concurrent streams; TTFT and ITL as guidellm measures them.", "",
              "| streams | requests (errors) | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | output tok/s "
              "| requests/s | mean output tokens |", "|---|---|---|---|---|---|---|---|---|"]

    def f(v, digits: int = 1) -> str:
        return "-" if v is None else f"{v:.{digits}f}"

    for r in g["rows"]:
        lines.append(f"| {r['streams']} | {r['requests']} ({r['errors'] or 0}) | {f(r['ttft_ms_p50'])} "
                     f"| {f(r['ttft_ms_p99'])} | {f(r['itl_ms_p50'])} | {f(r['itl_ms_p99'])} "
                     f"| {f(r['output_tokens_per_s'], 2)} | {f(r['requests_per_s'], 3)} | {f(r['output_tokens_mean'])} |")
    return lines
