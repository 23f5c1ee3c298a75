"""The kvlink-rag CLI's core commands (ask, demo, model fetch) and its start-up: clear errors and the
machine-readable answer. eval, eval-report and train-links are in test_quality.py."""

from __future__ import annotations

import json

import pytest

from cli.main import app
from cli_helpers import run_cli, run_cli_json, runner
from factories import NQ_PATH, default_model_path


def test_question_alone_without_documents_is_an_error():
    code, output = run_cli(["ask", "what is it?"])
    assert code == 2 and "at least one --doc" in output


def test_missing_and_empty_document_files(tmp_path):
    code, output = run_cli(["ask", "--doc", str(tmp_path / "nope.txt"), "q?"])
    assert code == 2 and "does not exist" in output
    (tmp_path / "empty.txt").write_text("  \n")
    code, output = run_cli(["ask", "--doc", str(tmp_path / "empty.txt"), "q?"])
    assert code == 2 and "is empty" in output


def test_unknown_dtype_and_bad_mode(tmp_path):
    (tmp_path / "d.txt").write_text("some text")
    code, output = run_cli(["ask", "--doc", str(tmp_path / "d.txt"), "--kv-dtype", "int4", "q?"])
    assert code == 2 and "unknown kv_dtype 'int4'" in output
    code, output = run_cli(["eval", "--modes", "full,bogus"])
    assert code == 2 and "unknown mode" in output
    code, output = run_cli(["ask", "--nq", str(tmp_path / "none.jsonl"), "--json"])
    assert code == 2 and "does not exist" in output


@pytest.mark.e2e
def test_ask_nq_json_has_the_documented_keys(tmp_path):
    if not NQ_PATH.exists():
        pytest.skip(f"{NQ_PATH} not present")
    env = {"KVLINK_RAG_HOME": str(tmp_path), "KVLINK_RAG_MODEL": str(default_model_path()),
           "KVLINK_RAG_MAX_NEW_TOKENS": "12"}
    res, _ = run_cli_json(["ask", "--nq", str(NQ_PATH), "--index", "1", "--docs", "3", "--json"], **env)
    for key in ("answer", "gold_answers", "match", "ttft_full_s", "ttft_linked_s", "cache_hits"):
        assert key in res
    assert res["gold_answers"] and res["match"] in (0.0, 1.0) and res["documents"] == 3
    assert res["ttft_full_s"] > 0 and res["ttft_linked_s"] > 0 and isinstance(res["answer"], str)


@pytest.mark.e2e
def test_ask_over_document_files(tmp_path):
    (tmp_path / "paris.txt").write_text("Paris is the capital and largest city of France.")
    (tmp_path / "rome.txt").write_text("Rome is the capital city of Italy.")
    env = {"KVLINK_RAG_HOME": str(tmp_path), "KVLINK_RAG_MODEL": str(default_model_path())}
    res, _ = run_cli_json(["ask", "--doc", str(tmp_path / "paris.txt"), "--doc", str(tmp_path / "rome.txt"),
                        "--k", "0", "--json", "What is the capital of France?"], **env)
    assert "paris" in res["answer"].lower() and "paris" in res["answer_full"].lower()
    assert res["documents"] == 2 and res["link_k"] == 0 and res["cache_hits"] == 0


@pytest.mark.e2e
def test_second_process_answers_from_caches_on_disk(tmp_path):
    """Cold start: a new process finds the documents' KV in LMDB and recomputes nothing."""
    import os
    import subprocess
    import sys

    for name, text in (("a.txt", "The Orinoco river flows through Venezuela and Colombia."),
                       ("b.txt", "Lake Titicaca lies on the border of Peru and Bolivia.")):
        (tmp_path / name).write_text(text)
    env = {**os.environ, "KVLINK_RAG_HOME": str(tmp_path / "home"), "KVLINK_RAG_MODEL": str(default_model_path()),
           "KVLINK_RAG_MAX_NEW_TOKENS": "8"}
    cmd = [sys.executable, "-m", "cli", "ask", "--doc", str(tmp_path / "a.txt"), "--doc",
           str(tmp_path / "b.txt"), "--json", "Which countries does the Orinoco flow through?"]
    runs = []
    for _ in range(2):
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        runs.append(json.loads(done.stdout))  # stdout is the JSON alone
    assert runs[0]["cache_hits"] == 0 and runs[1]["cache_hits"] == 2
    assert runs[0]["answer"] == runs[1]["answer"]
    assert (tmp_path / "home" / "store" / "data.mdb").exists()
    # ask's caches belong to no document record: store check lists them, never as problems
    check = subprocess.run([sys.executable, "-m", "cli", "store", "check", "--json", "--min-age-s", "0"], env=env,
                           capture_output=True, text=True, timeout=120)
    report = json.loads(check.stdout)
    assert check.returncode == 0 and report["problems"] == 0 and len(report["untracked_caches"]) == 2


