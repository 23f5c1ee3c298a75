"""The CLI's retention and explain: one-line errors before the model loads, ``explain --png``, ``query
--explain`` on the store (tiny model with the real tokenizer)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from factories import NQ_PATH

FIXTURE = Path(__file__).resolve().parents[1] / "api" / "fixtures" / "documents.jsonl"
runner = CliRunner()


RETENTION_ERROR = "error: --retention: retention must be in (0, 1]"
RATIO_ERROR = "error: --recompute-ratio: recompute_ratio must be within [0, 1]"


@pytest.mark.parametrize("args, message", [
    (["ask", "--doc", "README.md", "--retention", "0", "q?"], RETENTION_ERROR),
    (["explain", "--doc", "README.md", "--retention", "1.5", "q?"], RETENTION_ERROR),
    (["query", "q?", "--retention", "-1"], RETENTION_ERROR),
    (["eval", "--retention", "0.5,2"], RETENTION_ERROR),
    (["query", "q?", "--recompute-ratio", "1.5"], RATIO_ERROR),
    (["ask", "--doc", "README.md", "--recompute-ratio", "2", "q?"], RATIO_ERROR),
    (["eval", "--recompute-ratio", "0.15,-1"], RATIO_ERROR),
])
def test_retention_or_recompute_ratio_outside_range_is_a_one_line_error(args, message, env):
    result = runner.invoke(app, args, env=env)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(message)
    assert result.stderr.count("\n") == 1 and result.stdout == ""


def test_explain_prints_shares_and_writes_a_heatmap(tmp_path, env):
    a, b = tmp_path / "lighthouse.txt", tmp_path / "paris.txt"
    a.write_text("The lighthouse on Skerry Point was built in 1851. Agnes Moray kept the lamp burning.")
    b.write_text("Paris is the capital of France. The Seine flows through the city.")
    png = tmp_path / "heat.png"
    result = runner.invoke(app, ["explain", "--doc", str(a), "--doc", str(b), "--png", str(png), "--json",
                                 "--retention", "0.5", "--attribution", "attention", "Who kept the lamp burning?"],
                           env=env)
    assert result.exit_code == 0, result.output
    res = json.loads(result.stdout)
    att = res["attribution"]
    assert len(att["documents"]) == 2 and att["method"] == "attention"
    assert abs(att["prefix"] + sum(d["share"] for d in att["documents"]) - 1) < 1e-4
    for d, text in zip(att["documents"], (a.read_text(), b.read_text())):
        assert all(0 <= p["start"] < p["end"] <= len(text) for p in d["passages"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_explain_by_leave_one_out_is_the_default_and_its_shares_sum_to_one_or_zero(tmp_path, env):
    a, b = tmp_path / "lighthouse.txt", tmp_path / "paris.txt"
    a.write_text("The lighthouse on Skerry Point was built in 1851. Agnes Moray kept the lamp burning.")
    b.write_text("Paris is the capital of France. The Seine flows through the city.")
    png = tmp_path / "heat.png"
    result = runner.invoke(app, ["explain", "--doc", str(a), "--doc", str(b), "--png", str(png), "--json",
                                 "Who kept the lamp burning?"], env=env)
    assert result.exit_code == 0, result.output
    att = json.loads(result.stdout)["attribution"]
    shares = [d["share"] for d in att["documents"]]
    assert att["method"] == "leave_one_out" and all(0 <= s <= 1 for s in shares)
    assert abs(sum(shares) - 1) < 1e-4 or sum(shares) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_unknown_attribution_method_is_a_one_line_error(env):
    result = runner.invoke(app, ["explain", "--doc", "README.md", "--attribution", "saliency", "q?"], env=env)
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.startswith("error: --attribution 'saliency': must be one of leave_one_out, attention")


def test_attribution_eval_report_prints_both_methods(tmp_path, env):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("\n".join(json.dumps(r) for r in [
        {"index": 0, "gold_slot": 1, "em": 1.0, "attention": [0.2, 0.1], "loo": [0.1, 2.0],
         "plain_s": 1.0, "explain_s": 1.5, "loo_s": 3.0},
        {"index": 1, "gold_slot": 0, "em": 0.0, "attention": [0.3, 0.1], "loo": [-0.1, 0.5],
         "plain_s": None, "explain_s": 1.1, "loo_s": 2.0}]) + "\n")  # plain answers timed on some rows only
    result = runner.invoke(app, ["attribution-eval", "--nq", "unused", "--rows", "unused", "--report", str(rows)],
                           env=env)
    assert result.exit_code == 0, result.output
    att, loo = [line for line in result.stdout.splitlines() if line.startswith(("| attention", "| leave"))]
    assert att.startswith("| attention share") and "| 0.500 [" in att and "| 0.50 | 2 (1) |" in att
    assert loo.startswith("| leave-one-document-out | 0.500 [") and "(n=1) | 2.50 | 2 (2) |" in loo


def test_query_explain_on_the_store(tmp_path, env):
    docs = shutil.copy(FIXTURE, tmp_path / "documents.jsonl")
    assert runner.invoke(app, ["ingest", str(docs)], env=env).exit_code == 0
    result = runner.invoke(app, ["query", "Who kept the lighthouse lamp?", "--doc-id", "lighthouse", "--doc-id",
                                 "paris", "--explain", "--retention", "0.6", "--json"], env=env)
    assert result.exit_code == 0, result.output
    res = json.loads(result.stdout)
    shares = [d["attribution"] for d in res["documents"]]
    assert res["attribution_method"] == "leave_one_out"  # the default: shares of the log-likelihood lost
    assert abs(sum(shares) - 1) < 1e-4 or sum(shares) == 0
    assert all(isinstance(d["log_likelihood_drop"], float) for d in res["documents"])




@pytest.mark.parametrize("args, message", [
    (["ask", "--doc", "README.md", "--k", "-3", "q?"], "error: invalid setting: --k: Input should be greater than"),
    (["ask", "--doc", "README.md", "--kv-dtype", "int3", "q?"], "error: invalid setting: --kv-dtype:"),
])
def test_a_bad_setting_from_the_command_line_is_named_by_its_flag(args, message, env):
    result = runner.invoke(app, args, env=env)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(message)
    assert result.stderr.count("\n") == 1 and result.stdout == ""


@pytest.mark.parametrize("values, message", [
    ({"KVLINK_RAG_CHUNK_CONTEXT": "maybe"},
     "error: invalid setting: KVLINK_RAG_CHUNK_CONTEXT: expected a number of chunks"),  # was "... Value error, ..."
    ({"KVLINK_RAG_CHUNK_CONTEXT": "-1"},
     "error: invalid setting: KVLINK_RAG_CHUNK_CONTEXT: Input should be greater than or equal to 0"),
    ({"KVLINK_RAG_CHUNK_LINKS": "LAST"},
     "error: invalid setting: KVLINK_RAG_CHUNK_LINKS: Input should be 'each' or 'last'"),
    ({"KVLINK_RAG_CHUNK_CONTEXT": "0", "KVLINK_RAG_CHUNK_LINKS": "last"},  # a rule across settings: no field named
     "error: invalid setting: KVLINK_RAG_CHUNK_LINKS=last applies to chunks encoded in context"),
])
def test_a_bad_setting_from_the_environment_is_named_by_its_variable(values, message, env):
    result = runner.invoke(app, ["ask", "--doc", "README.md", "q?"], env={**env, **values})
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(message)  # was "chunk_context: Input should be a valid integer"
    assert result.stderr.count("\n") == 1 and result.stdout == ""


@pytest.mark.skipif(not NQ_PATH.exists(), reason=f"needs the NQ data at {NQ_PATH} (KVLINK_RAG_NQ_PATH)")
def test_no_documents_per_question_is_a_one_line_error(env):
    result = runner.invoke(app, ["demo", "--nq", str(NQ_PATH), "--docs", "0"], env=env)
    assert result.exit_code == 2, result.output
    assert "documents per question must be >= 1, got 0" in result.stderr and result.stdout == ""
