"""LMDB's reader table: which read transactions, in any process, pin the pages a write freed.

LMDB reuses a page freed by write transaction T only once no live reader's snapshot is older than T (MVCC), so
space evicted while such a reader is open cannot be written, and evicting more frees only pages it pins too.
"""

from __future__ import annotations

import time

import lmdb

PINNED_WAIT_S = 0.5  # how long a write waits for a reader pinning the space freed for it before giving up


def readers_before(env: lmdb.Environment, txnid: int, wait_s: float = 0.0) -> list[int]:
    """Process ids of the live read transactions whose snapshot is ``txnid`` or older (they pin the pages freed by
    the write transactions after ``txnid``), after waiting up to ``wait_s`` seconds for them to end. Slots of
    killed processes are cleared first; a reader of this process counts too (its own pid)."""
    deadline = time.monotonic() + wait_s
    while True:
        env.reader_check()
        rows = [line.split() for line in env.readers().splitlines()[1:]]  # "pid thread txnid", txnid "-" when idle
        pids = [int(r[0]) for r in rows if len(r) == 3 and r[2].isdigit() and int(r[2]) <= txnid]
        if not pids or time.monotonic() >= deadline:
            return pids
        time.sleep(0.01)
