"""The ``kvlink-rag`` command line (typer): the root app and its commands, one sub-app per group.

Commands: ``ask``, ``demo`` (:mod:`cli.core`); ``explain`` (:mod:`cli.explain`); ``eval``, ``eval-report``
(:mod:`cli.quality`); ``train-links`` (:mod:`cli.train`); ``serve``, ``worker``, ``ingest``, ``query`` (:mod:`cli.serving`); ``router`` (:mod:`cli.routing`); ``bench``
(:mod:`cli.benchmark`); the groups ``model`` (fetch), ``store`` (check) and ``index`` (rebuild)
(:mod:`cli.maintenance`); ``verify`` (:mod:`cli.verification`). Output rules and shared helpers: :mod:`cli.common`.
"""

from __future__ import annotations

import sys

import typer
from rich.markup import escape
from typer._click.exceptions import ClickException, NoArgsIsHelpError  # typer vendors click: its own exceptions
from typer.core import TyperGroup

from cli import benchmark, core, explain, maintenance, quality, routing, serving, train, verification
from cli.common import console


class OneLineErrors(TyperGroup):
    """The root command: a usage error (an unknown option, a value of the wrong type, a missing argument) prints one
    ``error:`` line on stderr and exits 2, as every other bad input does (:func:`cli.common.fail`), instead of
    click's usage text in a box. Help (``--help``, no arguments) and the exit codes stay typer's."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except NoArgsIsHelpError as e:  # typer printed the help already
            sys.exit(e.exit_code)
        except ClickException as e:
            ctx = getattr(e, "ctx", None)
            hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
            console.print(f"[red]error:[/red] {escape(e.format_message())}{escape(hint)}", soft_wrap=True)
            sys.exit(e.exit_code)
        except typer.Abort:
            console.print("Aborted!")
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)  # an Exit's code (a command's return value is None)


app = typer.Typer(cls=OneLineErrors, add_completion=False, no_args_is_help=True, help="KVLink document-cache RAG.")
for _commands in (core.app, explain.app, quality.app, train.app, serving.app, routing.app, benchmark.app, verification.app):  # merged: top-level commands
    app.add_typer(_commands)
app.add_typer(core.model_app, name="model")
app.add_typer(maintenance.store_app, name="store")
app.add_typer(maintenance.index_app, name="index")


def main() -> None:  # pragma: no cover - the console script
    """Run the CLI on ``sys.argv``."""
    app()
