"""``kvlink-rag store check [--repair]`` and ``kvlink-rag index rebuild`` on the store under KVLINK_RAG_HOME."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from cli.main import app
from service.settings import Settings

FIXTURE = Path(__file__).resolve().parents[1] / "api" / "fixtures" / "documents.jsonl"
ORPHAN = "e" * 16 + "-" + "0" * 16 + "-" + "2" * 64
runner = CliRunner()


def _run(args, env):
    return runner.invoke(app, args, env=env)


def _store(tmp_path):
    from store.factory import open_store

    return open_store(Settings(home=tmp_path / "home"))


def _kv():
    import torch

    from kvlink_rag.types import DocumentKV

    return DocumentKV(keys=torch.zeros(2, 2, 4, 16), values=torch.ones(2, 2, 4, 16),
                      token_ids=torch.arange(4), fingerprint="fp", encoding="anchored")


def test_store_check_lists_then_repairs_and_index_rebuild_restores(tmp_path, env):
    docs = shutil.copy(FIXTURE, tmp_path / "documents.jsonl")
    assert _run(["ingest", str(docs)], env).exit_code == 0
    clean = _run(["store", "check", "--min-age-s", "0"], env)
    assert clean.exit_code == 0 and clean.stdout == "" and "consistent" in clean.stderr

    store = _store(tmp_path)
    store.blobs.put(ORPHAN, _kv())
    nbytes = store.blobs.meta(ORPHAN)["nbytes"]
    store.index.delete("default", "paris")
    found = _run(["store", "check", "--min-age-s", "0"], env)
    assert found.exit_code == 1 and "--repair" in found.stderr
    lines = found.stdout.splitlines()
    [paris_key] = [x.split("\t")[1] for x in lines if x.startswith("unreferenced_cache") and ORPHAN not in x]
    assert sorted(lines) == sorted([f"unreferenced_cache\t{ORPHAN}\t{nbytes}",
                                    f"unreferenced_cache\t{paris_key}\t{store.blobs.meta(paris_key)['nbytes']}",
                                    "text_without_record\tdefault\tparis"])
    as_json = json.loads(_run(["store", "check", "--min-age-s", "0", "--json"], env).stdout)
    assert as_json["problems"] == 3 and as_json["texts_without_records"] == [["default", "paris"]]

    assert _run(["store", "check"], env).exit_code == 1  # the text without record is no age question
    fixed = _run(["store", "check", "--repair", "--min-age-s", "0"], env)
    assert fixed.exit_code == 0 and "repaired" in fixed.stderr
    assert ORPHAN not in store.blobs and store.index.get("default", "paris").cache_key == paris_key
    assert _run(["store", "check", "--min-age-s", "0"], env).exit_code == 0

    store.index.delete("default", "volcano")  # the index lost a record: rebuild it from the text
    rebuilt = _run(["index", "rebuild"], env)
    assert rebuilt.exit_code == 0 and rebuilt.stdout == "ready\tdefault\tvolcano\n"
    assert "restored 1 record(s) (1 ready, 0 queued); 3 already indexed" in rebuilt.stderr
    vol = store.index.get("default", "volcano")
    assert vol.status == "ready" and vol.cache_key in store.blobs


def test_store_check_lists_and_repairs_text_that_is_not_valid_unicode(tmp_path, env):
    docs = shutil.copy(FIXTURE, tmp_path / "documents.jsonl")
    assert _run(["ingest", str(docs)], env).exit_code == 0
    store = _store(tmp_path)  # the record, stored before the API refused it
    store.index.set_status("default", "paris", "ready", metadata={"k": "\ud800"})
    found = _run(["store", "check", "--min-age-s", "0"], env)
    assert found.exit_code == 1 and found.stdout == "unencodable_text\tdefault\tparis\n"
    assert "1 document(s) with text that is not valid Unicode" in found.stderr
    fixed = _run(["store", "check", "--repair", "--min-age-s", "0"], env)
    assert fixed.exit_code == 0 and "repaired" in fixed.stderr
    assert store.index.get("default", "paris").metadata == {"k": "\ufffd"}
    assert _run(["store", "check", "--min-age-s", "0"], env).exit_code == 0
