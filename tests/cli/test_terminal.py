"""Terminal output: one progress-bar style on stderr, shown only for lasting work, gone after an error;
library prints never reach stdout."""

from __future__ import annotations

import io
import time

import pytest
from rich.console import Console

from cli.terminal import progress_bar, results_only_stdout


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


def test_the_libraries_tqdm_bars_are_switched_off_before_the_model_loads():
    """One bar style: transformers' own ("Loading weights") and the GGUF loader's plain tqdm
    ("Converting and de-quantizing GGUF tensors") are off once quiet_libraries ran before their import."""
    import os
    import subprocess
    import sys

    code = ("from cli.terminal import quiet_libraries\nquiet_libraries()\n"
            "from transformers.utils import logging\nfrom transformers.modeling_gguf_pytorch_utils import tqdm\n"
            "print(logging.is_progress_bar_enabled(), tqdm(range(3)).disable)")
    env = {k: v for k, v in os.environ.items() if k not in ("TQDM_DISABLE", "HF_HUB_DISABLE_PROGRESS_BARS")}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"]