@pytest.mark.e2e
def test_ask_with_an_unknown_adapter_lists_the_available_ones(tmp_path):
    (tmp_path / "d.txt").write_text("The lamp at Skerry Point was kept by Ada Quill.")
    env = {"KVLINK_RAG_HOME": str(tmp_path / "home"), "KVLINK_RAG_MODEL": str(default_model_path())}
    code, output = run_cli(["ask", "--doc", str(tmp_path / "d.txt"), "--adapter", "nope", "Who kept the lamp?"], **env)
    assert code == 2 and "unknown adapter 'nope'; available: default, none" in output


HEAVY = ("torch", "transformers", "peft", "fastapi", "celery")


def test_cli_start_up_imports_no_heavy_library():
    """--help and argument errors answer without torch and co.: cli.main and the command modules it
    registers import them inside the commands only."""
    import subprocess
    import sys

    code = f"import cli.main, sys; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("args, message", [
    (["--help"], None), (["ask", "--help"], None),
    (["ask", "--doc", "missing.txt", "q?"], "missing.txt does not exist"),
    (["ask", "--nq", "missing.jsonl"], "does not exist"),
    (["ask", "missing.txt", "-q", "x"], "No such option"),
    (["ask", "--doc", "README.md", "--adapter", "nope", "q?"], "unknown adapter 'nope'; available: default, none"),
    (["query", "--adapter", "nope", "q?"], "unknown adapter 'nope'; available: default, none"),
    (["ingest", "missing.txt"], "missing.txt does not exist"),
    (["eval", "--modes", "full,bogus"], "unknown mode"),
    (["eval", "--task", "contrast", "--docs", "1"], "takes --docs 2..49"),  # was checked after torch loaded
    (["eval", "--task", "kv-retrieval", "--docs", "0"], "must be >= 1"),
    (["eval", "--retention", "2"], "--retention: retention must be in (0, 1]"),  # was checked after the data was read
    (["eval", "--recompute-ratio", "2"], "--recompute-ratio:"),
    (["train-links", "--steps", "0"], "must be >= 1"),
    (["bench", "--requests", "0"], "--requests must be >= 1"),
])
def test_help_and_input_errors_are_answered_before_any_heavy_import(args, message):
    import subprocess
    import sys

    code = ("import sys\nfrom cli.main import app\n"
            f"try:\n    app({args!r})\nexcept SystemExit as e:\n    rc = e.code\n"
            f"sys.stdout.flush()\nprint('HEAVY', sorted(m for m in {HEAVY!r} if m in sys.modules), rc)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip().splitlines()[-1] == f"HEAVY [] {0 if message is None else 2}", done.stderr
    if message is not None:
        assert message in done.stderr and message not in done.stdout


def _fake_gguf_loaders(monkeypatch):
    """transformers' GGUF loaders replaced by a tiny random Llama with the real tokenizer: the conversion
    code (writing config, tokenizer and safetensors, progress) runs for real in a second, not 80 s."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from factories import real_tokenizer, tiny_config

    real_tokenizer()  # the default home's tokenizer, loaded before the test's fresh home is set
    real_model, real_tok = AutoModelForCausalLM.from_pretrained, AutoTokenizer.from_pretrained

    def model(path, *args, gguf_file=None, **kwargs):
        if gguf_file is None:
            return real_model(path, *args, **kwargs)
        torch.manual_seed(0)
        config = tiny_config("llama", head_dim=16, vocab_size=len(real_tokenizer()), num_hidden_layers=2)
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32)

    def tokenizer(path, *args, gguf_file=None, **kwargs):
        return real_tokenizer() if gguf_file is not None else real_tok(path, *args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", model)
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", tokenizer)


@pytest.mark.e2e
def test_ask_json_on_a_fresh_home_prints_only_json_and_conversion_goes_to_stderr(tmp_path, monkeypatch):
    from kvlink_rag.model.convert import GGUF_NAME, MODEL_DIRNAME

    _fake_gguf_loaders(monkeypatch)
    home = tmp_path / "home"
    (home / "models" / "downloads").mkdir(parents=True)
    (home / "models" / "downloads" / GGUF_NAME).write_bytes(b"")  # "downloaded": the loaders are fakes
    (tmp_path / "d.txt").write_text("The lamp at Skerry Point was kept by Ada Quill.")
    env = {"KVLINK_RAG_HOME": str(home), "KVLINK_RAG_MODEL": "smollm2-135m-instruct", "KVLINK_RAG_MAX_NEW_TOKENS": "3"}
    result = runner.invoke(app, ["ask", "--doc", str(tmp_path / "d.txt"), "--no-full", "--json", "Who kept it?"],
                           env=env)
    assert result.exit_code == 0, result.output
    res = json.loads(result.stdout)  # stdout is the JSON and nothing else
    assert res["documents"] == 1 and res["cache_hits"] == 0
    assert {"import_s", "store_open_s", "model_load_s", "engine_setup_s", "documents_s", "answer_s",
            "total_s"} <= set(res["timings"])
    assert f"converting {GGUF_NAME}" in result.stderr and "converting" not in result.stdout
    assert (home / "models" / MODEL_DIRNAME / "model.safetensors").exists()
    fetched = runner.invoke(app, ["model", "fetch"], env=env)  # converted already: the path alone
    assert fetched.exit_code == 0 and fetched.stdout == f"{home / 'models' / MODEL_DIRNAME}\n"
    assert fetched.stderr == ""


@pytest.mark.parametrize("command", ["ask", "demo", "eval", "train-links"])
@pytest.mark.parametrize("flag", ["--nq", "--data"])
def test_the_nq_file_is_taken_as_nq_or_data_by_every_command(tmp_path, command, flag):
    code, output = run_cli([command, flag, str(tmp_path / "none.jsonl")], KVLINK_RAG_HOME=str(tmp_path / "home"))
    assert code == 2 and "none.jsonl does not exist" in output, output


@pytest.mark.e2e
def test_model_fetch_draws_the_conversion_with_the_cli_bar_and_prints_only_the_path(tmp_path, monkeypatch):
    import contextlib

    import cli.common
    from kvlink_rag.model.convert import GGUF_NAME, MODEL_DIRNAME

    _fake_gguf_loaders(monkeypatch)
    bars = []

    @contextlib.contextmanager
    def recording_bar(description, total):
        bars.append([description, total, 0])

        class Step:
            def advance(self, n=1):
                bars[-1][2] += n

        yield Step()

    monkeypatch.setattr(cli.common, "progress_bar", recording_bar)
    home = tmp_path / "home"
    (home / "models" / "downloads").mkdir(parents=True)
    (home / "models" / "downloads" / GGUF_NAME).write_bytes(b"")  # "downloaded": the loaders are fakes
    result = runner.invoke(app, ["model", "fetch"], env={"KVLINK_RAG_HOME": str(home)})
    assert result.exit_code == 0, result.output
    assert result.stdout == f"{home / 'models' / MODEL_DIRNAME}\n"
    assert bars == [[f"converting {GGUF_NAME}", 4, 4]] and f"converting {GGUF_NAME}" in result.stderr


def test_demo_without_questions_is_refused_before_the_model_loads():
    code, output = run_cli(["demo", "--questions", "0"])
    assert code == 2 and "--questions must be >= 1" in output


def test_the_demo_summary_gives_intervals_and_says_five_questions_are_noise(capsys):
    from cli.core import _summary

    _summary({"full": [1.0, 0.0, 1.0, 0.0, 0.0], "linked": [0.0, 0.0, 1.0, 0.0, 0.0]}, [2.0, 3.0, 4.0, 5.0, 6.0])
    text = " ".join(capsys.readouterr().out.split())
    assert "full prefill 0.40 [95% CI 0.00-0.80]" in text and "linked 0.20 [95% CI 0.00-0.60]" in text
    assert "speed-up of linked caches over full prefill 4.0x" in text
    assert "5 questions cannot tell the two modes apart" in text and "EVALUATION.md" in text


@pytest.mark.e2e
def test_ask_json_counts_chunk_hits_and_takes_a_recompute_ratio(tmp_path):
    paragraphs = [f"Paragraph {i} of the field guide says the heron number {i} nests by lake {i} in spring, "
                  f"where reeds grow tall and the water stays shallow until late summer." for i in range(12)]
    (tmp_path / "guide.txt").write_text("\n\n".join(paragraphs))
    (tmp_path / "short.txt").write_text("Herons eat fish and frogs.")
    env = {"KVLINK_RAG_HOME": str(tmp_path / "home"), "KVLINK_RAG_MODEL": str(default_model_path()),
           "KVLINK_RAG_MAX_NEW_TOKENS": "4", "KVLINK_RAG_CHUNK_TOKENS": "128"}
    args = ["ask", "--doc", str(tmp_path / "guide.txt"), "--doc", str(tmp_path / "short.txt"), "--no-full", "--json",
            "Where does heron number 3 nest?"]
    first, _ = run_cli_json(args, **env)
    assert first["documents"] == 2 and first["chunks"] > 3 and first["chunk_cache_hits"] == 0
    assert first["cache_hits"] == 0 and first["recompute_ratio"] == 0
    again, _ = run_cli_json(args + ["--recompute-ratio", "0.3"], **env)
    assert again["cache_hits"] == 2 and again["chunk_cache_hits"] == again["chunks"] == first["chunks"]
    assert again["recompute_ratio"] == 0.3 and again["context_tokens"] == first["context_tokens"]
    code, output = run_cli(args + ["--recompute-ratio", "0.3", "--explain"], **env)
    assert code == 2 and "do not combine" in output
