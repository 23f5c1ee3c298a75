"""Terminal output: one progress-bar style on stderr, shown only for lasting work, gone after an error;
library prints never reach stdout."""

from __future__ import annotations

import io
import time

import pytest
from rich.console import Console

from kvlink_rag.terminal import progress_bar, results_only_stdout


def _log_console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=False, width=100), buf


def _wait_shown(bar) -> None:
    deadline = time.monotonic() + 10
    while not bar._progress.live.is_started:
        assert time.monotonic() < deadline, "the bar never appeared"
        time.sleep(0.01)


def test_work_that_ends_within_the_delay_prints_no_bar(capsys):
    target, buf = _log_console()
    with progress_bar("quick", 3, target=target) as bar:
        for _ in range(3):
            bar.advance()
    assert buf.getvalue() == ""
    assert capsys.readouterr().out == ""


def test_a_lasting_bar_ends_as_one_line_on_its_console_never_on_stdout(capsys):
    target, buf = _log_console()
    with progress_bar("training", 4, show_after_s=0, target=target, loss=1.5) as bar:
        _wait_shown(bar)
        bar.update(completed=4, loss=0.25)
    text = buf.getvalue()
    assert "training" in text and "4/4" in text and "loss 0.250" in text
    assert capsys.readouterr().out == ""


def test_a_bar_interrupted_by_an_error_is_erased():
    target, buf = _log_console()
    with pytest.raises(RuntimeError), progress_bar("converting", 4, show_after_s=0, target=target) as bar:
        _wait_shown(bar)
        bar.advance()
        raise RuntimeError("disk full")
    assert buf.getvalue() == ""  # the error message, printed by the caller, is the last thing shown


def test_library_prints_go_to_stderr(capsys):
    with results_only_stdout():
        print("Loading checkpoint shards ...")
    captured = capsys.readouterr()
    assert captured.out == "" and "Loading checkpoint shards" in captured.err
