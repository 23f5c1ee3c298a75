"""Copies for reader threads: numpy on the calling thread for matching dtypes (bfloat16 too, any strides),
torch for conversions."""

from __future__ import annotations

import pytest
import torch

from store.records.one_thread import copy_into


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int8])
def test_copy_into_a_strided_view(dtype):
    src = torch.randn(5, 3, 4).to(dtype)  # [T, H, D]
    out = torch.zeros(3, 9, 4, dtype=dtype)
    copy_into(out[:, 2:7], src.transpose(0, 1))
    assert torch.equal(out[:, 2:7], src.transpose(0, 1)) and (out[:, :2] == 0).all() and (out[:, 7:] == 0).all()


def test_copy_into_converts_a_dtype():
    src = torch.randn(3, 4, dtype=torch.bfloat16)
    out = torch.empty(3, 4)
    copy_into(out, src)
    assert torch.equal(out, src.float())


def test_copy_into_refuses_another_shape():
    with pytest.raises(ValueError, match="cannot copy"):
        copy_into(torch.empty(2, 3), torch.empty(3, 2))
