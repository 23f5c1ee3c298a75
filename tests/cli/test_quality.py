"""``kvlink-rag eval --task kv-retrieval`` on the tiny saved checkpoint: rows, summary JSON, clear errors."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cli.main import app
from training.kv_retrieval import make_examples

runner = CliRunner()


def test_eval_kv_retrieval_writes_rows_and_a_summary_with_the_task_and_metric(tmp_path, env):
    out = tmp_path / "kv.json"
    result = runner.invoke(app, ["eval", "--task", "kv-retrieval", "--n", "3", "--docs", "3", "--gold-position",
                                 "rotate", "--modes", "full,naive", "--max-new-tokens", "2", "--json", str(out)],
                           env=env)
    assert result.exit_code == 0, result.output
    assert "KV retrieval (2 pairs/document, exact match), 3 questions, 3 documents" in result.stdout
    summary = json.loads(out.read_text())
    assert summary["settings"]["task"] == "kv-retrieval" and summary["settings"]["metric"] == "exact_match"
    assert summary["settings"]["pairs_per_doc"] == 2
    assert summary["modes"]["full"]["n"] == 3 and set(summary["by_position"]) == {"first", "middle", "last"}
    rows = [json.loads(line) for line in out.with_suffix(".rows.jsonl").read_text().splitlines()]
    assert [(r["index"], r["gold_slot"]) for r in rows if r["mode"] == "full"] == [(0, 0), (1, 1), (2, 2)]
    assert all(r["em"] in (0.0, 1.0) for r in rows)  # a 2-token answer of a random model holds no UUID
    assert make_examples(1, 3)[0].answers[0] not in rows[0]["answer"]


@pytest.mark.parametrize("args, message", [
    (["--task", "bogus"], "unknown task 'bogus'"),
    (["--task", "kv-retrieval", "--docs", "0"], "documents (0) and pairs per document (2) must be >= 1"),
    (["--task", "kv-retrieval", "--pairs-per-doc", "0"], "pairs per document (0) must be >= 1"),
    (["--chunk-tokens", "10"], "--chunk-tokens is an option of --task long-docs"),  # was silently ignored
    (["--task", "kv-retrieval", "--chunk-tokens", "0,512"], "--chunk-tokens is an option of --task long-docs"),
    (["--modes", "full", "--recompute-ratio", "0.15"], "not to full prefill"),  # was silently dropped
    (["--task", "kv-retrieval", "--retrieve", "3"], "--retrieve K (K >= 1) is an option of --task nq"),
    (["--task", "kv-retrieval", "--min-relative-score", "0.5"], "apply with --retrieve K"),
])
def test_eval_task_errors_are_one_line(args, message, env):
    result = runner.invoke(app, ["eval", *args], env=env)
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output


def test_eval_kv_retrieval_past_the_context_is_a_clear_error(env):
    # the tiny checkpoint has 2,048 positions; 20 two-pair documents are ~2,900 tokens
    result = runner.invoke(app, ["eval", "--task", "kv-retrieval", "--n", "1", "--docs", "20", "--modes", "full"],
                           env=env)
    assert result.exit_code == 2 and "exceeds the model's context" in result.output, result.output
    assert "fewer --docs" in result.output


def test_kv_retrieval_drops_the_in_memory_document_caches_after_each_question_and_nq_keeps_them():
    from types import SimpleNamespace

    from cli.eval_options import question_step as _step

    steps, shared = [], {"doc": 1}
    engines = {"naive": SimpleNamespace(cache=shared), "linked": SimpleNamespace(cache=shared)}
    bar = SimpleNamespace(advance=lambda: steps.append(1))
    _step(bar, engines, "nq")()
    assert shared == {"doc": 1} and steps == [1]
    _step(bar, engines, "kv-retrieval")()
    assert shared == {} and steps == [1, 1]
