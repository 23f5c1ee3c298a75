"""Engine settings from the environment: chunk_context takes a count of chunks or an on/off switch."""

import pytest
from pydantic import ValidationError

from kvlink_rag.settings import EngineSettings


@pytest.mark.parametrize("value, chunks", [("true", 1), ("off", 0), ("0", 0), ("2", 2), (" Yes ", 1)])
def test_chunk_context_reads_a_count_or_a_switch(monkeypatch, value, chunks):
    monkeypatch.setenv("KVLINK_RAG_CHUNK_CONTEXT", value)
    assert EngineSettings().chunk_context == chunks


@pytest.mark.parametrize("value", ["-1", "maybe", "65"])
def test_a_bad_chunk_context_is_refused(monkeypatch, value):
    monkeypatch.setenv("KVLINK_RAG_CHUNK_CONTEXT", value)
    with pytest.raises(ValidationError, match="chunk_context"):
        EngineSettings()


def test_a_bad_prefill_attention_is_refused_at_start(monkeypatch):
    """A process refuses a bad KVLINK_RAG_PREFILL_ATTENTION when it reads its settings, never at the first prefill
    in the middle of a request."""
    monkeypatch.setenv("KVLINK_RAG_PREFILL_ATTENTION", "fast")
    with pytest.raises(ValidationError, match="'auto', 'kernel' or 'sdpa'"):
        EngineSettings()
    monkeypatch.setenv("KVLINK_RAG_PREFILL_ATTENTION", "sdpa")
    assert EngineSettings().prefill_attention == "sdpa"
