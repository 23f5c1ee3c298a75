"""The runner's own CPU kernels (``csrc/cpu_kernels.cpp``), compiled once per machine.

What a decode step of a small model spends is reading weights and the fixed cost of many small operations,
and torch's generic kernels leave both on the table there (BENCHMARKS.md, issue 24): the C++ file holds the
Q4 x Q8 and Q8 x Q8 products of :mod:`.q4q8`, one-token grouped-query attention over bfloat16 or float32
KV pieces (:mod:`.decode_attention`), float32 RMSNorm and a decoder layer's two halves around attention for
decode rows and their K/V writes and attention as one call per layer (``csrc/decode_layer.cpp``,
``csrc/decode_rows.cpp``, :mod:`.fused_decode`), with vector intrinsics per instruction set:
``csrc/isa_avx512.h`` (AVX512F/BW/VL + VNNI: vpdpbusd for the integer dots) or ``csrc/isa_avx2.h`` (AVX2 +
FMA + F16C: llama.cpp's vpmaddubsw / vpmaddwd route), the same packed layouts and formulas in both.

:func:`torch.utils.cpp_extension.load` compiles them with g++ on first use (~30-60 s; cached under
``$TORCH_EXTENSIONS_DIR``, default ``~/.cache/torch_extensions``, under a name carrying the instruction set and
a hash of ``csrc/`` and the compiler flags, so an edited header rebuilds), for the best of the two sets the
CPU has; on a CPU with neither, or without a compiler, :func:`kernels` is None (the reason logged once) and
every caller keeps torch's kernels. ``KVLINK_RAG_CPU_KERNELS=0`` turns them off; ``KVLINK_RAG_CPU_KERNELS=avx2``
forces the AVX2 build on an AVX512 CPU (to compare the two).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import sys
from pathlib import Path

log = logging.getLogger(__name__)
CSRC = Path(__file__).with_name("csrc")
# instruction set -> (CPU flags it needs, compiler flags), best first
ISAS = {
    "avx512": ({"avx512f", "avx512bw", "avx512vl", "avx512_vnni", "f16c", "fma"},
               ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mf16c", "-mfma"]),
    "avx2": ({"avx2", "f16c", "fma"}, ["-mavx2", "-mf16c", "-mfma"]),
}
# instruction set -> {CPU flag: compiler flag} of extensions used where the CPU has them (prefill_attention.cpp
# compiles its kernel only under -mavx512bf16; without it the module reports it unavailable)
OPTIONAL = {"avx512": {"avx512_bf16": "-mavx512bf16"}}


def cpu_flags() -> set[str]:
    """This CPU's feature flags as Linux names them (``/proc/cpuinfo``: ``avx2``, ``avx512_bf16``, ``amx_bf16``, ...);
    empty where that file cannot be read."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.split(":", 1)[-1].split())


def isa() -> str | None:
    """The instruction set the kernels are built for here (``'avx512'`` or ``'avx2'``), None if neither."""
    wanted = os.environ.get("KVLINK_RAG_CPU_KERNELS", "1")
    if wanted == "0":
        return None
    flags = cpu_flags()
    for name, (needed, _) in ISAS.items():
        if wanted in ("1", name) and needed <= flags:
            return name
    return None


# -ffp-contract=off: g++ would fuse the scalar code's a * b + c into one FMA under -mfma (its default is
# -ffp-contract=fast), rounding once where torch's elementwise operations round twice; the fused decode halves must
# round as the general path does (csrc/decode_layer.cpp). The vector code's FMAs are intrinsics, unaffected.
CFLAGS = ["-O3", "-fopenmp", "-ffp-contract=off"]


def _source_hash(flags: list[str]) -> str:
    """Of ``csrc/``, the compiler flags, and where the sources and the interpreter lie: an edited source or a
    changed flag builds a new module, and each checkout and venv builds its own (torch's ``build.ninja`` holds
    their absolute paths, so two checkouts sharing one build folder rewrote it in turn and each load rebuilt the
    module, ~40 s a process, while the other waited on the build lock)."""
    digest = hashlib.sha256(" ".join(flags).encode())
    digest.update(f"{CSRC.resolve()}|{sys.prefix}".encode())
    for path in sorted(CSRC.iterdir()):
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()[:10]


@functools.cache
def kernels():
    """The compiled module, or None (turned off, a CPU with neither AVX2 nor AVX512-VNNI, or no compiler)."""
    name = isa()
    if name is None:
        log.info("the runner's CPU kernels are not used (turned off, or the CPU has neither AVX2+FMA+F16C nor "
                 "AVX512-VNNI)")
        return None
    from torch.utils.cpp_extension import load

    try:
        cpu = cpu_flags()
        flags = [*CFLAGS, *ISAS[name][1], *(f for flag, f in OPTIONAL.get(name, {}).items() if flag in cpu)]
        return load(name=f"kvlink_cpu_kernels_{name}_{_source_hash(flags)}", sources=[str(p) for p in sorted(CSRC.glob("*.cpp"))],
                    extra_cflags=flags, extra_ldflags=["-fopenmp"], verbose=False)
    except Exception as e:  # noqa: BLE001 - no compiler / ninja: callers keep torch's kernels
        log.warning("the runner's CPU kernels could not be built (%s); torch's kernels are used", str(e)[:200])
        return None


def available() -> bool:
    """Whether the kernels run on this machine (builds them on the first call)."""
    return kernels() is not None
