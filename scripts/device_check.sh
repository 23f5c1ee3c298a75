#!/usr/bin/env bash
# The one prepared GPU check of issue 24, for a lent device machine (/work/.library/device), run from the repo
# root there: exactness on CUDA, verify (batched vs one-at-a-time), bench-engine and bench --device cuda at
# 1k-8k contexts, 1 and 16 clients. Outputs land under $OUT (the device tool brings them back).
#
# Nothing there can be downloaded and at most 64 MiB travel per call, so the inputs come in three calls while
# the machine stays warm (made here by `scripts/device_check.sh pack`, into git-ignored folders):
#   call 1: carry .whl .dev1   -> `scripts/device_check.sh exact`  (wheels, NQ data, GGUF part a; CUDA exactness)
#   call 2: carry .dev2        -> `scripts/device_check.sh stash`  (GGUF part b)
#   call 3: carry .dev3        -> `scripts/device_check.sh main`   (GGUF part c; convert, scheduler tests on
#                                                                  CUDA, verify, bench-engine, bench)
# The machine's own python3 (torch with CUDA) runs the code; the project's missing packages are the wheels.
set -uo pipefail
OUT=${OUT:-/tmp/device-out}
STASH=/tmp/kvlink-device
GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
SRC_GGUF=${KVLINK_RAG_HOME:-$HOME/.cache/kvlink-rag}/models/downloads/$GGUF  # pack: read here, before the exports
SRC_NQ=${KVLINK_RAG_NQ_PATH:-../shared/data/nq-open-oracle-dev.jsonl.gz}
mkdir -p "$OUT" "$STASH"
export KVLINK_RAG_HOME=$STASH/home KVLINK_RAG_NQ_PATH=$STASH/nq.jsonl.gz KVLINK_RAG_CPU_KERNELS=0
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 KVLINK_RAG_TORCH_THREADS=8
step() { echo "== $1 ($(date +%T))"; }
stash() { for d in "$@"; do [ -d "$d" ] && cp -r "$d"/. "$STASH"/; done; ls -la "$STASH"; }
KV="python3 -m cli"

case "${1:-}" in
pack)  # here: wheels for the device's Python 3.12 (see the device README) and the GGUF in three parts
  src=$SRC_GGUF
  mkdir -p .whl .dev1 .dev2 .dev3
  # what the device's image lacks (seen on 2026-12-04: torch 2.11+cu130, Python 3.12); versions as in .venv
  for p in transformers huggingface_hub httpx2 httpcore2 truststore kernels tomlkit gguf lmdb pydantic \
           pydantic_core pydantic-settings python-dotenv annotated-types typing-inspection simhash fastapi \
           starlette sse-starlette opentelemetry-api redis uvicorn; do
    v=$(.venv/bin/pip show "$p" 2>/dev/null | sed -n 's/^Version: //p')
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      -d .whl "$p${v:+==$v}" 2>&1 | grep -v WARNING
  done
  cp "$SRC_NQ" .dev1/nq.jsonl.gz
  head -c 25500000 "$src" > .dev1/gguf.a
  tail -c +25500001 "$src" | head -c 49500000 > .dev2/gguf.b
  tail -c +75000001 "$src" > .dev3/gguf.c
  sha256sum "$src" | cut -d' ' -f1 > .dev3/gguf.sha256
  du -sh .whl .dev1 .dev2 .dev3
  ;;
exact)
  stash .dev1
  step "wheels into /tmp/site"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  nvidia-smi -L
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0), 'transformers', transformers.__version__)"
  python3 -c "import cli.main, api.main, bench.run, bench.serving, bench.engine, kvlink_rag.runtime.scheduler; print('imports ok')" 2>&1 | tail -3
  step "exactness on CUDA (float32, TF32 off: the runner against the CPU and transformers on CUDA)"
  timeout 240 python3 -m pytest -q -p no:cacheprovider tests/kvlink_rag/test_cuda_exact.py 2>&1 | tail -15 | tee "$OUT/exact.txt"
  ;;
stash)
  stash .dev2
  ;;
main)
  stash .dev3
  step "join and convert the GGUF"
  mkdir -p "$KVLINK_RAG_HOME/models/downloads"
  cat "$STASH/gguf.a" "$STASH/gguf.b" "$STASH/gguf.c" > "$KVLINK_RAG_HOME/models/downloads/$GGUF"
  echo "$(cat "$STASH/gguf.sha256")  $KVLINK_RAG_HOME/models/downloads/$GGUF" | sha256sum -c - || exit 1
  timeout 110 $KV model fetch 2>&1 | tail -3
  step "scheduler, block pool and reuse tests with the tiny engine on CUDA (batched = one at a time)"
  KVLINK_RAG_TEST_ENGINE_DEVICE=cuda timeout 90 python3 -m pytest -q -p no:cacheprovider \
    tests/kvlink_rag/runtime/test_scheduler.py tests/kvlink_rag/runtime/test_scheduler_reuse.py \
    tests/kvlink_rag/runtime/test_scheduler_pool.py 2>&1 | tail -15 | tee "$OUT/scheduler.txt"
  step "verify on CUDA (float32)"
  KVLINK_RAG_DEVICE=cuda KVLINK_RAG_COMPUTE_DTYPE=float32 timeout 80 $KV verify --questions 8 --docs 10 \
    --json "$OUT/verify.json" 2>&1 | tail -8 | tee "$OUT/verify.txt"
  step "engine bench on CUDA (bfloat16; the runner against transformers eager)"
  KVLINK_RAG_DEVICE=cuda timeout 70 $KV bench-engine --formats native --repeats 2 \
    --json "$OUT/engine.json" 2>&1 | tail -20 | tee "$OUT/engine.md"
  step "bench --device cuda: TTFT at 1k-8k contexts"
  KVLINK_RAG_DEVICE=cuda timeout 90 $KV bench --device cuda --suites ttft --lengths 1000,2000,4000,8000 \
    --clients '' --repeats 2 --json "$OUT/ttft.json" 2>&1 | tail -30 | tee "$OUT/ttft.md"
  step "bench --device cuda: 1 and 16 clients (the serving suite)"
  KVLINK_RAG_DEVICE=cuda timeout 240 $KV bench --device cuda --suites serving --clients 1,16 \
    --json "$OUT/serving.json" 2>&1 | tail -40 | tee "$OUT/serving.md"
  ;;
*) echo "usage: scripts/device_check.sh pack|exact|stash|main" >&2; exit 2 ;;
esac
step "done"
