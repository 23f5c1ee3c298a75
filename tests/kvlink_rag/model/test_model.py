"""Model shapes the linker does not reproduce exactly are refused at load with a clear message."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config
from typer.testing import CliRunner

from factories import tiny_config, tiny_model
from cli.main import app
from kvlink_rag.model.loader import wrap_model
from kvlink_rag.model.support import ModelLoadError, check_supported

SMALL = dict(vocab_size=256, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=96)


def _rope(rope_type: str, **extra) -> dict:
    return {"rope_parameters": {"rope_type": rope_type, "rope_theta": 10000.0, **extra}}


REFUSED = [
    ("mistral-window", lambda: tiny_config("mistral", sliding_window=8, max_position_embeddings=96),
     "sliding_window=8"),
    ("qwen2-window", lambda: Qwen2Config(use_sliding_window=True, sliding_window=8, max_window_layers=0, **SMALL),
     "sliding_window=8"),
    ("qwen3-window", lambda: Qwen3Config(use_sliding_window=True, sliding_window=8, max_window_layers=1, **SMALL),
     "sliding_window=8"),
    ("layer-types", lambda: LlamaConfig(layer_types=["full_attention", "chunked_attention"], **SMALL), "layer_types"),
    ("dynamic-rope", lambda: LlamaConfig(**_rope("dynamic", factor=2.0), **SMALL), "rope_type='dynamic'"),
    ("legacy-rope-scaling", lambda: LlamaConfig(rope_scaling={"type": "dynamic", "factor": 2.0}, **SMALL),
     "rope_type='dynamic'"),
    ("longrope", lambda: LlamaConfig(**_rope("longrope", short_factor=[1.0] * 8, long_factor=[1.0] * 8), **SMALL),
     "rope_type='longrope'"),
    ("partial-rotary", lambda: LlamaConfig(**_rope("default", partial_rotary_factor=0.5), **SMALL),
     "partial_rotary_factor=0.5"),
    ("softcapping", lambda: LlamaConfig(attn_logit_softcapping=30.0, **SMALL), "attn_logit_softcapping=30.0"),
    ("alibi", lambda: LlamaConfig(alibi=True, **SMALL), "alibi=True"),
    ("flash-kernel", lambda: LlamaConfig(attn_implementation="flash_attention_2", **SMALL),
     "attn_implementation='flash_attention_2'"),
    ("model-type", lambda: type("C", (), {"model_type": "gpt2", "max_position_embeddings": 96})(), "model_type='gpt2'"),
]


@pytest.mark.parametrize("name,make,field", REFUSED, ids=[r[0] for r in REFUSED])
def test_unsupported_shapes_are_refused_naming_the_field(name, make, field):
    with pytest.raises(ModelLoadError, match="unsupported model: ") as e:
        check_supported(make())
    assert field in str(e.value)


def test_tiny_mistral_with_a_sliding_window_is_refused_when_wrapped_not_run_wrong():
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config("mistral", sliding_window=8, max_position_embeddings=96))
    with pytest.raises(ModelLoadError, match="sliding_window=8 .*supported"):
        wrap_model(model, tokenizer=None, fingerprint="x")


@pytest.mark.parametrize("family", ["llama", "llama3", "llama-yarn", "llama-linear", "qwen2", "qwen3", "mistral"])
def test_supported_families_still_load(family):
    assert tiny_model(family, head_dim=16).num_layers == 2


def test_harmless_windows_are_accepted():
    check_supported(tiny_config("mistral", sliding_window=2048, max_position_embeddings=2048))  # never triggers
    check_supported(Qwen2Config(use_sliding_window=True, sliding_window=8, max_window_layers=2, **SMALL))  # no layer


def test_cli_with_a_sliding_window_model_folder_exits_with_one_line(tmp_path):
    torch.manual_seed(0)
    folder = tmp_path / "mistral-sw8"
    AutoModelForCausalLM.from_config(tiny_config("mistral", sliding_window=8, max_position_embeddings=96)) \
        .save_pretrained(folder)
    (tmp_path / "d.txt").write_text("some text")
    result = CliRunner().invoke(app, ["ask", "--doc", str(tmp_path / "d.txt"), "what?"],
                                env={"KVLINK_RAG_HOME": str(tmp_path / "home"), "KVLINK_RAG_MODEL": str(folder)})
    assert result.exit_code == 2, result.output
    assert "unsupported model: sliding_window=8" in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


ICE_LAKE = {"avx2", "f16c", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_vbmi2", "avx512_bitalg"}


@pytest.mark.parametrize("extra, native", [((), False), (("avx512_bf16",), True), (("amx_bf16", "amx_tile"), True)])
def test_native_bfloat16_is_read_from_the_cpu_flags_not_onednns_avx512_check(monkeypatch, extra, native):
    """An Ice Lake Xeon (AVX512 and VNNI, no AVX512-BF16) took q4q8-bf16 because oneDNN's check says True on any
    AVX512 core, where its bfloat16 GEMMs are emulated (3.3-3.7x slower than float32 there): its flags now say no."""
    from kvlink_rag.model import loader
    from kvlink_rag.runtime import cpu_kernels, q4q8

    monkeypatch.setattr(cpu_kernels, "cpu_flags", lambda: ICE_LAKE | set(extra))
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True, raising=False)
    monkeypatch.setattr(q4q8, "available", lambda: True)
    assert loader.cpu_has_native_bf16() is native
    assert loader.resolve_weight_format("auto", torch.device("cpu"), default_model=True) == \
        ("q4q8-bf16" if native else "q4q8-f32")


@pytest.mark.parametrize("kernels", [True, False])
def test_auto_weight_format_follows_the_cpus_bfloat16_support_and_kernels(monkeypatch, kernels):
    """auto for the default model on a CPU: q4q8 decode where the runner's CPU kernels run, else int4; bf16
    prefill where the CPU multiplies bfloat16 natively, else float32."""
    import torch

    from kvlink_rag.model import loader as model
    from kvlink_rag.runtime import q4q8

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.setattr(q4q8, "available", lambda: kernels)
    family = "q4q8" if kernels else "int4"
    monkeypatch.setattr(model, "cpu_has_native_bf16", lambda: True)
    assert model.resolve_weight_format("auto", cpu, default_model=True) == f"{family}-bf16"
    monkeypatch.setattr(model, "cpu_has_native_bf16", lambda: False)
    assert model.resolve_weight_format("auto", cpu, default_model=True) == f"{family}-f32"
    assert model.resolve_weight_format("auto", cpu, default_model=False) == "native"
    assert model.resolve_weight_format("int4-f32", cuda) == "native"
    if not kernels:
        with pytest.raises(ValueError, match="AVX2"):
            model.resolve_weight_format("q4q8-bf16", cpu)
    assert model.resolve_weight_format("bfloat16", cpu) == "bfloat16"
