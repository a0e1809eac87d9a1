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
