"""The shared LMDB environment: one per folder, map growth, resizes by other processes, full maps."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from store.lmdb_env import StoreFullError, open_env

REPO = Path(__file__).resolve().parents[2]


def test_one_env_per_folder(tmp_path):
    a = open_env(tmp_path / "s", map_size=1 << 20)
    assert open_env(tmp_path / "s") is a
    assert open_env(str(tmp_path / "s" / ".." / "s"), max_map_size=1 << 40) is a and a.max_map_size == 1 << 40
    a.close()
    b = open_env(tmp_path / "s")
    assert b is not a
    b.close()


def test_grow_doubles_up_to_the_limit_then_raises(tmp_path):
    env = open_env(tmp_path / "s", map_size=128 << 10, max_map_size=512 << 10)
    db = env.db(b"t")
    for i in range(6):  # 6 x 64 KiB values: needs more than 256 KiB
        env.write(lambda txn, i=i: txn.put(b"k%d" % i, bytes(64 << 10), db=db))
    assert env.map_size == 512 << 10 and env.grow_count == 2
    with pytest.raises(StoreFullError):
        env.write(lambda txn: txn.put(b"big", bytes(600 << 10), db=db))
    with env.read() as txn:  # the failed write left nothing behind
        assert txn.get(b"big", db=db) is None and bytes(txn.get(b"k5", db=db)) == bytes(64 << 10)
    env.close()


def test_reclaimer_is_asked_before_giving_up(tmp_path):
    env = open_env(tmp_path / "s", map_size=256 << 10, max_map_size=256 << 10)
    db = env.db(b"t")
    for i in range(3):
        env.write(lambda txn, i=i: txn.put(b"k%d" % i, bytes(64 << 10), db=db))
    asked = []
    victims = [b"k0", b"k1", b"k2"]

    def reclaim(wanted: int) -> int:  # frees one 64 KiB value per call, like BlobStore.evict
        asked.append(wanted)
        if not victims:
            return 0
        key = victims.pop(0)
        env.write(lambda txn: txn.delete(key, db=db), reclaim=False)
        return 64 << 10

    env.add_reclaimer(reclaim)
    env.write(lambda txn: txn.put(b"new", bytes(60 << 10), db=db))
    # Asked once for a sixteenth of the map; k0's pages, freed and settled, took the new value.
    assert asked == [16 << 10]
    with env.read() as txn:
        assert txn.get(b"k0", db=db) is None and txn.get(b"k1", db=db) is not None
        assert txn.get(b"new", db=db) is not None
    env.remove_reclaimer(reclaim)
    victims.clear()
    with pytest.raises(StoreFullError):  # nothing left to reclaim
        env.write(lambda txn: txn.put(b"huge", bytes(300 << 10), db=db))
    env.close()


def test_map_grown_by_another_process_is_adopted(tmp_path):
    env = open_env(tmp_path / "s", map_size=256 << 10, max_map_size=64 << 20)
    db = env.db(b"t")
    env.write(lambda txn: txn.put(b"mine", b"1", db=db))
    child = textwrap.dedent(
        f"""
        from store.lmdb_env import open_env
        env = open_env({str(tmp_path / "s")!r}, map_size=256 << 10, max_map_size=64 << 20)
        db = env.db(b"t")
        for i in range(16):
            env.write(lambda txn, i=i: txn.put(b"c%d" % i, bytes(256 << 10), db=db))
        print(env.map_size)
        """
    )
    pyenv = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, env=pyenv, check=True)
    grown = int(out.stdout)
    assert grown >= 4 << 20
    with env.read() as txn:
        assert bytes(txn.get(b"mine", db=db)) == b"1" and len(txn.get(b"c15", db=db)) == 256 << 10
    env.write(lambda txn: txn.put(b"after", b"2", db=db))
    assert env.map_size >= grown
    env.close()


def test_reads_continue_while_another_thread_grows_the_map(tmp_path):
    env = open_env(tmp_path / "s", map_size=128 << 10, max_map_size=64 << 20)
    db = env.db(b"t")
    env.write(lambda txn: txn.put(b"fixed", b"x" * 1000, db=db))
    errors: list[BaseException] = []
    stop = threading.Event()

    def reader():
        try:
            while not stop.is_set():
                with env.read() as txn:
                    assert bytes(txn.get(b"fixed", db=db)) == b"x" * 1000
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    for i in range(40):
        env.write(lambda txn, i=i: txn.put(b"w%d" % i, bytes(64 << 10), db=db))
    stop.set()
    for t in threads:
        t.join()
    assert errors == [] and env.grow_count >= 4
    env.close()


def test_a_store_limit_below_the_default_map_size_is_honoured(tmp_path, make_kv):
    from store.settings import StoreSettings
    from store.factory import open_store

    limit = 20_000_000  # under the 64 MiB the map used to start at (it then reached 63 MB on disk)
    store = open_store(StoreSettings(home=tmp_path, store_max_bytes=limit))
    env = store.blobs.env
    try:
        for i in range(40):  # ~1 MB each: twice the limit
            store.blobs.put(f"d{i:02d}", make_kv(layers=4, heads=4, tokens=1024, dim=16, seed=i))
        assert store.blobs.evictions > 0 and "d39" in store.blobs
        assert env.map_size <= limit and env.max_map_size == limit
        assert (env.path / "data.mdb").stat().st_size <= limit
    finally:
        env.close()


def test_the_map_reads_ahead(tmp_path):
    """Layer records are read whole through the map: with the kernel's readahead a cold page cache costs large
    reads rather than one 4 KiB fault after another (linked TTFT 524-1,782 ms without, 150-493 ms with, after the
    page cache was dropped; docs/bench/cold-cache-2026-12-08/)."""
    env = open_env(tmp_path / "db")
    try:
        assert env.env.flags()["readahead"] is True
    finally:
        env.close()
