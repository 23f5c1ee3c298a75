"""The core's pure text rules the front ends apply, re-exported so that ``api/`` reaches the core only through
the service: which texts and JSON values can be stored and served (:mod:`kvlink_rag.encodable`, the kernel) and
the stop-string limits, normal form and cut (:mod:`kvlink_rag.decoding.stop_strings`). No model, no state, no
torch: a request body can be checked with these before anything is loaded.
"""

from __future__ import annotations

from kvlink_rag.decoding.stop_strings import MAX_STOP_CHARS, MAX_STOP_STRINGS, cut, normalize_stop
from kvlink_rag.encodable import find_unencodable, sanitised

__all__ = ["MAX_STOP_CHARS", "MAX_STOP_STRINGS", "cut", "find_unencodable", "normalize_stop", "sanitised"]
