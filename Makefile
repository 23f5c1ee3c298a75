# Two commands on a fresh machine: `make demo` (the main job) and `make test` (the suite).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# KVLINK_RAG_HOME holds every piece of state (converted model, caches, link tokens); default ~/.cache/kvlink-rag.
NQ ?= ../shared/data/nq-open-oracle-dev.jsonl.gz

.PHONY: install demo test clean

$(BIN)/kvlink-rag: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch==2.13.0 is the CPU build on this machine's disk; elsewhere pip fetches it from PyPI.
	$(BIN)/pip install -q "torch==2.13.0"
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

install: $(BIN)/kvlink-rag

demo: install
	$(BIN)/kvlink-rag demo --nq $(NQ) --questions 5 --docs 10

test: install
	$(BIN)/kvlink-rag model fetch
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) *.egg-info
