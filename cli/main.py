"""The ``kvlink-rag`` command line (typer): the root app and its commands, one sub-app per group.

Commands: ``ask``, ``demo`` (:mod:`cli.core`); ``explain`` (:mod:`cli.explain`); ``eval``, ``eval-report``
(:mod:`cli.quality`); ``train-links`` (:mod:`cli.train`); ``serve``, ``worker``, ``ingest``, ``query`` (:mod:`cli.serving`); ``router`` (:mod:`cli.routing`); ``bench``
(:mod:`cli.benchmark`); the groups ``model`` (fetch), ``store`` (check) and ``index`` (rebuild)
(:mod:`cli.maintenance`); ``verify`` (:mod:`cli.verification`). Output rules and shared helpers: :mod:`cli.common`.
"""

from __future__ import annotations

import typer

from cli import benchmark, core, explain, maintenance, quality, routing, serving, train, verification

app = typer.Typer(add_completion=False, no_args_is_help=True, help="KVLink document-cache RAG.")
for _commands in (core.app, explain.app, quality.app, train.app, serving.app, routing.app, benchmark.app, verification.app):  # merged: top-level commands
    app.add_typer(_commands)
app.add_typer(core.model_app, name="model")
app.add_typer(maintenance.store_app, name="store")
app.add_typer(maintenance.index_app, name="index")


def main() -> None:  # pragma: no cover - the console script
    """Run the CLI on ``sys.argv``."""
    app()
