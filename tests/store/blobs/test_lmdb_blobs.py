"""LmdbBlobStore: exact round trips, int8, layer reads, checksums, eviction when the map is at its maximum."""

from __future__ import annotations

import json

import pytest
import torch

from store.records.codec import FORMAT_VERSION
from store.records.errors import CorruptRecordError
from store.blobs.lmdb import LmdbBlobStore
from store.blobs.lmdb_records import BLOBS_DB
from store.lmdb_env import StoreBusyError, StoreFullError, open_env


@pytest.fixture
def blobs(lmdb_env, clock):
    store = LmdbBlobStore(lmdb_env, clock=clock)
    yield store
    store.close()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_round_trip_is_bit_exact(blobs, make_kv, same_kv, dtype):
    kv = make_kv(dtype=dtype, seed=3, encoding="isolated")
    nbytes = blobs.put("doc-a", kv)
    got = blobs.get("doc-a")
    same_kv(got, kv)
    meta = blobs.meta("doc-a")
    assert meta["format_version"] == FORMAT_VERSION
    assert meta["dtype"] == {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[dtype]
    assert meta["shape"] == [3, 2, 16, 8] and meta["num_tokens"] == 16
    assert len(meta["checksum"]["layers"]) == 3 and meta["nbytes"] == nbytes
    # Payload = K and V + 16 int64 ids + one small safetensors header per layer.
    assert kv.nbytes + 16 * 8 < nbytes < kv.nbytes + 16 * 8 + 3 * 200


def test_get_converts_dtype_on_request(blobs, make_kv):
    kv = make_kv(dtype=torch.bfloat16)
    blobs.put("k", kv)
    got = blobs.get("k", dtype=torch.float32)
    assert got.dtype == torch.float32 and torch.equal(got.keys, kv.keys.float())
    assert blobs.get("k", dtype="float16").dtype == torch.float16


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_int8_round_trip_within_bound(blobs, make_kv, dtype):
    kv = make_kv(layers=2, heads=2, tokens=64, dim=16, dtype=dtype, seed=5)
    nbytes = blobs.put("q", kv, int8=True)
    assert blobs.meta("q")["dtype"] == "int8" and blobs.meta("q")["key_axis"] == "channel"
    got = blobs.get("q")
    assert got.dtype == dtype  # dequantised to the source dtype
    for stored, exact, group_dim in ((got.keys, kv.keys, 2), (got.values, kv.values, 3)):
        x = exact.float()
        # Half a quantisation step of each group (keys per channel, values per token), plus the
        # rounding of the result to ``dtype``.
        step = (x.amax(group_dim, keepdim=True) - x.amin(group_dim, keepdim=True)) / 255
        tol = step / 2 + x.abs() * {torch.float32: 1e-6, torch.bfloat16: 2**-8, torch.float16: 2**-11}[dtype] + 2e-3
        assert bool(((stored.float() - x).abs() <= tol).all())
        assert float((stored.float() - x).pow(2).mean().sqrt() / x.pow(2).mean().sqrt()) < 0.012
    # int8 K and V (8192 B) + float16 scale and zero per key channel (256 B) and per value token
    # (1024 B) + 64 int64 ids (512 B) + one safetensors header per layer.
    assert 8192 + 256 + 1024 + 512 < nbytes < 8192 + 256 + 1024 + 512 + 2 * 500


def test_iter_layers_yields_each_layer(blobs, make_kv):
    kv = make_kv(dtype=torch.bfloat16, seed=9)
    blobs.put("x", kv)
    layers = list(blobs.iter_layers("x"))
    assert len(layers) == 3
    for i, (k, v) in enumerate(layers):
        assert k.shape == (2, 16, 8) and torch.equal(k, kv.keys[i]) and torch.equal(v, kv.values[i])
    with pytest.raises(KeyError):
        next(blobs.iter_layers("missing"))


def test_contains_delete_keys_stats(blobs, make_kv):
    assert blobs.get("nope") is None
    blobs.put("b", make_kv(seed=1))
    blobs.put("a", make_kv(seed=2))
    assert blobs.contains("a") and "b" in blobs and not blobs.contains("c")
    assert blobs.keys() == ["a", "b"]
    assert blobs.delete("a") is True and blobs.delete("a") is False
    assert blobs.keys() == ["b"] and blobs.get("a") is None
    st = blobs.stats()
    assert st["documents"] == 1 and st["checksum_failures"] == 0 and st["evictions"] == 0
    with pytest.raises(ValueError):
        blobs.put("a/b", make_kv())


def test_overwrite_with_fewer_layers_leaves_no_orphans(blobs, lmdb_env, make_kv, same_kv):
    blobs.put("k", make_kv(layers=5))
    small = make_kv(layers=2, seed=7)
    blobs.put("k", small)
    same_kv(blobs.get("k"), small)
    with lmdb_env.env.begin(db=lmdb_env.db(BLOBS_DB)) as txn:
        names = sorted(bytes(k).decode() for k, _ in txn.cursor())
    assert names == ["k/L0", "k/L1", "k/ids", "k/meta"]


def _flip_last_byte(env, record: str) -> None:
    db = env.db(BLOBS_DB)
    with env.env.begin(write=True, db=db) as txn:
        raw = bytearray(txn.get(record.encode()))
        raw[-1] ^= 0x01
        txn.put(record.encode(), bytes(raw))


@pytest.mark.parametrize("record", ["L1", "ids"])
def test_corrupt_payload_is_a_miss_and_is_deleted(lmdb_env, make_kv, same_kv, record):
    reported = []
    blobs = LmdbBlobStore(lmdb_env, on_corrupt=reported.append)
    kv_ok = make_kv(seed=1)
    blobs.put("good", kv_ok)
    blobs.put("bad", make_kv(seed=2))
    _flip_last_byte(lmdb_env, f"bad/{record}")
    assert blobs.get("bad") is None
    assert not blobs.contains("bad") and blobs.keys() == ["good"]
    assert blobs.checksum_failures == 1 and blobs.stats()["checksum_failures"] == 1
    assert reported == ["bad"]
    same_kv(blobs.get("good"), kv_ok)
    assert blobs.get("bad") is None and blobs.checksum_failures == 1  # now a plain miss


def test_corrupt_layer_during_iter_layers_raises(lmdb_env, make_kv):
    reported = []
    blobs = LmdbBlobStore(lmdb_env, on_corrupt=reported.append)
    blobs.put("bad", make_kv())
    _flip_last_byte(lmdb_env, "bad/L2")
    it = blobs.iter_layers("bad")
    next(it), next(it)
    with pytest.raises(CorruptRecordError):
        next(it)
    assert reported == ["bad"] and not blobs.contains("bad")


def test_corrupt_meta_is_a_miss(lmdb_env, make_kv):
    blobs = LmdbBlobStore(lmdb_env)
    blobs.put("m", make_kv())
    with lmdb_env.env.begin(write=True, db=lmdb_env.db(BLOBS_DB)) as txn:
        txn.put(b"m/meta", b"{not json")
    assert blobs.get("m") is None and blobs.checksum_failures == 1
    with lmdb_env.env.begin(db=lmdb_env.db(BLOBS_DB)) as txn:
        assert [bytes(k) for k, _ in txn.cursor()] == []


def test_map_grows_before_evicting(tmp_path, make_kv, same_kv):
    env = open_env(tmp_path / "grow", map_size=256 << 10, max_map_size=64 << 20)
    blobs = LmdbBlobStore(env)
    docs = {f"d{i}": make_kv(layers=2, heads=2, tokens=256, dim=16, seed=i) for i in range(8)}  # ~131 KB each
    for k, kv in docs.items():
        blobs.put(k, kv)
    assert env.map_size > 256 << 10 and env.grow_count >= 2 and blobs.evictions == 0
    for k, kv in docs.items():
        same_kv(blobs.get(k), kv)
    env.close()


def test_full_map_evicts_least_valuable_and_keeps_the_rest_intact(tmp_path, make_kv, same_kv, clock):
    env = open_env(tmp_path / "full", map_size=256 << 10, max_map_size=1 << 20)
    evicted = []
    blobs = LmdbBlobStore(env, clock=clock, on_evict=evicted.append)
    docs = {}
    for i in range(20):
        clock.advance(1.0)
        docs[f"d{i:02d}"] = make_kv(layers=2, heads=2, tokens=256, dim=16, seed=i)
        blobs.put(f"d{i:02d}", docs[f"d{i:02d}"])
        if i == 0:
            for _ in range(10):  # d00 is hot: worth (1 + 10) / (1 + age)
                blobs.get("d00")
    remaining = blobs.keys()
    assert env.map_size == 1 << 20
    assert 3 <= len(remaining) < 8
    assert "d00" in remaining and "d19" in remaining
    # Everything else went oldest first, and every survivor reads back bit-exact.
    assert evicted == [f"d{i:02d}" for i in range(1, 20 - len(remaining) + 1)]
    assert blobs.evictions == len(evicted) == 20 - len(remaining)
    for k in remaining:
        same_kv(blobs.get(k), docs[k])
    assert blobs.checksum_failures == 0
    with pytest.raises(StoreFullError):
        blobs.put("huge", make_kv(layers=8, heads=4, tokens=1024, dim=16))
    env.close()


def test_meta_json_is_plain_json(blobs, lmdb_env, make_kv):
    blobs.put("j", make_kv())
    with lmdb_env.env.begin(db=lmdb_env.db(BLOBS_DB)) as txn:
        meta = json.loads(bytes(txn.get(b"j/meta")))
    assert set(meta) >= {
        "format_version",
        "dtype",
        "shape",
        "fingerprint",
        "encoding",
        "num_tokens",
        "checksum",
        "created",
    }
    assert meta["fingerprint"] == "fp-test" and meta["encoding"] == "anchored"


def test_records_of_format_version_1_stay_readable_and_newer_ones_are_left_alone(blobs, lmdb_env, make_kv, same_kv,
                                                                                monkeypatch):
    import xxhash

    from store.records import codec

    kv = make_kv(seed=5)
    with monkeypatch.context() as m:  # write as the previous release did: xxh64 checksums, version 1
        m.setattr(codec, "FORMAT_VERSION", 1)
        blobs.put("old", kv)
    meta = blobs.meta("old")
    assert meta["format_version"] == 1
    with lmdb_env.env.begin(db=lmdb_env.db(BLOBS_DB)) as txn:
        assert meta["checksum"]["layers"][0] == xxhash.xxh64_hexdigest(txn.get(b"old/L0"))
    same_kv(blobs.get("old"), kv)  # read by this release: verified with xxh64
    blobs.put("new", kv)
    with lmdb_env.env.begin(db=lmdb_env.db(BLOBS_DB)) as txn:
        assert blobs.meta("new")["checksum"]["layers"][0] == xxhash.xxh3_64_hexdigest(txn.get(b"new/L0"))
    with monkeypatch.context() as m:  # an older release meets a version-2 record: a miss, not a deletion
        m.setattr(codec, "FORMAT_VERSION", 1)
        assert blobs.get("new") is None and blobs.checksum_failures == 0
    same_kv(blobs.get("new"), kv)


@pytest.mark.parametrize("int8", [False, True])
def test_whole_document_get_equals_layer_by_layer_reads(blobs, make_kv, int8):
    kv = make_kv(dtype=torch.bfloat16, seed=7)
    blobs.put("d", kv, int8=int8)
    got = blobs.get("d")
    layers = list(blobs.iter_layers("d"))  # decoded one layer at a time
    assert torch.equal(got.keys, torch.stack([k for k, _ in layers]))
    assert torch.equal(got.values, torch.stack([v for _, v in layers]))
    as_f32 = blobs.get("d", dtype=torch.float32)  # other output dtype: the per-layer path
    assert torch.equal(as_f32.keys.bfloat16(), got.keys) and as_f32.keys.dtype == torch.float32


def test_a_read_whose_stats_write_back_finds_the_map_full_returns_and_evicts_nothing(
        blobs, lmdb_env, clock, make_kv, same_kv, monkeypatch):
    # A full map (at its maximum, a reader in another thread pinning the freed pages) once failed a cache read:
    # the hit counts' write-back evicted documents for room and raised StoreFullError through get().
    kv = make_kv(seed=1)
    blobs.put("a", kv)
    blobs.put("b", make_kv(seed=2))
    asked, real = [], lmdb_env.write

    def full(fn, reclaim=True):
        asked.append(reclaim)
        raise StoreFullError("full")

    monkeypatch.setattr(lmdb_env, "write", full)
    clock.advance(60)  # this read's write-back is due
    same_kv(blobs.get("a"), kv)
    assert asked == [False] and blobs.evictions == 0 and blobs.keys() == ["a", "b"]
    blobs.close()  # the close's write-back fails alike, quietly
    assert asked == [False, False]
    monkeypatch.setattr(lmdb_env, "write", real)
    clock.advance(60)
    blobs.get("a")  # written back now, the hit the full map held back included
    stored = blobs.access.rows()
    assert stored["a"]["hits"] == 2 and stored["b"]["hits"] == 0 and not blobs.access._pending


class _Reader:
    """A read transaction held open by another process (pinning the pages freed after its snapshot)."""

    def __init__(self, path):
        import subprocess
        import sys

        code = (f"import lmdb, sys; env = lmdb.open({str(path)!r}, readonly=True, max_dbs=16); txn = env.begin(); "
                "print('open', flush=True); sys.stdin.read()")
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        assert self.proc.stdout.readline().strip() == "open"

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(10)


def _full_store(tmp_path, make_kv):
    env = open_env(tmp_path / "pinned", map_size=256 << 10, max_map_size=1 << 20)
    blobs = LmdbBlobStore(env)
    for i in range(12):  # ~131 KB each: the map at its maximum holds 6
        blobs.put(f"d{i:02d}", make_kv(layers=2, heads=2, tokens=256, dim=16, seed=i))
    return env, blobs


def test_a_put_whose_eviction_is_pinned_by_an_older_reader_fails_without_evicting_the_rest(
        tmp_path, make_kv, same_kv, monkeypatch):
    # Once a put into a full store, with another process reading, evicted all 6 documents and still failed.
    import store.lmdb_env as lmdb_env

    monkeypatch.setattr(lmdb_env, "PINNED_WAIT_S", 0.05)
    env, blobs = _full_store(tmp_path, make_kv)
    kept, evicted = blobs.keys(), blobs.evictions
    reader = _Reader(tmp_path / "pinned")
    new = make_kv(layers=2, heads=2, tokens=256, dim=16, seed=99)
    with pytest.raises(StoreFullError, match=f"no room for new: pid {reader.proc.pid} reads a snapshot older"):
        blobs.put("new", new)
    assert blobs.evictions - evicted == 2 and blobs.keys() == kept[2:]  # one round for ~1.25x the document
    reader.close()
    blobs.put("new", new)  # the reader gone, the space it held is used: nothing more evicted
    assert blobs.evictions - evicted == 2 and blobs.keys() == kept[2:] + ["new"]
    same_kv(blobs.get("new"), new)
    blobs.close()
    env.close()


def test_a_put_waits_for_a_pinning_reader_that_ends(tmp_path, make_kv, same_kv, monkeypatch):
    import threading

    import store.lmdb_env as lmdb_env

    monkeypatch.setattr(lmdb_env, "PINNED_WAIT_S", 30.0)
    env, blobs = _full_store(tmp_path, make_kv)
    kept, evicted = blobs.keys(), blobs.evictions
    reader = _Reader(tmp_path / "pinned")
    threading.Timer(0.3, reader.close).start()
    new = make_kv(layers=2, heads=2, tokens=256, dim=16, seed=99)
    blobs.put("new", new)
    assert blobs.evictions - evicted == 2 and blobs.keys() == kept[2:] + ["new"]
    same_kv(blobs.get("new"), new)
    blobs.close()
    env.close()


def test_a_killed_readers_slot_is_dropped_before_anything_is_evicted(tmp_path, make_kv, same_kv):
    import signal

    env, blobs = _full_store(tmp_path, make_kv)
    reader = _Reader(tmp_path / "pinned")
    kept, evicted = blobs.keys(), blobs.evictions
    for key in kept[:2]:  # room made while the reader's snapshot pins it
        blobs.delete(key)
    env.settle()
    reader.proc.send_signal(signal.SIGKILL)  # its reader slot stays behind, pinning the pages
    reader.proc.wait(10)
    new = make_kv(layers=2, heads=2, tokens=256, dim=16, seed=99)
    blobs.put("new", new)
    assert blobs.evictions == evicted and blobs.keys() == kept[2:] + ["new"]
    same_kv(blobs.get("new"), new)
    blobs.close()
    env.close()


def test_a_reader_that_starts_during_the_eviction_stops_it_too(tmp_path, make_kv, monkeypatch):
    # A reader begun after the first eviction's commit pins that eviction's pages and every later one's.
    import store.lmdb_env as lmdb_env

    monkeypatch.setattr(lmdb_env, "PINNED_WAIT_S", 0.05)
    env, blobs = _full_store(tmp_path, make_kv)
    kept, readers = blobs.keys(), []
    blobs.on_evict = lambda key: readers.append(_Reader(tmp_path / "pinned")) if not readers else None
    with pytest.raises(StoreBusyError, match="no room for new: pid"):
        blobs.put("new", make_kv(layers=2, heads=2, tokens=256, dim=16, seed=99))
    assert blobs.keys() == kept[2:]  # one round for ~1.25x the document, not emptied
    readers[0].close()
    blobs.close()
    env.close()


def test_a_text_write_that_reclaims_space_stops_at_a_pinning_reader(tmp_path, make_kv, monkeypatch):
    # Writes that reclaim through the environment (document texts, the embedded index) evicted down to an empty store.
    import store.lmdb_env as lmdb_env

    monkeypatch.setattr(lmdb_env, "PINNED_WAIT_S", 0.05)
    env, blobs = _full_store(tmp_path, make_kv)
    kept = blobs.keys()
    reader = _Reader(tmp_path / "pinned")
    db = env.db(b"some_texts")
    with pytest.raises(StoreBusyError, match="no room for this write: pid"):
        env.write(lambda txn: txn.put(b"t", b"x" * 150_000, db=db))
    assert blobs.keys() == kept[1:]  # one round (a 16th of the map: one document), not emptied
    reader.close()
    env.write(lambda txn: txn.put(b"t", b"x" * 150_000, db=db))  # the reader gone: it fits in the space freed
    blobs.close()
    env.close()
