# Two commands on a fresh machine: `make demo` (the main job) and `make test` (the suite).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# KVLINK_RAG_HOME holds every piece of state (converted model, caches, link tokens); default ~/.cache/kvlink-rag.
NQ ?= $(or $(KVLINK_RAG_NQ_PATH),../shared/data/nq-open-oracle-dev.jsonl.gz)

.PHONY: install demo test clean

$(BIN)/kvlink-rag: pyproject.toml
	@echo "creating $(VENV) and installing torch, transformers and kvlink-rag (~1.5 GB, about 2-4 min)..."
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch==2.13.0: pinned; where a local CPU wheel of it is on disk pip takes that, elsewhere it fetches it from PyPI.
	$(BIN)/pip install -q "torch==2.13.0"
	$(BIN)/pip install -q -e ".[dev]"
	@echo "compiling the model runner's CPU kernels (where the CPU has AVX2 or AVX512-VNNI; once per machine and kernel source, 1-3 min)..."
	$(BIN)/python -c "from kvlink_rag.runtime.cpu_kernels import available; print('CPU kernels:', 'built' if available() else 'not used on this CPU')"
	touch $@
	@echo "installed $(BIN)/kvlink-rag"

install: $(BIN)/kvlink-rag

# the converted default model; fetched (and the message printed) only while it is missing
MODEL := $(or $(KVLINK_RAG_HOME),$(HOME)/.cache/kvlink-rag)/models/SmolLM2-135M-Instruct/model.safetensors

$(MODEL): | $(BIN)/kvlink-rag
	@echo "fetching and converting the model (~100 MB download, 30-80 s, 0.6 GB under KVLINK_RAG_HOME)..."
	$(BIN)/kvlink-rag model fetch

demo: install $(MODEL)
	@echo "precomputing the 50 documents of 5 NQ questions (~30 s, unless cached by an earlier run), then answering each question with full prefill and with linked caches (~1 min)..."
	$(BIN)/kvlink-rag demo --nq $(NQ) --questions 5 --docs 10

test: install $(MODEL)
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) *.egg-info
