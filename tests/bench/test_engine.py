"""The engine benchmark and its llama.cpp peers on a tiny model: rows filled, peers skipped with a reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.engine import engine_rows, markdown
from bench.llama_cpp import llama_bench
from bench.llama_server import markdown as e2e_markdown
from bench.llama_server import peer_e2e
from factories import NQ_PATH, tiny_model, tiny_text_engine


def test_engine_rows_for_transformers_and_each_format():
    lm = tiny_model("llama")
    rows = engine_rows(lm, ["native", "int8"], context=40, new=3, repeats=1, log=lambda m: None)
    assert [r["engine"] for r in rows] == ["transformers eager", "runner native", "runner int8"]
    assert all(r["prefill_tok_s"] > 0 and r["decode_tok_s"] > 0 and r["decode_after_context_tok_s"] > 0 for r in rows)
    text = markdown(rows, {"skipped": "no llama-bench binary"}, 40, 3, 1)
    assert "| runner int8 |" in text and "llama.cpp: skipped (no llama-bench binary)" in text


def test_the_llama_cpp_peers_skip_with_their_reason_when_absent(monkeypatch, tmp_path):
    monkeypatch.setenv("KVLINK_RAG_LLAMA_CPP", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    assert "no llama-bench binary" in llama_bench(Path("x.gguf"), 1, 10, 2)["skipped"]
    if not NQ_PATH.exists():
        pytest.skip(f"{NQ_PATH} not present")
    from evaluation.nq import load_nq

    engine = tiny_text_engine(tmp_path)
    result = peer_e2e(engine, load_nq(NQ_PATH), Path("x.gguf"), 1, questions=1, new_tokens=(3,), log=lambda m: None)
    assert [r["system"] for r in result["rows"]] == ["kvlink-rag linked (cached documents)", "kvlink-rag full prefill"]
    assert all(r["e2e_s"] >= r["ttft_s"] > 0 for r in result["rows"])
    assert "llama-server: skipped (no llama-server binary" in e2e_markdown(result)


def test_a_peer_that_crashes_is_skipped_with_its_exit_and_our_rows_stand(monkeypatch, tmp_path):
    """A llama.cpp built for instructions this CPU lacks dies with SIGILL (exit 132 from a shell): llama-bench and
    llama-server are reported skipped with that reason, and the engine's own rows are kept."""
    for name in ("llama-bench", "llama-server"):
        fake = tmp_path / name
        fake.write_text("#!/bin/sh\nexit 132\n")
        fake.chmod(0o755)
    gguf = tmp_path / "x.gguf"
    gguf.write_bytes(b"")
    monkeypatch.setenv("KVLINK_RAG_LLAMA_CPP", str(tmp_path))
    assert "llama-bench failed" in llama_bench(gguf, 1, 10, 2)["skipped"]
    if not NQ_PATH.exists():
        pytest.skip(f"{NQ_PATH} not present")
    from evaluation.nq import load_nq

    engine = tiny_text_engine(tmp_path)
    result = peer_e2e(engine, load_nq(NQ_PATH), gguf, 1, questions=1, new_tokens=(3, 4), log=lambda m: None)
    assert [r["system"] for r in result["rows"]] == ["kvlink-rag linked (cached documents)", "kvlink-rag full prefill"] * 2
    assert result["skipped"] == "llama-server failed: llama-server exited with exit code 132 (SIGILL: built for " \
                                "instructions this CPU lacks?) before serving"
