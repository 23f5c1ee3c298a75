"""llama.cpp as the peer: ``llama-bench`` on the GGUF the default model is converted from (bench only).

The binaries are looked up in ``$KVLINK_RAG_LLAMA_CPP`` (a folder holding ``llama-bench`` and
``llama-server``, e.g. ``vendor/llama.cpp/build/bin`` of the ``llama-cpp-python`` sdist built with cmake),
then on ``PATH``. Absent, every llama.cpp row is skipped with that reason; never part of ``make test``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path


def find_binary(name: str) -> Path | None:
    """``name`` in ``$KVLINK_RAG_LLAMA_CPP`` or on ``PATH``, or None."""
    folder = os.environ.get("KVLINK_RAG_LLAMA_CPP")
    if folder and (Path(folder) / name).is_file():
        return Path(folder) / name
    found = shutil.which(name)
    return Path(found) if found else None


def llama_bench(gguf: Path, threads: int, context: int, new: int, repeats: int = 3) -> dict:
    """``llama-bench -p context -n new -t threads`` on ``gguf``: ``{prefill_tok_s, decode_tok_s, model}``, or
    ``{skipped: reason}``."""
    binary = find_binary("llama-bench")
    if binary is None:
        return {"skipped": "no llama-bench binary (set KVLINK_RAG_LLAMA_CPP to llama.cpp's build/bin)"}
    if not gguf.exists():
        return {"skipped": f"no GGUF at {gguf} (run `kvlink-rag model fetch`)"}
    cmd = [str(binary), "-m", str(gguf), "-p", str(context), "-n", str(new), "-t", str(threads),
           "-r", str(repeats), "-o", "json"]
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=True)
        tests = json.loads(run.stdout)
    except (subprocess.SubprocessError, json.JSONDecodeError) as e:
        return {"skipped": f"llama-bench failed: {str(e)[:200]}"}
    by = {("prefill" if t.get("n_prompt") else "decode"): float(t["avg_ts"]) for t in tests}
    return {"prefill_tok_s": by.get("prefill", 0.0), "decode_tok_s": by.get("decode", 0.0), "model": gguf.name}
