"""The quality commands: ``kvlink-rag eval`` (``--task kv-retrieval`` on the tiny saved checkpoint: rows, summary
JSON, clear errors; ``--doc-cache store`` over the real model), ``eval-report`` and ``train-links``."""

from __future__ import annotations

import json

import pytest

from cli.main import app
from cli_helpers import run_cli, runner
from factories import NQ_PATH, default_model_path
from training.kv_retrieval import make_examples


def _eval_json(tmp_path, env, task: str, n: int, docs: int, positions: str, modes: str) -> tuple[str, dict, list]:
    """``eval --task`` with 2 new tokens and ``--json``: (stdout, summary, rows); asserts exit 0."""
    out = tmp_path / f"{task}.json"
    result = runner.invoke(app, ["eval", "--task", task, "--n", str(n), "--docs", str(docs), "--gold-position",
                                 positions, "--modes", modes, "--max-new-tokens", "2", "--json", str(out)], env=env)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.with_suffix(".rows.jsonl").read_text().splitlines()]
    return result.stdout, json.loads(out.read_text()), rows


def test_eval_kv_retrieval_writes_rows_and_a_summary_with_the_task_and_metric(tmp_path, env):
    stdout, summary, rows = _eval_json(tmp_path, env, "kv-retrieval", 3, 3, "rotate", "full,naive")
    assert "KV retrieval (2 pairs/document, exact match), 3 questions, 3 documents" in stdout
    assert summary["settings"]["task"] == "kv-retrieval" and summary["settings"]["metric"] == "exact_match"
    assert summary["settings"]["pairs_per_doc"] == 2
    assert summary["modes"]["full"]["n"] == 3 and set(summary["by_position"]) == {"first", "middle", "last"}
    assert [(r["index"], r["gold_slot"]) for r in rows if r["mode"] == "full"] == [(0, 0), (1, 1), (2, 2)]
    assert all(r["em"] in (0.0, 1.0) for r in rows)  # a 2-token answer of a random model holds no UUID
    assert make_examples(1, 3)[0].answers[0] not in rows[0]["answer"]


def test_eval_contrast_asks_each_case_in_both_orders(tmp_path, env):
    stdout, summary, rows = _eval_json(tmp_path, env, "contrast", 2, 2, "first,last", "full")
    assert "contrast questions (answer from the answering document, nothing from its contrast), 2 questions" in stdout
    assert summary["settings"]["task"] == "contrast" and summary["settings"]["metric"] == "contrast_match"
    assert sorted((r["index"], r["gold_slot"]) for r in rows) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    report = runner.invoke(app, ["eval-report", str(tmp_path / "contrast.rows.jsonl")], env=env)
    assert report.exit_code == 0 and "contrast, 2 questions, merged from 1 row file(s)" in report.stdout  # was "NQ-open"
    stopped = tmp_path / "stopped.rows.jsonl"  # a run stopped before its end: rows, no summary beside them
    stopped.write_text((tmp_path / "contrast.rows.jsonl").read_text())
    report = runner.invoke(app, ["eval-report", str(stopped)], env=env)
    assert report.exit_code == 0 and "task not recorded, 2 questions" in report.stdout  # was "NQ-open"
    report = runner.invoke(app, ["eval-report", str(tmp_path / "contrast.rows.jsonl"), str(stopped)], env=env)
    assert "contrast, 2 questions, merged from 2 row file(s)" in report.stdout


@pytest.mark.parametrize("args, message", [
    (["--task", "bogus"], "unknown task 'bogus'"),
    (["--task", "kv-retrieval", "--docs", "0"], "documents (0) and pairs per document (2) must be >= 1"),
    (["--task", "kv-retrieval", "--pairs-per-doc", "0"], "pairs per document (0) must be >= 1"),
    (["--chunk-tokens", "10"], "--chunk-tokens is an option of --task long-docs"),  # was silently ignored
    (["--task", "kv-retrieval", "--chunk-tokens", "0,512"], "--chunk-tokens is an option of --task long-docs"),
    (["--modes", "full", "--recompute-ratio", "0.15"], "not to full prefill"),  # was silently dropped
    (["--task", "kv-retrieval", "--retrieve", "3"], "--retrieve K (K >= 1) is an option of --task nq"),
    (["--task", "kv-retrieval", "--min-relative-score", "0.5"], "apply with --retrieve K"),
    (["--task", "contrast", "--docs", "1"], "--task contrast takes --docs 2..49"),
])
def test_eval_task_errors_are_one_line(args, message, env):
    result = runner.invoke(app, ["eval", *args], env=env)
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("mode, message", [("full", "exceeds the model's context"),
                                           ("naive", "20 documents 2")])  # linked: counted before any is encoded
