"""A real Celery worker (solo pool) that stops mid-precompute to be killed: after the model encoded the
document and before the cache is written, it writes the file ``$KVLINK_TEST_PAUSE_MARKER`` and sleeps.

Run as ``python tests/workers/paused_worker.py`` with the usual worker environment (fault injection for
the SIGKILL test; everything else is the production worker).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from store.blobs.lmdb import LmdbBlobStore
from workers.celery_app import app

_put = LmdbBlobStore.put


def _paused_put(self, key, kv, *args, **kwargs):
    Path(os.environ["KVLINK_TEST_PAUSE_MARKER"]).write_text(key)
    time.sleep(3600)
    return _put(self, key, kv, *args, **kwargs)


if __name__ == "__main__":
    LmdbBlobStore.put = _paused_put
    sys.exit(app.worker_main(["worker", "-P", "solo", "-l", "INFO", "-n", "paused@%h", "--without-gossip",
                              "--without-mingle", "--without-heartbeat"]))
