"""Eval labels of CacheBlend variants (``eval --recompute-ratio``)."""

from __future__ import annotations

import pytest

from training.blend_modes import blend_variants, parse_ratios
from training.eval import Retention


def test_each_reuse_mode_gets_a_variant_per_ratio_and_ratio_zero_is_the_mode():
    variants = {m: (m, None) for m in ("full", "naive", "linked-query-lora")}
    out = blend_variants(variants, parse_ratios("0,0.05,0.15,0.3"))
    assert list(out) == ["full", "naive", "cacheblend-0.05", "cacheblend-0.15", "cacheblend-0.30",
                         "linked-query-lora", "linked-query-lora+blend-0.05", "linked-query-lora+blend-0.15",
                         "linked-query-lora+blend-0.30"]
    assert out["full"] == ("full", None) and out["naive"] == ("naive", None)
    assert out["cacheblend-0.15"] == ("naive", Retention(recompute_ratio=0.15))
    only = blend_variants({"naive r=0.5 random": ("naive", Retention(0.5, "random"))}, [0.15])
    assert only == {"cacheblend-0.15 r=0.5 random": ("naive", Retention(0.5, "random", recompute_ratio=0.15))}


@pytest.mark.parametrize("bad", ["", "0.1,2", "x"])
def test_bad_ratios_raise(bad):
    with pytest.raises(ValueError):
        parse_ratios(bad)
