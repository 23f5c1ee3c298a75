"""The load path's row writers: stored keys rotated on their way into KV blocks equal apply_rope's bytes, with the
runner's CPU kernel and with the numpy fallback, from token-major and head-major rows into strided block views."""

from __future__ import annotations

import pytest
import torch

from kvlink_rag.linking import rope_rows
from kvlink_rag.linking.rope import apply_rope
from kvlink_rag.linking.rope_rows import RopeRows, block_writers, copy_rows
from kvlink_rag.runtime.cpu_kernels import available

H, N, D = 3, 37, 64


def _raw(x: torch.Tensor, token_major: bool):
    """The bytes a store hands a writer for ``x`` ``[H, n, D]``: ``[n, H, D]`` rows when token-major."""
    return (x.transpose(0, 1) if token_major else x).contiguous().view(torch.uint8).numpy()


def _blocks(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """An arena ``[H, 60, D]`` of zeros and the ``[H, N, D]`` view at rows 11.. a fill writes into."""
    arena = torch.zeros(H, 60, D, dtype=dtype)
    return arena, arena[:, 11:11 + N]


@pytest.fixture(params=["kernel", "numpy"])
def path(request, monkeypatch):
    if request.param == "kernel" and not available():
        pytest.skip("the runner's CPU kernels do not build on this machine")
    if request.param == "numpy":
        monkeypatch.setattr(rope_rows, "_kernels", lambda out: None)
    return request.param


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("token_major", [True, False])
def test_rotated_keys_equal_apply_rope_bit_for_bit(path, dtype, token_major):
    torch.manual_seed(0)
    x = torch.randn(H, N, D).to(dtype)
    cos, sin = torch.randn(N + 9, D), torch.randn(N + 9, D)  # the fill's tables; this document starts at row 9
    arena, out = _blocks(dtype)
    RopeRows(cos, sin)(out, _raw(x, token_major), token_major, 9)
    assert torch.equal(out, apply_rope(x.float(), cos[9:9 + N], sin[9:9 + N]).to(dtype))
    assert arena[:, :11].abs().sum() == 0 and arena[:, 11 + N:].abs().sum() == 0  # nothing outside the view


@pytest.mark.parametrize("token_major", [True, False])
def test_values_are_copied_as_stored(path, token_major):
    x = torch.randn(H, N, D).to(torch.bfloat16)
    _, out = _blocks(torch.bfloat16)
    copy_rows(out, _raw(x, token_major), token_major, 5)
    assert torch.equal(out, x)


def test_a_buffer_of_another_size_is_refused(path):
    x = torch.randn(H, N - 1, D).to(torch.bfloat16)
    _, out = _blocks(torch.bfloat16)
    with pytest.raises(ValueError, match="bytes"):
        copy_rows(out, _raw(x, False), False, 0)


def test_block_writers_take_tables_of_any_dtype_and_device():
    cos, sin = torch.randn(N, D, dtype=torch.float64), torch.randn(N, D, dtype=torch.float64)
    keys, values = block_writers(cos, sin)
    assert keys.cos.dtype == torch.float32 and keys.cos.is_contiguous() and values is copy_rows


def test_a_head_dim_the_kernel_does_not_take_goes_through_numpy():
    x = torch.randn(H, N, 320).to(torch.bfloat16)
    cos, sin = torch.randn(N, 320), torch.randn(N, 320)
    out = torch.empty(H, N, 320, dtype=torch.bfloat16)
    RopeRows(cos, sin)(out, _raw(x, True), True, 0)
    assert torch.equal(out, apply_rope(x.float(), cos, sin).to(torch.bfloat16))
