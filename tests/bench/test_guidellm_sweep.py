"""The guidellm suite: skipped with its reason when guidellm is missing, the command line it runs (output
length forced, tokenizer from the model folder), and the parsing of a guidellm report (a trimmed recording
of a run against this server, ``scripts/trim_guidellm_report.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import bench.guidellm_sweep as sweep
from bench.run import SUITES

FIXTURE = Path(__file__).parent / "fixtures" / "guidellm-report.json"


def test_without_guidellm_the_suite_is_skipped_with_its_reason(monkeypatch):
    monkeypatch.setattr(sweep, "guidellm_executable", lambda: None)
    logged = []
    result = sweep.guidellm_suite(None, log=logged.append)  # returns before any server or model is touched
    assert result == {"skipped": "guidellm is not installed (a bench-only extra: pip install -e '.[bench]')"}
    assert logged == [f"guidellm: skipped ({result['skipped']})"]
    assert sweep.guidellm_section({"guidellm": result}) == [
        "## guidellm sweep (vLLM's benchmark client, /v1/chat/completions)", "",
        "Not run: guidellm is not installed (a bench-only extra: pip install -e '.[bench]')."]
    assert "guidellm" in SUITES


def test_the_command_line_forces_the_output_length_and_names_the_tokenizer(tmp_path):
    argv = sweep.guidellm_argv("guidellm", "http://127.0.0.1:1", "kvlink-rag", "/models/m", [1, 4, 16], 2, 128, 16,
                               tmp_path / "r.json")
    opts = dict(zip(argv[2::2], argv[3::2]))
    assert argv[:2] == ["guidellm", "run"] and argv[-1] == "--disable-console-interactive"
    backend = json.loads(opts["--backend"])
    assert backend["extras"] == {"body": {"min_tokens": 16}} and backend["request_format"] == "/v1/chat/completions"
    assert json.loads(opts["--profile"]) == {"kind": "concurrent", "streams": [1, 4, 16]}
    assert json.loads(opts["--constraint"]) == {"kind": "max_requests", "count": [2, 4, 16]}  # at least one each
    assert json.loads(opts["--data"]) == {"kind": "synthetic_text", "prompt_tokens": 128, "output_tokens": 16}
    assert json.loads(opts["--tokenizer"]) == {"kind": "hf_auto", "model": "/models/m"}
    assert json.loads(opts["--output"]) == {"kind": "json", "path": str(tmp_path / "r.json")}


def test_a_recorded_report_parses_into_one_row_per_level():
    report = json.loads(FIXTURE.read_text())
    rows = sweep.parse_report(report)
    assert [r["streams"] for r in rows] == [1, 4, 16]
    for r, b in zip(rows, report["benchmarks"]):
        m = b["metrics"]
        assert r["requests"] == m["request_totals"]["successful"] and r["errors"] == m["request_totals"]["errored"]
        assert r["ttft_ms_p50"] == m["time_to_first_token_ms"]["successful"]["median"]
        assert r["ttft_ms_p99"] == m["time_to_first_token_ms"]["successful"]["percentiles"]["p99"]
        assert r["itl_ms_p50"] == m["inter_token_latency_ms"]["successful"]["median"]
        assert r["output_tokens_per_s"] == m["output_tokens_per_second"]["successful"]["mean"]
        assert r["output_tokens_mean"] == m["output_token_count"]["successful"]["mean"]
    table = sweep.guidellm_section({"guidellm": {"rows": rows, "prompt_tokens": 128, "output_tokens": 16}})
    assert len([line for line in table if line.startswith("| 1") or line.startswith("| 4 ")]) == 3


@pytest.mark.parametrize("bad", [{}, {"benchmarks": "x"}, []])
def test_anything_but_a_report_is_refused(bad):
    with pytest.raises(ValueError, match="not a guidellm report"):
        sweep.parse_report(bad)
