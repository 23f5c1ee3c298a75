"""The runner's own CPU kernels (``csrc/cpu_kernels.cpp``), compiled once per machine.

What a decode step of a small model spends is reading weights and the fixed cost of many small operations,
and torch's generic kernels leave both on the table there (BENCHMARKS.md, issue 24): the C++ file holds the
Q4 x Q8 and Q8 x Q8 products of :mod:`.q4q8`, one-token grouped-query attention over bfloat16 KV pieces
(:mod:`.decode_attention`) and float32 RMSNorm, written with AVX512 intrinsics (VNNI for the integer dots).

:func:`torch.utils.cpp_extension.load` compiles them with g++ on first use (~30-60 s; cached under
``$TORCH_EXTENSIONS_DIR``, default ``~/.cache/torch_extensions``), only where the CPU has AVX512F/BW and VNNI;
elsewhere, or without a compiler, :func:`kernels` is None (the reason logged once) and every caller keeps
torch's kernels. ``KVLINK_RAG_CPU_KERNELS=0`` turns them off.
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)
_FLAGS = ["-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mf16c", "-mfma", "-fopenmp"]
NEEDED = {"avx512f", "avx512bw", "avx512vl", "avx512_vnni", "f16c", "fma"}


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.split(":", 1)[-1].split())


@functools.cache
def kernels():
    """The compiled module, or None (turned off, a CPU without AVX512-VNNI, or no compiler)."""
    if os.environ.get("KVLINK_RAG_CPU_KERNELS", "1") == "0":
        return None
    missing = NEEDED - _cpu_flags()
    if missing:
        log.info("the runner's CPU kernels are not used: the CPU lacks %s", ", ".join(sorted(missing)))
        return None
    from torch.utils.cpp_extension import load

    src = Path(__file__).with_name("csrc") / "cpu_kernels.cpp"
    try:
        return load(name="kvlink_cpu_kernels", sources=[str(src)], extra_cflags=_FLAGS,
                    extra_ldflags=["-fopenmp"], verbose=False)
    except Exception as e:  # noqa: BLE001 - no compiler / ninja: callers keep torch's kernels
        log.warning("the runner's CPU kernels could not be built (%s); torch's kernels are used", str(e)[:200])
        return None


def available() -> bool:
    """Whether the kernels run on this machine (builds them on the first call)."""
    return kernels() is not None
