"""Which in-memory layer tensors a fill takes as rows (no copy): the same dtype as they are, bfloat16 into float32
widened by the writer, anything else written through write_rows."""

from __future__ import annotations

import pytest
import torch

from kvlink_rag.rows import stage_tensors, tensor_rows, widens


@pytest.mark.parametrize(("stored", "dtype", "want"), [
    (torch.bfloat16, torch.bfloat16, False), (torch.float32, torch.float32, False),
    (torch.bfloat16, torch.float32, True), (torch.float32, torch.bfloat16, None), (torch.float16, torch.float32, None)])
def test_widens_only_bfloat16_into_float32(stored, dtype, want):
    assert widens(stored, dtype) is want


def test_a_bfloat16_tensor_is_staged_for_a_float32_fill_as_its_own_bytes():
    x = torch.randn(2, 5, 8).to(torch.bfloat16)
    rows = tensor_rows(x, torch.float32, (2, 5, 8), 7)
    assert rows.widen and rows.start == 7 and not rows.token_major
    assert rows.raw.nbytes == x.numel() * 2 and rows.raw.ctypes.data == x.data_ptr()


def test_a_float32_tensor_is_not_staged_for_a_bfloat16_fill():
    k_parts, v_parts = [], []
    x = torch.randn(2, 5, 8)
    assert not stage_tensors(x, x, torch.bfloat16, (2, 5, 8), 0, k_parts, v_parts)
    assert k_parts == [] and v_parts == []
