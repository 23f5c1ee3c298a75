"""One LMDB environment per store folder, shared by the blob store and the embedded index.

LMDB forbids opening the same environment twice in one process, so :func:`open_env` keeps one
:class:`LmdbEnv` per ``(process id, real path)``. Open it *after* forking (Celery prefork workers,
``multiprocessing``): a handle inherited across ``fork`` must not be used.

The map starts at ``map_size`` bytes and doubles on ``lmdb.MapFullError`` up to ``max_map_size``
(and never past the free disk space). When it cannot grow, the registered *reclaimers* (the blob
store's eviction) are asked to free space before :class:`StoreFullError` is raised.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import lmdb

from store.lmdb_readers import PINNED_WAIT_S, readers_before
from store.rw_lock import RWLock

MiB = 1 << 20
GiB = 1 << 30
DEFAULT_MAP_SIZE = 64 * MiB
DEFAULT_MAX_MAP_SIZE = 16 * GiB
DEFAULT_MAX_DBS = 16
_DISK_RESERVE = 64 * MiB  # bytes of free disk never claimed by map growth
_ENV_DB = b"env"  # bookkeeping of this module

T = TypeVar("T")
Reclaimer = Callable[[int], int]
"""``reclaim(bytes_wanted) -> bytes_freed``; must run its own write transactions."""


class StoreFullError(lmdb.MapFullError):
    """The map is at ``max_map_size`` (or the disk is full) and nothing more could be reclaimed."""


class StoreBusyError(StoreFullError):
    """No room *now*: the space evicted for a write is held by a read transaction older than the eviction (LMDB
    reuses freed pages only once no reader's snapshot needs them); retrying after that reader ends can succeed."""


class _ReclaimGuard(threading.local):
    """Per thread: a reclaimer of this environment is running (its own writes must not reclaim again)."""

    active = False


class LmdbEnv:
    """An LMDB environment with named sub-databases and a growable map.

    Transactions must be short and must not be held across a call that may write (the map can only
    be resized while no transaction of this process is open; :meth:`read` and :meth:`write` hold a
    shared lock that resizing waits for).

    Args:
        path: folder of the environment (created if missing).
        map_size: initial map size in bytes (at most ``max_map_size``; an existing larger map is kept).
        max_map_size: upper bound in bytes for growth: the data file never grows past it (documents are
            evicted instead), even when it is below ``map_size``.
        max_dbs: number of named sub-databases allowed.
        sync: fsync on every commit (crash-safe against power loss; process kills are safe either way).
    """

    def __init__(self, path: str | os.PathLike, map_size: int = DEFAULT_MAP_SIZE,
                 max_map_size: int = DEFAULT_MAX_MAP_SIZE, max_dbs: int = DEFAULT_MAX_DBS, sync: bool = True) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.max_map_size = int(max_map_size)
        # readahead: whole layer records are read through the map; from a cold page cache, linked TTFT 524-1,782 ms
        # without (MDB_NORDAHEAD) against 150-493 ms with (BENCHMARKS.md, docs/bench/cold-cache-2026-12-08/)
        self.env = lmdb.open(  # a limit below the default start size is honoured: start at the limit
            str(self.path), map_size=min(int(map_size), self.max_map_size), max_dbs=max_dbs, sync=sync,
            readahead=True, lock=True
        )
        self._dbs: dict[bytes, object] = {}
        self._lock = RWLock()
        self._write_mutex = threading.Lock()
        self._reclaimers: list[Reclaimer] = []
        self._reclaim_guard = _ReclaimGuard()
        self.grow_count = 0
        self.db(_ENV_DB)  # created now, not when the map is full

    # -- sub-databases -----------------------------------------------------------------------------
    def db(self, name: bytes):
        """Handle of the named sub-database ``name`` (created on first use)."""
        handle = self._dbs.get(name)
        if handle is None:
            with self._write_mutex, self._lock.shared():  # open_db writes
                handle = self.env.open_db(name, create=True)
            self._dbs[name] = handle
        return handle

    # -- transactions ------------------------------------------------------------------------------
    @contextmanager
    def read(self) -> Iterator[lmdb.Transaction]:
        """A read-only transaction; buffers returned with ``buffers=True`` die with it.

        Do not call :meth:`write` (or anything that writes) while it is open in the same thread.
        """
        while True:
            with self._lock.shared():
                try:
                    txn = self.env.begin(write=False, buffers=True)
                except lmdb.MapResizedError:
                    txn = None
                if txn is not None:
                    try:
                        yield txn
                    finally:
                        txn.abort()
                    return
            self._adopt_foreign_resize()

    def write(self, fn: Callable[[lmdb.Transaction], T], reclaim: bool = True, reclaim_bytes: int | None = None,
              what: str = "this write") -> T:
        """Run ``fn(txn)`` in one write transaction and commit it; atomic.

        ``fn`` may be re-run (after the map grew or space was reclaimed), so it must not have side
        effects outside ``txn``, and must not itself call :meth:`write`. When the map cannot grow and ``reclaim``,
        a killed process's reader slot is dropped first, then the reclaimers free ``reclaim_bytes`` (default a
        16th of the map) a round until it fits, while no reader pins what they freed (:meth:`pinned`).

        Raises:
            StoreFullError: the write does not fit even at ``max_map_size`` after reclaiming; StoreBusyError: a
                reader older than the reclaim holds the space it freed (the message names ``what``).
        """
        evicted_at = None  # the last transaction after this write's reclaimers freed space
        while True:
            with self._write_mutex:  # one writer per process: nobody waits on LMDB's lock while sharing
                outcome, result = self._write_once(fn)
            if outcome == "done":
                return result
            if outcome == "resized":
                self._adopt_foreign_resize()
                continue
            if outcome == "grown" or (reclaim and evicted_at is None and self.env.reader_check() > 0):
                continue  # grown; or a killed process's reader slot pinned freed pages: retry before reclaiming
            if reclaim and self.pinned(evicted_at, what):
                continue
            if reclaim and self._reclaim(reclaim_bytes or self.map_size // 16):
                evicted_at = self.last_txnid
                continue
            raise StoreFullError(f"LMDB map at {self.path} is full ({self.map_size} bytes, max {self.max_map_size})")

    def _write_once(self, fn):
        """One attempt: ``('done', result) | ('resized', None) | ('grown', None) | ('full', None)``."""
        self._lock.acquire_shared()
        shared = True
        try:
            try:
                txn = self.env.begin(write=True)
            except lmdb.MapResizedError:
                return "resized", None
            try:
                result = fn(txn)
                txn.commit()
                return "done", result
            except lmdb.MapFullError:
                # Abort with this process's readers drained: py-lmdb 3 waits for in-flight operations
                # on this path, which overlapping readers would otherwise starve.
                self._lock.release_shared()
                shared = False
                with self._lock.exclusive():
                    txn.abort()
                    return ("grown" if self._grow_locked() else "full"), None
            except BaseException:
                txn.abort()
                raise
        finally:
            if shared:
                self._lock.release_shared()

    # -- size management ---------------------------------------------------------------------------
    @property
    def map_size(self) -> int:
        """Current map size in bytes."""
        return int(self.env.info()["map_size"])

    @property
    def used_bytes(self) -> int:
        """Bytes of the map in use (high-water mark of pages, free pages included)."""
        return (int(self.env.info()["last_pgno"]) + 1) * int(self.env.stat()["psize"])

    @property
    def last_txnid(self) -> int:
        """The id of the last committed write transaction (a read transaction's snapshot is such an id)."""
        return int(self.env.info()["last_txnid"])

    def pinned(self, evicted_at: int | None, what: str) -> bool:
        """After space was freed up to transaction ``evicted_at`` and a write still did not fit: True when a reader
        older than that held the space and ended within ``PINNED_WAIT_S`` (retry as is), False when none did or
        nothing was freed yet (free more: the free space is fragmented). Raises StoreBusyError while that reader is
        open (evicting more would free only pages it pins too: a put once emptied a full store so, still failing).
        """
        if evicted_at is None or not readers_before(self.env, evicted_at):
            return False
        if pids := readers_before(self.env, evicted_at, PINNED_WAIT_S):
            raise StoreBusyError(f"no room for {what}: pid {pids[0]} reads a snapshot older than the space freed")
        self.settle()
        return True

    def grow(self) -> bool:
        """Double the map (capped by ``max_map_size`` and free disk); False when it cannot grow."""
        with self._write_mutex, self._lock.exclusive():
            return self._grow_locked()

    def _grow_locked(self) -> bool:
        """:meth:`grow` for a caller holding the exclusive lock."""
        current = self.map_size
        target = min(current * 2, self.max_map_size)
        data_file = self.path / "data.mdb"
        on_disk = data_file.stat().st_size if data_file.exists() else 0
        free = shutil.disk_usage(self.path).free - _DISK_RESERVE
        target = min(target, on_disk + max(free, 0))
        if target <= current:
            return False
        self.env.set_mapsize(target)
        self.grow_count += 1
        return True

    def add_reclaimer(self, fn: Reclaimer) -> None:
        """Register ``fn(bytes_wanted) -> bytes_freed``, called when the map is full and at its max."""
        self._reclaimers.append(fn)

    def remove_reclaimer(self, fn: Reclaimer) -> None:
        """Undo :meth:`add_reclaimer` (no error if ``fn`` was not registered)."""
        if fn in self._reclaimers:
            self._reclaimers.remove(fn)

    def _reclaim(self, wanted: int) -> bool:
        if self._reclaim_guard.active:
            return False  # a reclaimer's own write ran out of space: do not recurse
        self._reclaim_guard.active = True
        try:
            freed = any(fn(wanted) > 0 for fn in list(self._reclaimers))
        finally:
            self._reclaim_guard.active = False
        if freed:
            self.settle()
        return freed

    def settle(self) -> None:
        """Commit a tiny transaction so that pages freed by the last one become reusable.

        LMDB keeps the previous snapshot's pages until one more transaction commits, so a write right
        after a deleting transaction cannot use the space it freed. Best effort: a full map is ignored.
        """
        db = self.db(_ENV_DB)

        def tick(txn) -> None:
            n = txn.get(b"settle", db=db)
            txn.put(b"settle", str(int(bytes(n)) + 1 if n is not None else 1).encode(), db=db)

        with self._write_mutex:
            self._write_once(tick)

    def _adopt_foreign_resize(self) -> None:
        """Another process grew the map: take over its size."""
        with self._lock.exclusive():
            self.env.set_mapsize(0)

    def close(self) -> None:
        """Close the environment and forget it in the process registry, once no read is in progress: a buffer a
        reading thread still copies from (a layer stream, the memory-tier fill after one) lives in the map that
        closing unmaps. A read begun after the close raises ``lmdb.Error``."""
        with _registry_lock:
            for k, v in list(_registry.items()):
                if v is self:
                    del _registry[k]
        with self._lock.exclusive():
            self.env.close()


_registry: dict[tuple[int, str], LmdbEnv] = {}
_registry_lock = threading.Lock()


def open_env(path: str | os.PathLike, **kwargs) -> LmdbEnv:
    """The process-wide :class:`LmdbEnv` for ``path``, opened with ``kwargs`` on first use.

    Later calls for the same folder return the same object; their ``kwargs`` are ignored except
    that a larger ``max_map_size`` raises the limit.
    """
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    key = (os.getpid(), str(p.resolve()))
    with _registry_lock:
        env = _registry.get(key)
        if env is None:
            env = _registry[key] = LmdbEnv(p, **kwargs)
        elif kwargs.get("max_map_size", 0) > env.max_map_size:
            env.max_map_size = int(kwargs["max_map_size"])
        return env
