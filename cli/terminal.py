"""Terminal output of every command: stdout carries only the command's result (JSON with ``--json``);
progress, warnings and logs go to stderr, with one progress-bar style (this module's), shown only for
work that lasts; the libraries' own tqdm bars are switched off (:func:`quiet_libraries`).

No torch here: the CLI imports this before parsing its arguments.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator

from rich.console import Console

console = Console(stderr=True, soft_wrap=True)  # progress, warnings, errors
out = Console(soft_wrap=True)  # results only

SHOW_AFTER_S = 1.0  # a bar appears only once its work has lasted this long


class Bar:
    """Handle of one :func:`progress_bar` task."""

    def __init__(self, progress, task) -> None:
        self._progress, self._task = progress, task

    def advance(self, n: float = 1) -> None:
        """Count ``n`` more units done."""
        self._progress.advance(self._task, n)

    def update(self, **fields) -> None:
        """Set ``completed`` and/or the bar's extra fields (e.g. ``loss``)."""
        self._progress.update(self._task, **fields)


@contextlib.contextmanager
def progress_bar(description: str, total: float | None, *, completed: float = 0, show_after_s: float = SHOW_AFTER_S,
                 target: Console | None = None, **fields: float) -> Iterator[Bar]:
    """A progress bar on stderr: description, bar, done/total, extra numeric ``fields`` (``name value``),
    elapsed and remaining time.

    The bar appears only after ``show_after_s`` seconds (work that ends sooner prints nothing); it is
    closed when the block ends, and erased when the block raises, so no stale bar follows an error message.

    Args:
        description: what is being done, e.g. ``"precomputing documents"``.
        total: units of work (None: unknown).
        completed: units already done (a resumed run).
        target: the console to draw on (default: stderr).
        fields: initial values of extra columns, updated with :meth:`Bar.update`.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn()]
    columns += [TextColumn(f"{name} {{task.fields[{name}]:.3f}}") for name in fields]
    # no stdout/stderr redirection by the live display: it would fight results_only_stdout's
    progress = Progress(*columns, TimeElapsedColumn(), TimeRemainingColumn(), console=target or console,
                        redirect_stdout=False, redirect_stderr=False)
    task = progress.add_task(description, total=total, completed=completed, **fields)
    lock, closed = threading.Lock(), []

    def show() -> None:
        with lock:
            if not closed:
                progress.start()

    timer = threading.Timer(show_after_s, show)
    timer.daemon = True
    timer.start()
    failed = True
    try:
        yield Bar(progress, task)
        failed = False
    finally:
        with lock:
            closed.append(True)
            timer.cancel()
        if progress.live.is_started and failed:  # erase it (Progress.stop would end logs with a blank line)
            progress.live.transient = True
            progress.live.stop()
        elif progress.live.is_started:
            progress.stop()


def quiet_libraries() -> None:
    """Switch off the tqdm progress bars of transformers and the Hugging Face hub (a second bar style:
    "Loading weights", "Converting and de-quantizing GGUF tensors", downloads).

    The environment switches are read when those libraries are imported (tqdm's ``TQDM_DISABLE`` covers the
    GGUF loader, which uses tqdm directly), so call this before the model loads; once transformers is
    imported its own switch is turned off as well.
    """
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()


@contextlib.contextmanager
def results_only_stdout() -> Iterator[None]:
    """Send anything printed to ``sys.stdout`` inside the block (library prints) to stderr instead, and
    switch off the libraries' progress bars (:func:`quiet_libraries`)."""
    quiet_libraries()
    with contextlib.redirect_stdout(sys.stderr):
        yield
