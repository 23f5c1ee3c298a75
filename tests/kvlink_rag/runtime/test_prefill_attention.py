"""The prefill attention kernel (csrc/prefill_attention.cpp) against a float32 reference, beside SDPA's bfloat16."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kvlink_rag.runtime import prefill_attention
from kvlink_rag.runtime.prefill_attention import attend_prefill
from kvlink_rag.runtime.ragged import attend

needs_kernel = pytest.mark.skipif(prefill_attention._kernel() is None,
                                  reason="the prefill kernel needs AVX512-BF16 and the runner's CPU kernels")
SCALE = 0.125


def make(n: int, lens: list[int], heads: int = 9, kv: int = 3, seed: int = 0):
    """Queries ``[heads, n, 64]`` and KV pieces ``[kv, t, 64]``, bfloat16, seeded."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(heads, n, 64, generator=g).bfloat16()
    pieces = [(torch.randn(kv, t, 64, generator=g).bfloat16(), torch.randn(kv, t, 64, generator=g).bfloat16())
              for t in lens]
    return q, pieces


def random_mask(n: int, keys: int, dtype: torch.dtype, fill: float, seed: int = 1) -> torch.Tensor:
    """Additive ``[n, keys]`` masking ~30% of keys, each row's last key always visible."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(n, keys, dtype=dtype)
    mask[torch.rand(n, keys, generator=g) < 0.3] = fill
    mask[:, -1] = 0
    return mask


def reference(q, pieces, mask, causal):
    """float32 SDPA on the same bfloat16 inputs."""
    k = torch.cat([k for k, _ in pieces], 1).float()
    v = torch.cat([v for _, v in pieces], 1).float()
    n, keys = q.shape[1], k.shape[1]
    m = None if mask is None else mask.float()
    if causal:
        m = torch.zeros(n, keys).masked_fill(torch.ones(n, keys, dtype=torch.bool).triu(keys - n + 1), float("-inf"))
    return F.scaled_dot_product_attention(q.float()[None], k[None], v[None], attn_mask=m, scale=SCALE,
                                          enable_gqa=True)[0]


def sdpa_bf16(q, pieces, mask):
    k = torch.cat([k for k, _ in pieces], 1)
    v = torch.cat([v for _, v in pieces], 1)
    return F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=None if mask is None else mask.bfloat16(),
                                          scale=SCALE, enable_gqa=True)[0]


@needs_kernel
@pytest.mark.parametrize("n,lens,mask_dtype,fill", [
    (7, [5], None, 0.0),
    (12, [100], torch.bfloat16, torch.finfo(torch.bfloat16).min),
    (13, [30, 47, 1, 16], torch.float32, torch.finfo(torch.float32).min),
    (40, [33, 64, 17], torch.float32, float("-inf")),
    (100, [1500, 37], torch.bfloat16, torch.finfo(torch.bfloat16).min),
])
def test_masked_rows_match_float32_as_closely_as_sdpa(n, lens, mask_dtype, fill):
    q, pieces = make(n, lens)
    mask = None if mask_dtype is None else random_mask(n, sum(lens), mask_dtype, fill)
    out = attend_prefill(q, pieces, mask, SCALE, False)
    assert out is not None and out.dtype == torch.bfloat16 and out.shape == q.shape
    ref = reference(q, pieces, mask, False)
    err, sdpa_err = (out.float() - ref).abs().max().item(), (sdpa_bf16(q, pieces, mask).float() - ref).abs().max().item()
    assert err <= 1.5 * sdpa_err + 1e-3, (err, sdpa_err)


@needs_kernel
@pytest.mark.parametrize("n,lens", [(64, [64]), (50, [30, 50]), (17, [200, 3, 17])])
def test_causal_rows_see_keys_up_to_their_diagonal(n, lens):
    q, pieces = make(n, lens, seed=3)
    out = attend_prefill(q, pieces, None, SCALE, True)
    ref = reference(q, pieces, None, True)
    assert (out.float() - ref).abs().max().item() < 2e-2
    # the first query of a sequence that opens with its own tokens sees only itself: its value, rounded
    if lens == [64]:
        torch.testing.assert_close(out[:, 0].float(), pieces[0][1].float().repeat_interleave(3, 0)[:, 0], atol=1e-2, rtol=0)


@needs_kernel
def test_pieces_are_read_in_place_from_strided_block_views():
    q, _ = make(20, [1])
    buf_k = torch.randn(3, 256, 64).bfloat16()  # a block buffer [kv, capacity, 64]; pieces are views of it
    buf_v = torch.randn(3, 256, 64).bfloat16()
    pieces = [(buf_k[:, 3:90], buf_v[:, 3:90]), (buf_k[:, 128:161], buf_v[:, 128:161])]
    out = attend_prefill(q, pieces, None, SCALE, False)
    ref = reference(q, [(k.contiguous(), v.contiguous()) for k, v in pieces], None, False)
    assert (out.float() - ref).abs().max().item() < 2e-2


@needs_kernel
@pytest.mark.parametrize("heads,kv", [(4, 4), (8, 2), (9, 1)])
def test_other_group_sizes(heads, kv):
    q, pieces = make(19, [70, 9], heads=heads, kv=kv, seed=5)
    out = attend_prefill(q, pieces, None, SCALE, False)
    assert (out.float() - reference(q, pieces, None, False)).abs().max().item() < 2e-2


@needs_kernel
def test_a_row_with_every_key_masked_gives_zeros():
    q, pieces = make(3, [40])
    mask = torch.zeros(3, 40)
    mask[1] = float("-inf")
    out = attend_prefill(q, pieces, mask, SCALE, False)
    assert torch.equal(out[:, 1], torch.zeros_like(out[:, 1]))


def test_cases_outside_the_kernel_are_left_to_sdpa():
    q, pieces = make(5, [12])
    assert attend_prefill(q.float(), [(k.float(), v.float()) for k, v in pieces], None, SCALE, False) is None
    assert attend_prefill(q, pieces, torch.zeros(5, 12, dtype=torch.float16), SCALE, False) is None
    mixed = [*pieces, (torch.randn(3, 4, 64), torch.randn(3, 4, 64))]  # a float32 piece after a bfloat16 one
    assert attend_prefill(q, mixed, None, SCALE, False) is None
    q96 = torch.randn(9, 5, 96).bfloat16()
    assert attend_prefill(q96, [(torch.randn(3, 12, 96).bfloat16(),) * 2], None, SCALE, False) is None


@pytest.fixture
def mode(monkeypatch):
    """Chooses the mode (:func:`~kvlink_rag.runtime.prefill_attention.set_mode`, and the CPU's AMX flag) for one
    test; the process's mode and the cached choices restored after."""
    before = prefill_attention._CONFIGURED[0]

    def set_mode(value: str, amx: bool | None = None, flags: set[str] | None = None):
        if amx is not None or flags is not None:
            have = flags if flags is not None else ({"avx512_bf16", "amx_bf16"} if amx else {"avx512_bf16"})
            monkeypatch.setattr(prefill_attention, "cpu_flags", lambda: have)
        prefill_attention.set_mode(value)
    yield set_mode
    monkeypatch.undo()
    prefill_attention.set_mode(before)


@needs_kernel
def test_attend_routes_prefill_rows_to_the_kernel_and_agrees_with_sdpa(monkeypatch, mode):
    mode("kernel")
    q, pieces = make(30, [90, 30])
    mask = random_mask(30, 120, torch.bfloat16, torch.finfo(torch.bfloat16).min)
    calls = []
    real = prefill_attention.attend_prefill
    monkeypatch.setattr("kvlink_rag.runtime.ragged.attend_prefill",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    out = attend(q, pieces, mask, SCALE)
    assert calls and (out.float() - sdpa_bf16(q, pieces, mask).float()).abs().max().item() < 2e-2


@needs_kernel
@pytest.mark.parametrize("value, amx, kernel", [("auto", False, True), ("auto", True, False), ("kernel", True, True),
                                                ("sdpa", False, False)])
def test_the_mode_chooses_the_kernel_without_amx_and_sdpa_with_it(value, amx, kernel, mode, monkeypatch):
    """``auto`` takes the kernel on an AVX512-BF16 CPU without AMX and SDPA where AMX multiplies SDPA's blocks
    (1.4-3.2x the kernel there, module docstring); ``kernel`` and ``sdpa`` force one."""
    mode(value, amx)
    calls = []
    real = prefill_attention.attend_prefill
    monkeypatch.setattr("kvlink_rag.runtime.ragged.attend_prefill", lambda *a, **k: calls.append(1) or real(*a, **k))
    q, pieces = make(6, [10])
    attend(q, pieces, None, SCALE)
    assert prefill_attention.available() is kernel and bool(calls) is kernel


@pytest.mark.parametrize("flags, kernel, native", [({"avx2"}, False, False), ({"avx512_bf16"}, False, False),
                                                   ({"avx512_bf16"}, True, True),
                                                   ({"avx512_bf16", "amx_bf16"}, False, True)])
def test_bfloat16_attention_is_native_where_the_kernel_runs_or_amx(flags, kernel, native, mode, monkeypatch):
    """Float32 queries over bfloat16 KV are narrowed where attention runs in bfloat16 natively (the kernel, or SDPA
    on AMX tiles), else the KV is widened, as on AVX2, Ice Lake, or an AVX512-BF16 CPU whose kernel does not run."""
    monkeypatch.setattr(prefill_attention, "_kernel", lambda: object() if kernel else None)
    mode("auto", flags=flags)
    assert prefill_attention.bf16_native() is native


def test_another_mode_is_refused(mode, monkeypatch):
    with pytest.raises(ValueError, match="prefill attention 'fast'"):
        prefill_attention.set_mode("fast")
    mode(None)
    monkeypatch.setenv("KVLINK_RAG_PREFILL_ATTENTION", "fast")
    with pytest.raises(ValueError, match="KVLINK_RAG_PREFILL_ATTENTION='fast'"):
        prefill_attention.available()


def test_the_loaded_settings_choose_the_mode(mode):
    """The model loader applies ``EngineSettings.prefill_attention`` (so ``settings.env`` counts), not only the
    environment."""
    from factories import default_model_path

    from kvlink_rag.model.loader import load_model
    from service.settings import Settings

    mode("auto")
    load_model(Settings(model=str(default_model_path()), device="cpu", prefill_attention="sdpa"))
    assert prefill_attention._mode() == "sdpa" and not prefill_attention.available()
