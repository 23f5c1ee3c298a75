"""Helpers of the CLI tests: the command run in-process, its exit code and output, or its JSON."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from cli.main import app

runner = CliRunner()


def run_cli(args, **env) -> tuple[int, str]:
    """Exit code and the whole output of ``kvlink-rag args`` with ``env`` set."""
    result = runner.invoke(app, args, env=env or None)
    return result.exit_code, result.output


def run_cli_json(args, **env):
    """Stdout parsed as JSON (it must be nothing else; the command must succeed) and the whole output."""
    result = runner.invoke(app, args, env=env or None)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout), result.output
