"""``train-links``' issue-28 options: a bad mixture, span or switch is a one-line error before the model loads."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from cli.main import app

runner = CliRunner()


@pytest.mark.parametrize("args, message", [
    (["--mixture", "nq=1,squad=1"], "unknown task 'squad'"),
    (["--mixture", "nq"], "task=weight pairs"),
    (["--mixture", "nq=0"], "at least one above 0"),
    (["--mixture", "nq=1", "--mix-nq-docs", "9-3"], "--mix-nq-docs '9-3': expected MIN-MAX"),
    (["--mixture", "nq=1", "--mix-retentions", "0.4,x"], "--mix-retentions '0.4,x'"),
    (["--mixture", "nq=1", "--mix-retentions", "1.5"], "each in (0, 1]"),
    (["--mixture", "kv=1", "--mix-pool", "-1"], "--mix-pool >= 0"),
    (["--mixture", "nq=1", "--doc-side"], "do not combine"),
    (["--link-init", "zeros"], "--link-init 'zeros': choose separator or document"),
    (["--bf16", "--doc-side"], "--bf16 and --doc-side do not combine"),
    (["--mix-kv-answer", "sentence"], "--mix-kv-answer set without --mixture"),  # they once did nothing silently
    (["--mix-pool", "64", "--mix-kv-docs", "5"], "--mix-kv-docs, --mix-pool set without --mixture"),
])
def test_bad_issue_28_options_are_one_line_errors(args, message, tmp_path):
    result = runner.invoke(app, ["train-links", "--nq", str(tmp_path / "missing.jsonl")] + args)
    assert result.exit_code == 2 and message in result.output, result.output


def test_the_mixture_options_parse_into_a_mixture():
    from cli.train_options import parse_mixture

    mix = parse_mixture("nq=1,kv=0.5,retention=0.25", "4-8", 12, 64, "3-9", "0.5,0.7", 10)
    assert mix.weights == (("nq", 1.0), ("kv", 0.5), ("retention", 0.25)) and mix.tasks == ["nq", "kv", "retention"]
    assert (mix.nq_docs, mix.kv_docs, mix.pool, mix.long_passages, mix.retentions, mix.docs) == \
        ((4, 8), 12, 64, (3, 9), (0.5, 0.7), 10)
    assert parse_mixture(None, "5-20", 10, 0, "5-15", "0.4,0.6,0.8", 10) is None
