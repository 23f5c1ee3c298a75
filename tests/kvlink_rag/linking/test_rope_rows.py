"""The load path's row writers: stored keys rotated on their way into KV blocks equal apply_rope's bytes, with the
runner's CPU kernel and with the numpy fallback, from token-major and head-major rows into strided block views."""

from __future__ import annotations

import pytest
import torch

from kvlink_rag.linking import rope_rows
from kvlink_rag.linking.rope import apply_rope
from kvlink_rag.linking.rope_rows import RopeRows, block_writers, copy_rows
from kvlink_rag.rows import StoredRows
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


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rotation_rounds_ties_and_special_values_as_apply_rope(path, dtype):
    """Infinities, huge, subnormal and NaN keys, and rotations landing on bfloat16 rounding midpoints: apply_rope's
    bytes then torch's cast, the vector loops of every ISA rounding to nearest even; a NaN stays a NaN (the kernels
    write 0x7FC0, torch's vectorised cast may keep another NaN's bits)."""
    torch.manual_seed(1)
    x = torch.randn(H, N, D)
    x[0, 0, :4] = torch.tensor([float("nan"), float("inf"), -float("inf"), 3e38])
    x[2, 2, :] = 1e-40  # subnormal
    cos, sin = torch.randn(N, D), torch.randn(N, D)
    x[1, 1, :] = 1.0  # rotated to 1 + 2**-8 and 1 + 3 * 2**-8: bfloat16 midpoints, to even (down, then up)
    cos[1], sin[1] = torch.tensor([1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8]).repeat(D // 2), 0.0
    x = x.to(dtype)
    _, out = _blocks(dtype)
    RopeRows(cos, sin)(out, _raw(x, False), False, 0)
    want = apply_rope(x.float(), cos, sin).to(dtype)
    nan = want.isnan()
    assert torch.equal(out.isnan(), nan) and nan.sum() == 2  # the NaN key and the row its rotation mixes it into
    as_int = torch.int16 if dtype == torch.bfloat16 else torch.int32
    assert torch.equal(out.view(as_int)[~nan], want.view(as_int)[~nan])
    if dtype == torch.bfloat16:
        assert set(out[1, 1].float().tolist()) == {1.0, 1.0 + 2.0 ** -6}


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


def _parts(dtype: torch.dtype, lengths: list[int], starts: list[int], majors: list[bool]):
    """Documents ``[H, n, D]`` of ``dtype`` and the :class:`StoredRows` a store hands over for them."""
    torch.manual_seed(1)
    xs = [torch.randn(H, n, D).to(dtype) for n in lengths]
    return xs, [StoredRows(_raw(x, tm), tm, a) for x, tm, a in zip(xs, majors, starts)]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_write_many_rotates_each_document_at_its_rows_as_one_call_each(path, dtype, threads):
    lengths, starts, majors = [5, 17, 1, 9], [0, 5, 31, 22], [True, False, True, False]  # rows 32.. untouched
    xs, parts = _parts(dtype, lengths, starts, majors)
    cos, sin = torch.randn(40, D), torch.randn(40, D)
    arena = torch.zeros(H, 50, D, dtype=dtype)
    out = arena[:, 3:43]  # a strided view, as the blocks of a request that holds other tokens before
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        RopeRows(cos, sin).write_many(out, parts)
    finally:
        torch.set_num_threads(old)
    for x, a, n in zip(xs, starts, lengths):
        assert torch.equal(out[:, a:a + n], apply_rope(x.float(), cos[a:a + n], sin[a:a + n]).to(dtype))
    assert out[:, 32:].abs().sum() == 0 and arena[:, :3].abs().sum() == 0


def test_write_many_copies_values_as_stored(path):
    lengths, starts = [7, 4, 12], [4, 11, 15]
    xs, parts = _parts(torch.bfloat16, lengths, starts, [False, True, True])
    out = torch.zeros(H, 27, D, dtype=torch.bfloat16)
    copy_rows.write_many(out, parts)
    assert all(torch.equal(out[:, a:a + n], x) for x, a, n in zip(xs, starts, lengths))
    assert out[:, :4].abs().sum() == 0


@pytest.mark.parametrize("start", [-1, 20])
def test_write_many_refuses_rows_outside_the_output(path, start):
    _, parts = _parts(torch.bfloat16, [3, 8], [0, start], [False, True])
    out = torch.zeros(H, 27, D, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="outside"):
        copy_rows.write_many(out, parts)


def test_write_many_refuses_a_buffer_of_no_whole_rows(path):
    raw = torch.zeros(H * D + 1, dtype=torch.bfloat16).view(torch.uint8).numpy()
    with pytest.raises(ValueError, match="whole rows"):
        copy_rows.write_many(torch.zeros(H, 4, D, dtype=torch.bfloat16), [StoredRows(raw, False, 0)])


@pytest.mark.parametrize("rotated", [True, False])
@pytest.mark.parametrize("token_major", [True, False])
def test_bfloat16_rows_widen_into_float32_blocks_bit_for_bit(path, token_major, rotated):
    """Stored bfloat16 rows into float32 blocks (the KV dtype where the CPU lacks native bfloat16) in one pass:
    keys equal apply_rope on the widened rows, values the widened rows, with infinities, huge and subnormal values;
    a NaN stays a NaN."""
    torch.manual_seed(2)
    xs = [torch.randn(H, n, D).to(torch.bfloat16) for n in (13, 6)]
    xs[0][0, 0, :4] = torch.tensor([float("nan"), float("inf"), -float("inf"), 3e38]).to(torch.bfloat16)
    xs[1][2, 2, :] = 1e-39  # subnormal in bfloat16 too
    starts = [2, 20]
    parts = [StoredRows(_raw(x, token_major), token_major, a, True) for x, a in zip(xs, starts)]
    cos, sin = torch.randn(30, D), torch.randn(30, D)
    arena = torch.zeros(H, 32, D)
    out = arena[:, 1:31]
    (RopeRows(cos, sin) if rotated else copy_rows).write_many(out, parts)
    for x, a in zip(xs, starts):
        n = x.shape[1]
        want = apply_rope(x.float(), cos[a:a + n], sin[a:a + n]) if rotated else x.float()
        got = out[:, a:a + n]
        nan = want.isnan()
        assert torch.equal(got.isnan(), nan)
        assert torch.equal(got.view(torch.int32)[~nan], want.view(torch.int32)[~nan])
    assert out[:, :2].abs().sum() == 0 and out[:, 15:20].abs().sum() == 0 and out[:, 26:].abs().sum() == 0
    assert arena[:, 0].abs().sum() == 0


def test_widened_rows_are_counted_in_bfloat16_bytes(path):
    """A widened part holds whole rows of bfloat16 (half a float32 row's bytes), checked as such."""
    raw = torch.zeros(H * D * 3 + 1, dtype=torch.bfloat16).view(torch.uint8).numpy()
    with pytest.raises(ValueError, match="whole rows"):
        copy_rows.write_many(torch.zeros(H, 4, D), [StoredRows(raw, False, 0, True)])
    ok = torch.ones(H * D * 3, dtype=torch.bfloat16).view(torch.uint8).numpy()
    out = torch.zeros(H, 4, D)
    copy_rows.write_many(out, [StoredRows(ok, False, 1, True)])
    assert out[:, 1:].eq(1).all() and out[:, 0].eq(0).all()


def test_widened_rows_into_bfloat16_blocks_are_refused(path):
    raw = torch.ones(H * D * 2, dtype=torch.bfloat16).view(torch.uint8).numpy()
    out = torch.zeros(H, 4, D, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="only bfloat16 rows widen"):
        copy_rows.write_many(out, [StoredRows(raw, False, 0, True)])
    assert out.abs().sum() == 0


@pytest.mark.parametrize("rotated", [True, False])
def test_widening_a_head_dim_of_no_whole_vectors_takes_the_scalar_loop_bit_for_bit(path, rotated):
    """head_dim 24: half of it (12) fills no 8- or 16-lane vector, so the kernel widens and rotates element by
    element; the same bytes as apply_rope on the widened rows."""
    torch.manual_seed(3)
    x = torch.randn(H, 9, 24).to(torch.bfloat16)
    cos, sin = torch.randn(12, 24), torch.randn(12, 24)
    out = torch.zeros(H, 12, 24)
    part = StoredRows(_raw(x, True), True, 2, True)
    (RopeRows(cos, sin) if rotated else copy_rows).write_many(out, [part])
    want = apply_rope(x.float(), cos[2:11], sin[2:11]) if rotated else x.float()
    assert torch.equal(out[:, 2:11].view(torch.int32), want.view(torch.int32))
    assert out[:, :2].abs().sum() == 0 and out[:, 11:].abs().sum() == 0
