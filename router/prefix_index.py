"""An approximate prefix index per replica (as SGLang's router's radix tree of request text): the hashes of a
request text's prefixes at every ``block`` characters, remembered for the replica it was sent to, LRU-bounded.
Characters stand in for tokens (the router does not tokenize)."""

from __future__ import annotations

import threading
from collections import OrderedDict

import xxhash


def prefix_hashes(text: str, block: int) -> list[int]:
    """Hashes of ``text[:block]``, ``text[:2*block]``, ... (whole blocks only), each chained on the last."""
    out, h = [], 0
    for i in range(block, len(text) + 1, block):
        h = xxhash.xxh64_intdigest(text[i - block:i].encode("utf-8", "surrogatepass"), seed=h)
        out.append(h)
    return out


class PrefixIndex:
    """Which replica saw which request-text prefixes.

    Args:
        block: characters per block (the match granularity).
        max_blocks: blocks remembered per replica (least recently used forgotten).
    """

    def __init__(self, block: int = 32, max_blocks: int = 200_000):
        self.block, self.max_blocks = block, max_blocks
        self._seen: dict[str, OrderedDict[int, None]] = {}
        self._lock = threading.Lock()

    def match(self, text: str) -> dict[str, int]:
        """Replica id -> characters of ``text``'s longest prefix (whole blocks) sent to it before."""
        hashes = prefix_hashes(text, self.block)
        out = {}
        with self._lock:
            for replica, seen in self._seen.items():
                n = 0
                while n < len(hashes) and hashes[n] in seen:
                    n += 1
                out[replica] = n * self.block
        return out

    def insert(self, replica: str, text: str) -> None:
        """Remember ``text``'s prefixes for ``replica``."""
        with self._lock:
            seen = self._seen.setdefault(replica, OrderedDict())
            for h in prefix_hashes(text, self.block):
                seen[h] = None
                seen.move_to_end(h)
            while len(seen) > self.max_blocks:
                seen.popitem(last=False)

    def forget(self, replica: str) -> None:
        """Drop a replica that left the fleet."""
        with self._lock:
            self._seen.pop(replica, None)
