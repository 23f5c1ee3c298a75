"""The CPU kernels' build folder is named per source tree and interpreter, so checkouts never share one."""

from __future__ import annotations

import sys

from kvlink_rag.runtime import cpu_kernels


def test_the_build_name_follows_sources_flags_checkout_and_venv(monkeypatch, tmp_path):
    base = cpu_kernels._source_hash(["-O3"])
    assert cpu_kernels._source_hash(["-O3"]) == base  # stable: a second load reuses the build
    assert cpu_kernels._source_hash(["-O2"]) != base
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "other-venv"))
    assert cpu_kernels._source_hash(["-O3"]) != base
    monkeypatch.undo()
    copy = tmp_path / "csrc"
    copy.mkdir()
    for p in cpu_kernels.CSRC.iterdir():
        (copy / p.name).write_bytes(p.read_bytes())
    monkeypatch.setattr(cpu_kernels, "CSRC", copy)  # the same sources in another checkout
    assert cpu_kernels._source_hash(["-O3"]) != base
