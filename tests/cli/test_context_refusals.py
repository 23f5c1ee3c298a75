"""Documents that cannot fit the model's context are refused by ask, explain and demo before any is encoded:
one line naming the tokens, a non-zero exit, nothing stored; ``--verbose`` still prints the time spent."""

from __future__ import annotations

import re

import pytest

from cli_helpers import runner
from cli.main import app
from factories import NQ_PATH

LONG = "\n\n".join(f"Paragraph {i}: the harbour at Skerry Point closes at {i % 12 + 1} pm and the ferry to the "
                   f"lighthouse leaves from pier {i % 7}, weather permitting." for i in range(150))
"""~5,400 tokens: more than twice the tiny checkpoint's 2,048-token context, chunked at 512."""


@pytest.fixture
def encoded(monkeypatch) -> list:
    """Every document the engine encodes, recorded (the CLI runs in this process)."""
    from kvlink_rag.engine_documents import EngineDocuments

    calls, encode = [], EngineDocuments.encode
    monkeypatch.setattr(EngineDocuments, "encode", lambda self, doc: calls.append(doc) or encode(self, doc))
    return calls


def _nothing_stored(home: str) -> bool:
    from service.settings import Settings
    from store.factory import open_store

    st = open_store(Settings(home=home, model="unused"))
    return st.blobs.keys() == [] and st.index.tenants() == []


@pytest.mark.parametrize("command", ["ask", "explain"])
def test_a_document_longer_than_the_context_is_refused_before_it_is_encoded(env, tmp_path, encoded, command):
    (tmp_path / "harbour.txt").write_text(LONG)
    result = runner.invoke(app, [command, "When does the harbour close?", "--doc", str(tmp_path / "harbour.txt")],
                           env=env)
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    [line] = result.stderr.splitlines()  # one line, nothing on stdout
    assert result.stdout == ""
    m = re.fullmatch(r"error: the prompt needs (\d+) tokens \(prefix (\d+), 1 document (\d+), link tokens (\d+), "
                     r"question (\d+)\) plus 1 new token\(s\); the model's context holds 2048 tokens \(document "
                     r"'harbour' has (\d+) tokens in (\d+) chunks\); ask over fewer or shorter documents \(one alone "
                     r"can take at most (\d+) tokens.*`kvlink-rag query`.*", line)
    assert m, line
    total, prefix, doc, links, question, named, chunks, alone = map(int, m.groups())
    assert total == prefix + doc + links + question and doc == named > 2048 and links == 5 and chunks > 1  # after the last
    assert alone == 2048 - prefix - 5 - 1 - 9  # less the link tokens, the shortest question and one new token
    assert encoded == [] and _nothing_stored(env["KVLINK_RAG_HOME"])


def test_verbose_prints_the_time_spent_before_the_refusal(env, tmp_path, encoded):
    (tmp_path / "harbour.txt").write_text(LONG)
    result = runner.invoke(app, ["ask", "When?", "--doc", str(tmp_path / "harbour.txt"), "--verbose", "--json"],
                           env=env)
    assert result.exit_code == 2 and result.stdout == "", result.output
    error, timings = result.stderr.splitlines()
    assert error.startswith("error: the prompt needs ") and encoded == []
    assert re.fullmatch(r"time: import [\d.]+ s, store open [\d.]+ s, model load [\d.]+ s, engine setup [\d.]+ s, "
                        r"total [\d.]+ s", timings), timings


def test_demo_refuses_too_many_documents_before_precomputing_any(env, encoded):
    if not NQ_PATH.exists():
        pytest.skip(f"NQ data not found at {NQ_PATH}")
    result = runner.invoke(app, ["demo", "--nq", str(NQ_PATH), "--questions", "2", "--docs", "30"], env=env)
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert re.search(r"error: the prompt needs \d+ tokens \(prefix \d+, 30 documents \d+, link tokens 150, .*"
                     r"context holds 2048 tokens .*; use fewer --docs \(question 1 does not fit\)$", result.stderr)
    assert encoded == [] and _nothing_stored(env["KVLINK_RAG_HOME"])
