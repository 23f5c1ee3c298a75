"""The root command: a usage error (a value of the wrong type, an unknown option or command, a missing value) is one
``error:`` line on stderr and exit 2, as every other bad input; help still prints and exits as typer's."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from cli.main import app


@pytest.mark.parametrize("args, message", [
    (["ask", "--retention", "abc", "q?"], "error: Invalid value for '--retention'"),  # a new user's: was a boxed usage text
    (["ask", "missing.txt", "-q", "x"], "error: No such option: -q (see 'kvlink-rag ask --help')"),
    (["model", "bogus"], "error: No such command 'bogus'."),
    (["ask", "--doc"], "error: Option '--doc' requires an argument."),
])
def test_a_usage_error_is_one_line_and_exit_2(args, message):
    result = CliRunner().invoke(app, args, prog_name="kvlink-rag")
    assert result.exit_code == 2
    assert result.stdout == "" and result.stderr.startswith(message), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.output


@pytest.mark.parametrize("args, code", [(["--help"], 0), ([], 2), (["model"], 2)])
def test_help_still_prints_with_typers_exit_codes(args, code):
    result = CliRunner().invoke(app, args, prog_name="kvlink-rag")
    assert result.exit_code == code and "Usage: kvlink-rag" in result.stdout
