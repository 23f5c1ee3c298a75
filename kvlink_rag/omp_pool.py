"""Give back a thread's OpenMP workers, so that the thread running the model keeps its team spinning.

torch's CPU kernels (and oneDNN's and MKL's under them) parallelise with OpenMP: GNU libgomp in the PyPI wheels
for Linux. libgomp keeps a team of worker threads for every thread that has opened a parallel region, and once the
workers of all teams and the initial thread outnumber the CPUs it makes every team wait for work in futexes
(``gomp_throttled_spin_count_var``: 100 spins instead of ~300,000), so each of a forward's thousands of parallel
regions pays a wake-up. A process that loads the model on its main thread and then runs the forwards on the
scheduler's thread is in that state for good: on the 2-core development machine (AMD EPYC, torch 2.13, two
torch threads) a forward of 16 prefill tokens took 65-72 ms on the scheduler's thread against 52-58 ms on the main
thread, 256 tokens 295-332 against 229-294 ms, a 196 KB tensor copy 19 against 4 us. OpenMP 5.0's
``omp_pause_resource_all(omp_pause_soft)`` frees the calling thread's team (libgomp's ``gomp_pause_host``):
called on the main thread once the model was loaded, the copy on the scheduler's thread took 3.7 us again.

So every thread that ran model work and now hands the model to another gives its team back
(:func:`release_thread_pool`): the thread that built the scheduler, embedded precompute after each chunk, a
request's leave-one-out forwards, and the scheduler itself when it goes idle. A thread that opens a parallel
region again gets a new team (one ``pthread_create`` per worker, microseconds). Helper threads that copy KV beside
a forward (the store's layer readers, the memory-tier filler) never open one (:func:`serial_thread`).
"""

from __future__ import annotations

import ctypes
from functools import lru_cache

OMP_PAUSE_SOFT = 1  # omp_pause_resource_t: free the threads, keep what a later region re-creates cheaply
_RUNTIMES = ("libgomp", "libiomp5", "libomp.")  # OpenMP runtimes torch builds link (GNU, Intel, LLVM)


@lru_cache(maxsize=1)
def _runtime() -> ctypes.CDLL | None:
    """The OpenMP runtime loaded in this process (the one torch links), or None (none loaded, not Linux)."""
    import torch  # noqa: F401 - loads the OpenMP runtime torch links

    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if any(r in line for r in _RUNTIMES)}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


@lru_cache(maxsize=1)
def _pause():
    """``omp_pause_resource_all`` of :func:`_runtime`, or None (no runtime, or one older than OpenMP 5.0)."""
    lib = _runtime()
    fn = getattr(lib, "omp_pause_resource_all", None) if lib is not None else None  # an optional C symbol
    if fn is not None:
        fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
    return fn


def release_thread_pool() -> bool:
    """Free the OpenMP worker threads of the calling thread's team (none: nothing happens).

    Returns:
        Whether the runtime accepted the pause (False where no OpenMP 5.0 runtime is loaded). Never raises.
    Never call it from inside a parallel region (Python code never runs in one).
    """
    fn = _pause()
    return fn is not None and fn(OMP_PAUSE_SOFT) == 0


def serial_thread() -> bool:
    """Run the calling thread's torch CPU ops on this thread alone, never opening an OpenMP team (for helper
    threads beside the model's: copies of KV, tier fills). Only this thread changes: torch's setting for other
    threads (``torch.set_num_threads``, global) is left as it is.

    Returns:
        Whether the runtime took it (False without one). Never raises.
    """
    import torch

    lib = _runtime()
    if lib is None:
        return False
    torch.get_num_threads()  # torch's own per-thread set-up first, or its first parallel op would undo this
    lib.omp_set_num_threads(ctypes.c_int(1))
    return True
