# Two entry points: `make demo` (set up, then run kvpool on bundled presets)
# and `make test` (set up, then lint, type-check and run the whole suite).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint typecheck unit bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml requirements-pins.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c requirements-pins.txt torch==2.13.0
	$(BIN)/pip install -q -c requirements-pins.txt -e '.[dev,engine,sim]'
	touch $(STAMP)

demo: setup
	$(BIN)/kvpool inspect gemma-4-26b-a4b
	$(BIN)/kvpool inspect deepseek-v4-flash
	@echo; echo "== Gemma 4 on 60 GiB: default split (reference request) vs sizing from avg_seq_len = max_seq_len"
	$(BIN)/kvpool plan gemma-4-26b-a4b --kv-dtype fp8 --kv-memory 60GiB --max-seq-len 32768
	$(BIN)/kvpool plan gemma-4-26b-a4b --kv-dtype fp8 --kv-memory 60GiB --max-seq-len 32768 --avg-seq-len 32768
	@echo; echo "== DeepSeek-V4 at 1M context on 2 GiB: infeasible (exit 2, one line), then --fit shrinks its longest request"
	-$(BIN)/kvpool plan deepseek-v4-flash --kv-dtype fp8 --kv-memory 2GiB --max-seq-len 1048576 --max-batch-size 16
	$(BIN)/kvpool plan deepseek-v4-flash --kv-dtype fp8 --kv-memory 2GiB --max-seq-len 1048576 --max-batch-size 16 --fit

lint: setup
	$(BIN)/ruff check src tests benchmarks

typecheck: setup
	$(BIN)/mypy

unit: setup
	$(BIN)/pytest

test: lint typecheck unit

bench: setup
	for b in benchmarks/bench_*.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