def test_eval_kv_retrieval_past_the_context_is_a_clear_error(env, mode, message, monkeypatch):
    from kvlink_rag.engine_documents import EngineDocuments

    encoded, encode = [], EngineDocuments.encode
    monkeypatch.setattr(EngineDocuments, "encode", lambda self, doc: encoded.append(doc) or encode(self, doc))
    # the tiny checkpoint has 2,048 positions; 20 two-pair documents are ~2,900 tokens
    result = runner.invoke(app, ["eval", "--task", "kv-retrieval", "--n", "1", "--docs", "20", "--modes", mode],
                           env=env)
    assert result.exit_code == 2 and message in result.output, result.output
    assert "fewer --docs" in result.output and "context holds 2048" in result.output or mode == "full"
    assert encoded == []


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


def test_eval_report_merges_row_files_and_rejects_bad_ones(tmp_path):
    rows = [{"index": i, "gold_position": p, "mode": m, "em": em, "nll": 2.0, "ttft_s": 0.5}
            for i, p, m, em in [(0, "first", "full", 1.0), (1, "middle", "full", 0.0), (0, "first", "naive", 0.0)]]
    (tmp_path / "a.rows.jsonl").write_text("\n".join(json.dumps(r) for r in rows[:2]))
    (tmp_path / "b.rows.jsonl").write_text(json.dumps(rows[2]))
    code, output = run_cli(["eval-report", str(tmp_path / "a.rows.jsonl"), str(tmp_path / "b.rows.jsonl"),
                         "--json", str(tmp_path / "m.json")])
    assert code == 0, output
    merged = json.loads((tmp_path / "m.json").read_text())
    assert merged["modes"]["full"]["accuracy"] == 0.5 and merged["modes"]["naive"]["n"] == 1
    assert merged["by_position"]["first"]["full"]["accuracy"] == 1.0 and "middle" in output
    code, output = run_cli(["eval-report", str(tmp_path / "a.rows.jsonl"), str(tmp_path / "b.rows.jsonl"),
                         "--against", "full"])
    assert code == 0 and "naive - 1 x full: -1.000 [-1.000, -1.000]" in output  # only question 0 is paired
    assert "naive - full, answer NLL: +0.000 [+0.000, +0.000] nats/token" in output
    code, output = run_cli(["eval-report", str(tmp_path / "a.rows.jsonl"), "--against", "bogus"])
    assert code == 2 and "--against 'bogus': no rows of that mode" in output
    (tmp_path / "bad.jsonl").write_text("not json\n")
    code, output = run_cli(["eval-report", str(tmp_path / "bad.jsonl")])
    assert code == 2 and "bad.jsonl:1: not JSON" in output
    code, output = run_cli(["eval", "--gold-position", "rotate,sideways"])
    assert code == 2 and "'sideways'" in output


def test_bad_adapter_names_are_clear_errors(tmp_path):
    code, output = run_cli(["train-links", "--name", "../evil"], KVLINK_RAG_HOME=str(tmp_path))
    assert code == 2 and "invalid adapter name '../evil'" in output
    code, output = run_cli(["train-links", "--name", "none"], KVLINK_RAG_HOME=str(tmp_path))
    assert code == 2 and "'none' is reserved" in output


def test_eval_adapter_names_resolve_to_the_users_file_then_the_bundled_one(tmp_path):
    from pathlib import Path

    from cli.quality import _artifact_path
    from kvlink_rag.linking.link_tokens import BUNDLED
    from service.settings import Settings

    settings = Settings(home=tmp_path)
    assert _artifact_path(settings, Path("lookup")) == BUNDLED / "lookup.safetensors"
    assert _artifact_path(settings, Path("mine")) == settings.links_dir / "mine.safetensors"  # a missing name: its path
    settings.links_dir.mkdir(parents=True)
    (settings.links_dir / "lookup.safetensors").write_bytes(b"")
    assert _artifact_path(settings, Path("lookup")) == settings.links_dir / "lookup.safetensors"


def test_eval_start_outside_the_questions_is_a_one_line_error():
    if not NQ_PATH.exists():
        pytest.skip(f"{NQ_PATH} not present")
    code, output = run_cli(["eval", "--nq", str(NQ_PATH), "--n", "5", "--start", "5"])
    assert code == 2 and "--start 5: must be at least 0 and below --n (5)" in output


