"""int8 quantisation: error bounds, the per-channel-keys choice, bytes per token."""

from __future__ import annotations

import pytest
import torch

from store.records.quant import bytes_per_token, dequantize, max_abs_error_bound, quantize_int8


def rel_rmse(approx: torch.Tensor, exact: torch.Tensor) -> float:
    return float((approx.float() - exact.float()).pow(2).sum().sqrt() / exact.float().pow(2).sum().sqrt())


def outlier_channel_keys(seed: int = 0) -> torch.Tensor:
    """``[2, 2, 64, 32]`` keys shaped like pre-RoPE LLM keys: two channels with large, token-stable
    magnitude and offset (SmolLM2-135M's per-head max channel is ~4x its median channel)."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.ones(32)
    scale[[3, 17]] = 8.0
    bias = torch.zeros(32)
    bias[[3, 17]] = torch.tensor([6.0, -5.0])
    return torch.randn(2, 2, 64, 32, generator=g) * scale + bias


def token_scaled_values(seed: int = 1) -> torch.Tensor:
    """``[2, 2, 64, 32]`` values whose magnitude varies from token to token."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, 2, 64, 32, generator=g) * torch.rand(1, 1, 64, 1, generator=g) * 4


@pytest.mark.parametrize("axis", ["token", "channel"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_round_trip_within_half_a_step(axis, dtype):
    x = (torch.randn(3, 2, 40, 16, generator=torch.Generator().manual_seed(2)) * 3).to(dtype)
    qt = quantize_int8(x, axis)
    assert qt.q.dtype == torch.int8 and qt.q.shape == x.shape
    expected_scale_shape = (3, 2, 40, 1) if axis == "token" else (3, 2, 1, 16)
    assert tuple(qt.scale.shape) == expected_scale_shape and qt.scale.dtype == torch.float16
    y = dequantize(qt)
    assert y.dtype == dtype
    err = (dequantize(qt, torch.float32) - x.float()).abs()
    assert bool((err <= max_abs_error_bound(qt) + 1e-6).all())
    assert rel_rmse(y, x) < 0.01


def test_per_channel_is_more_accurate_for_keys_and_per_token_for_values():
    k = outlier_channel_keys()
    k_token = rel_rmse(dequantize(quantize_int8(k, "token")), k)
    k_channel = rel_rmse(dequantize(quantize_int8(k, "channel")), k)
    assert k_token == pytest.approx(0.00704, abs=2e-4)
    assert k_channel == pytest.approx(0.00477, abs=2e-4)
    assert k_channel < 0.7 * k_token
    v = token_scaled_values()
    v_token = rel_rmse(dequantize(quantize_int8(v, "token")), v)
    v_channel = rel_rmse(dequantize(quantize_int8(v, "channel")), v)
    assert v_token < 0.8 * v_channel


def test_constant_groups_are_exact_and_bad_input_is_rejected():
    x = torch.full((1, 1, 4, 8), 0.5)
    qt = quantize_int8(x)
    assert torch.equal(dequantize(qt), x)
    with pytest.raises(ValueError):
        quantize_int8(torch.tensor([[float("nan"), 1.0]]))
    with pytest.raises(ValueError):
        quantize_int8(torch.ones(4))
    with pytest.raises(ValueError):
        quantize_int8(torch.ones(2, 2), axis="head")


def test_large_values_fall_back_to_float32_scales():
    x = torch.tensor([[[-1.0e5, 0.0, 2.0e5]]])
    qt = quantize_int8(x)
    assert qt.scale.dtype == torch.float32
    assert float((dequantize(qt) - x).abs().max()) <= float(qt.scale.max()) / 2 + 1e-3


def test_bytes_per_token_for_a_30_layer_3_head_64_dim_model():
    # SmolLM2-135M geometry.
    assert bytes_per_token(30, 3, 64, "float16") == 23040
    assert bytes_per_token(30, 3, 64, "bfloat16") == 23040
    assert bytes_per_token(30, 3, 64, "float32") == 46080
    # int8 + a float16 scale and zero per (layer, head, token) for K and V.
    assert bytes_per_token(30, 3, 64, "int8") == 12240
    # Keys per channel: their scales are amortised over the document (200 tokens here).
    assert bytes_per_token(30, 3, 64, "int8", key_axis="channel", tokens=200) == pytest.approx(11995.2)
    with pytest.raises(ValueError):
        bytes_per_token(30, 3, 64, "int4")
