"""How far a background reader may run ahead of a consumer's torch work (:func:`reader_depth`)."""

from __future__ import annotations

import os

import torch


def reader_depth() -> int:
    """Layers a background reader may run ahead of the consumer: 0 (read on the consumer's own thread) when the
    consumer's torch threads already take every core this process may run on, else 2.

    A reader thread beside a torch team that fills the cores takes one of them from it, and the team then waits
    at every barrier for its descheduled thread: on the 2-core development machine, linked TTFT from LMDB
    (10 documents, ~4k tokens) spent 194-339 ms loading and rotating with a reader 2 layers ahead against
    126-200 ms reading on the consumer's thread (4 runs each, alternating, scratch script).
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return 0 if torch.get_num_threads() >= cores else 2
