"""The load-path benchmark on small random records: the stream into a request's blocks, timed against both copy
floors (one thread, as the issue defines it, and torch's threads, as the batched writes use), and its report row."""

from __future__ import annotations

import dataclasses

import torch

from bench.bandwidth import stream_into_blocks
from bench.report import _bandwidth_section
from factories import random_kv
from store.blobs.lmdb import LmdbBlobStore
from store.lmdb_env import open_env


def test_the_stream_into_blocks_reports_both_floors(tmp_path):
    env = open_env(tmp_path / "store", map_size=4 << 20, max_map_size=64 << 20)
    blobs = LmdbBlobStore(env)
    keys = []
    for i in range(3):  # importance-ordered bfloat16 records, as the default store writes them
        kv = random_kv(tokens=20 + i, dtype=torch.bfloat16, dim=64, seed=i)
        kv = dataclasses.replace(kv, importance=torch.rand(kv.num_tokens, generator=torch.Generator().manual_seed(i)))
        blobs.put(f"d{i}", kv)
        keys.append(f"d{i}")
    res = stream_into_blocks(blobs, keys, repeats=2)
    assert res["tokens"] == 63 and res["threads"] == torch.get_num_threads()
    assert res["kv_bytes"] == 2 * 3 * 2 * 63 * 64 * 2  # keys and values, 3 layers, 2 heads, bfloat16
    for k in ("stream_vs_copy", "stream_rope_vs_copy", "stream_vs_copy_threads"):
        assert res[k] > 0
    assert res["copy_threads"]["median_s"] > 0
    row = _bandwidth_section({"bandwidth": {"bfloat16": {"bytes_per_token": 1.0, "load_gbps": 1.0, "copy_gbps": 1.0,
                                                         "load_vs_copy": 1.0, "blocks": res}}})
    assert row[-1].count("|") == 11  # ten columns, the threads floor's last
    blobs.close()
    env.close()