@pytest.mark.e2e
def test_train_links_with_stored_documents_reuses_them_across_runs(tmp_path):
    if not NQ_PATH.exists():
        pytest.skip(f"{NQ_PATH} not present")
    from service.settings import Settings
    from store.factory import open_store

    env = {"KVLINK_RAG_HOME": str(tmp_path / "home"), "KVLINK_RAG_MODEL": str(default_model_path())}
    tiny = ["train-links", "--nq", str(NQ_PATH), "--steps", "1", "--accumulate", "1", "--docs", "2", "--val-n", "1",
            "--val-every", "0", "--doc-cache", "store"]
    stored = []
    for name in ("a", "b"):  # a second run (another variant: rank 8) reads the first run's encodings
        code, output = run_cli(tiny + ["--out", str(tmp_path / f"{name}.safetensors")]
                            + (["--rank", "8"] if name == "b" else []), **env)
        assert code == 0, output
        assert "the last step, 1: no validation NLL was measured" in output  # --val-every 0: no "best step None"
        st = open_store(Settings(home=tmp_path / "home", model="unused"))
        stored.append({k: e["created"] for k, e in st.blobs.entries().items()})
        st.blobs.close()
    assert len(stored[0]) >= 2 and stored[1] == stored[0]  # the same example's documents, never written again
    more = [a if a != "1" or tiny[i - 1] != "--steps" else "2" for i, a in enumerate(tiny)]
    code, output = run_cli(more + ["--out", str(tmp_path / "a.safetensors")], **env)
    assert code == 0 and "resuming from step 1 of 2" in output, output  # a rerun says it resumes
    code, output = run_cli(tiny[:-1] + ["disk"], **env)
    assert code == 2 and "--doc-cache 'disk': choose memory or store" in output


@pytest.mark.e2e
def test_train_links_preencode_refuses_a_run_the_store_cannot_hold(tmp_path):
    if not NQ_PATH.exists():
        pytest.skip(f"{NQ_PATH} not present")
    env = {"KVLINK_RAG_HOME": str(tmp_path / "home"), "KVLINK_RAG_MODEL": str(default_model_path()),
           "KVLINK_RAG_STORE_MAX_BYTES": str(1 << 20)}  # 1 MiB: two NQ passages hold ~5 MiB of bfloat16 KV
    code, output = run_cli(["train-links", "--nq", str(NQ_PATH), "--steps", "1", "--accumulate", "1", "--docs", "2",
                            "--val-n", "1", "--val-every", "0", "--doc-cache", "store", "--preencode",
                            "--out", str(tmp_path / "a.safetensors")], **env)
    assert code == 2 and "more than 90% of the store's limit of 1 MiB" in output, output
    assert "raise the limit or lower --mix-pool" in output and not (tmp_path / "a.safetensors").exists()


@pytest.mark.parametrize("extra", [["--task", "kv-retrieval"], ["--int8"], ["--retention", "0.5"], []])
def test_eval_doc_cache_store_refuses_what_it_cannot_hold(extra):
    if not NQ_PATH.exists():
        pytest.skip(f"{NQ_PATH} not present")
    flag = ["--doc-cache", "store"] if extra else ["--doc-cache", "disk"]
    code, output = run_cli(["eval", "--nq", str(NQ_PATH), "--n", "2"] + flag + extra)
    assert code == 2
    assert ("not with --task kv-retrieval, --int8 or --retention" if extra else "choose memory or store") in output


@pytest.mark.e2e
def test_eval_with_stored_documents_shares_them_across_runs_and_tags_rows(tmp_path):
    if not NQ_PATH.exists():
        pytest.skip(f"{NQ_PATH} not present")
    from service.settings import Settings
    from store.factory import open_store

    env = {"KVLINK_RAG_HOME": str(tmp_path / "home"), "KVLINK_RAG_MODEL": str(default_model_path()),
           "KVLINK_RAG_MAX_NEW_TOKENS": "4"}
    stored = []
    for tag in ("a", "b"):
        code, output = run_cli(["eval", "--nq", str(NQ_PATH), "--n", "3", "--start", "2", "--docs", "2", "--modes", "naive",
                             "--max-new-tokens", "4", "--doc-cache", "store", "--tag", tag,
                             "--json", str(tmp_path / f"{tag}.json")], **env)
        assert code == 0, output
        st = open_store(Settings(home=tmp_path / "home", model="unused"))
        stored.append({k: e["created"] for k, e in st.blobs.entries().items()})
        st.blobs.close()
    assert len(stored[0]) == 2 and stored[1] == stored[0]  # the second run read the first run's caches
    rows = [json.loads(line) for line in (tmp_path / "b.rows.jsonl").read_text().splitlines()]
    assert [(r["index"], r["mode"]) for r in rows] == [(2, "naive@b")]
    assert json.loads((tmp_path / "b.json").read_text())["modes"].keys() == {"naive@b"}
