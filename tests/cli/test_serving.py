"""The service commands: ingest and query (directly on the store and against a server), worker and errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from service.settings import Settings
from service_support import LiveServer, free_port

FIXTURE = Path(__file__).resolve().parents[1] / "api" / "fixtures" / "documents.jsonl"
runner = CliRunner()


def _run(args, env):
    result = runner.invoke(app, args, env=env)
    return result.exit_code, result.output


def test_ingest_files_and_jsonl_into_the_store_then_query(tmp_path, env):
    docs = shutil.copy(FIXTURE, tmp_path / "documents.jsonl")
    note = tmp_path / "note.txt"
    note.write_text("The harbour master's office opens at seven in the morning.")
    code, output = _run(["ingest", str(docs), str(note)], env)
    assert code == 0, output
    assert "5 documents: 5 new or changed, 0 unchanged" in output
    assert "lighthouse\nparis\nphotosynthesis\nvolcano\nnote.txt\n" in output  # the ids it assigned
    from store.factory import open_store

    store = open_store(Settings(home=tmp_path / "home"))
    recs = {r.doc_id: r for r in store.index.list("default")}
    assert set(recs) == {"lighthouse", "paris", "photosynthesis", "volcano", "note.txt"}
    assert all(r.status == "ready" and r.cache_key in store.blobs for r in recs.values())  # precomputed now
    assert recs["note.txt"].title == "note" and recs["lighthouse"].metadata == {"source": "fixture"}

    code, output = _run(["ingest", str(docs)], env)
    assert code == 0 and "4 documents: 0 new or changed, 4 unchanged" in output

    result = runner.invoke(app, ["query", "When does the harbour master open?", "--top-k", "1", "--json"], env=env)
    assert result.exit_code == 0, result.output
    res = json.loads(result.stdout)  # stdout is the JSON alone
    assert [d["id"] for d in res["documents"]] == ["note.txt"] and res["documents"][0]["cache_hit"] is True
    code, output = _run(["query", "Which volcano?", "--doc-id", "volcano"], env)
    assert code == 0 and "cache hit" in output and "ttft" in output


def test_ingest_and_query_against_a_running_server(tmp_path, env, tiny_checkpoint):
    from api.main import create_app

    settings = Settings(home=tmp_path / "server", model=str(tiny_checkpoint), device="cpu", max_new_tokens=3,
                        api_keys={"k1": "t1"})
    with LiveServer(create_app(settings)) as srv:
        docs = shutil.copy(FIXTURE, tmp_path / "documents.jsonl")
        code, output = _run(["ingest", str(docs), "--url", srv.url, "--api-key", "k1", "--batch-size", "3"], env)
        assert code == 0 and "4 documents: 4 new or changed" in output, output
        code, output = _run(["query", "Mount Erebus lava lake", "--top-k", "1", "--url", srv.url, "--json"],
                            {**env, "KVLINK_RAG_API_KEY": "k1"})
        assert code == 0, output
        assert json.loads(output[output.index("{"):])["documents"][0]["id"] == "volcano"
        code, output = _run(["query", "anything", "--top-k", "1", "--url", srv.url, "--api-key", "bad"], env)
        assert code == 2 and "server answered 401: unknown API key" in output


def test_clear_errors_and_non_zero_exit(tmp_path, env):
    code, output = _run(["ingest", str(tmp_path / "missing.txt")], env)
    assert code == 2 and "does not exist" in output
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{not json\n')
    code, output = _run(["ingest", str(bad)], env)
    assert code == 2 and "bad.jsonl:2: not JSON" in output
    bad.write_text('{"title": "no text"}\n')
    code, output = _run(["ingest", str(bad)], env)
    assert code == 2 and "needs a non-empty string 'text'" in output
    code, output = _run(["query", "q?", "--top-k", "1", "--doc-id", "a"], env)
    assert code == 2 and "either --top-k or --doc-id" in output
    code, output = _run(["query", "q?", "--top-k", "1", "--url", f"http://127.0.0.1:{free_port()}"], env)
    assert code == 2 and "cannot reach" in output
    code, output = _run(["query", "q?", "--doc-id", "nope"], env)
    assert code == 2 and "unknown document id(s): nope" in output
    code, output = _run(["worker"], env)
    assert code == 2 and "KVLINK_RAG_BROKER_URL" in output
    code, output = _run(["serve", "--port", "0"], env)
    assert code == 2 and "invalid setting: --port:" in output  # the flag, not the environment variable


def test_ingest_prints_the_ids_it_assigned(tmp_path, env):
    note = tmp_path / "note.txt"
    note.write_text("The harbour master's office opens at seven in the morning.")
    lines = tmp_path / "more.jsonl"
    lines.write_text(json.dumps({"text": "Ferries leave at noon."}) + "\n" + json.dumps({"id": "tide", "text": "High tide is at six."}) + "\n")
    result = runner.invoke(app, ["ingest", str(note), str(lines), "--no-precompute"], env=env)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[:3] == ["note.txt", "more-1", "tide"]  # file name, <stem>-<line>, "id"
    result = runner.invoke(app, ["ingest", str(note), "--no-precompute", "--json"], env=env)
    assert result.exit_code == 0, result.output
    assert [d["id"] for d in json.loads(result.stdout)["documents"]] == ["note.txt"]


@pytest.fixture
def no_model(monkeypatch) -> list:
    """Records every engine load (the model would load there): a test asserts the list stays empty."""
    import service.runtime

    loads: list = []
    monkeypatch.setattr(service.runtime, "load_engine", lambda *a, **k: loads.append(a) or pytest.fail("model loaded"))
    return loads


@pytest.mark.parametrize("args, message", [
    (["q?", "--top-k", "0"], "top_k must be within 1..20 (KVLINK_RAG_MAX_TOP_K), got 0"),
    (["q?", "--doc-id", "nosuch"], "unknown document id(s): nosuch"),
    (["Which volcano?", "--tenant", "empty"], "this tenant has no documents yet"),
    (["zzz qqq?"], "no document of this tenant shares a word with the question"),
    (["   "], "question is empty"),
    (["q?", "--max-new-tokens", "0"], "max_new_tokens must be within 1.."),
])
def test_query_errors_come_before_the_model_loads(tmp_path, env, no_model, args, message):
    docs = shutil.copy(FIXTURE, tmp_path / "documents.jsonl")
    assert runner.invoke(app, ["ingest", str(docs), "--no-precompute"], env=env).exit_code == 0
    code, output = _run(["query", *args], env)
    assert code == 2 and message in output, output
    assert no_model == []


def test_serve_on_a_port_in_use_fails_at_once_with_one_line(env, no_model):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = runner.invoke(app, ["serve", "--port", str(port)], env=env)
    assert result.exit_code == 2
    assert result.stderr == f"error: port {port} on 127.0.0.1 is in use; choose --port\n" and result.stdout == ""
    assert no_model == []


def test_ingest_prints_ids_on_stdout_and_its_summary_on_stderr(tmp_path, env):
    note = tmp_path / "note.txt"
    note.write_text("The harbour master's office opens at seven in the morning.")
    result = runner.invoke(app, ["ingest", str(note), "--no-precompute"], env=env)
    assert result.exit_code == 0, result.output
    assert result.stdout == "note.txt\n"
    assert "1 document: 1 new or changed, 0 unchanged, 0 with near-duplicates" in result.stderr


def test_ingest_leaves_a_document_the_busy_store_refused_queued_and_goes_on(tmp_path, env, monkeypatch):
    from service.documents import DocumentService
    from store.lmdb_env import StoreBusyError

    real, done = DocumentService.precompute_or_fail, []

    def busy_for_tide(self, tenant, doc_id, version):
        if doc_id == "tide":
            raise StoreBusyError("no room for k: pid 7 reads a snapshot older than the space freed")
        outcome = real(self, tenant, doc_id, version)
        done.append((doc_id, outcome.status))
        return outcome

    monkeypatch.setattr(DocumentService, "precompute_or_fail", busy_for_tide)
    lines = tmp_path / "docs.jsonl"
    lines.write_text("\n".join(json.dumps({"id": i, "text": t}) for i, t in
                               (("tide", "High tide is at six."), ("ferry", "Ferries leave at noon."))) + "\n")
    result = runner.invoke(app, ["ingest", str(lines)], env=env)
    assert result.exit_code == 0, result.output
    assert "tide: left queued, no room for k: pid 7" in result.output
    assert done == [("ferry", "ready")]  # the batch went on past the busy one
