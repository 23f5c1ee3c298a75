"""The mixture recipe script on the CPU with a tiny random model: outputs in the folder (each < 16 MiB), the
checkpoint outside it, and a second run resuming with optimiser state to more steps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from factories import NQ_PATH, real_tokenizer, tiny_config

ROOT = Path(__file__).resolve().parents[2]


def _tiny_model_folder(path: Path) -> Path:
    tok = real_tokenizer()
    torch.manual_seed(0)
    config = tiny_config("llama", head_dim=16, vocab_size=len(tok), max_position_embeddings=8192)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _run(tmp_path: Path, steps: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "KVLINK_RAG_MODEL": str(_tiny_model_folder(tmp_path / "model")) if steps == 2
           else str(tmp_path / "model"), "KVLINK_RAG_HOME": str(tmp_path / "home"),
           "KVLINK_RAG_NQ_PATH": str(NQ_PATH), "KV": f"{sys.executable} -m cli", "PYTHONPATH": str(ROOT),
           "STEPS": str(steps), "ACCUMULATE": "2", "VAL_EVERY": "1", "POOL": "2", "CKPT": str(tmp_path / "ckpt")}
    return subprocess.run(["bash", str(ROOT / "scripts" / "train_mixture_recipe.sh"), "cpu", str(tmp_path / "out")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.e2e  # the real tokenizer, the NQ file and two CLI runs (~1 min of CPU, 5 on a loaded machine)
def test_the_cpu_fallback_writes_the_outputs_and_resumes_with_optimiser_state(tmp_path):
    if not NQ_PATH.exists():
        pytest.skip(f"{NQ_PATH} not present")
    done = _run(tmp_path, 2)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    out = tmp_path / "out"
    names = {p.name for p in out.iterdir()}
    assert {"mixture.safetensors", "mixture.json", "mixture.png", "train.log"} <= names
    assert {f"mixture-best-{t}.safetensors" for t in ("nq", "kv", "long", "retention")} <= names
    assert all(p.stat().st_size < 16 << 20 for p in out.iterdir())
    assert (tmp_path / "ckpt" / "checkpoint.pt").exists() and not any(p.suffix == ".pt" for p in out.rglob("*"))
    first = json.loads((out / "mixture.json").read_text())
    assert first["steps"] == 2 and set(first["val_by_task"]) == {"nq", "kv", "long", "retention"}

    again = _run(tmp_path, 3)  # the same recipe, more steps: resumes the checkpoint (params + optimiser)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    second = json.loads((out / "mixture.json").read_text())
    assert second["steps"] == 3 and [v["step"] for v in second["val_curve"]] == [0, 1, 2, 3]
    ck = torch.load(tmp_path / "ckpt" / "checkpoint.pt", weights_only=False)
    assert ck["state"]["step"] == 3 and ck["optimizer"]["state"]  # Adam moments carried across the runs
