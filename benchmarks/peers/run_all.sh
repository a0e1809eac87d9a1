#!/usr/bin/env bash
# Whole comparison, twice: each pass is one interleaved run of every peer (5 reps per
# configuration, fresh manager + gc.collect() per run and per timed phase), then one report over
# both passes, a compact summary (wall and CPU time) and kvpool's cProfile (outside the timing).
# Venvs and nano-vllm's minimal package are made by setup.sh (default root ~/.cache/peerbench).
# PASSES (default 2) and REPS (default 5) shorten a run; KV_BASE_SRC adds a baseline kvpool (orchestrate.py).
set -euo pipefail
cd "$(dirname "$0")"
R=${PEERBENCH:-$HOME/.cache/peerbench}
OUT=${OUT:-$R/results/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
export KV_SRC=${KV_SRC:-$(cd ../.. && pwd)/src}  # this checkout's kvpool
PASSES=${PASSES:-2}
files=()
for pass in $(seq 1 "$PASSES"); do
  echo "== pass $pass" >&2
  timeout 1800 python3 orchestrate.py "$OUT/pass$pass.json" --reps "${REPS:-5}"
  files+=("$OUT/pass$pass.json")
done
python3 report.py "${files[@]}" > "$OUT/report.md"
{ echo "## wall-clock medians (pass1 · pass2)"; python3 compact.py "${files[@]}"
  echo; echo "## CPU-time medians (pass1 · pass2)"; python3 compact.py "${files[@]}" @cpu
} > "$OUT/summary.md"
PYTHONPATH=$KV_SRC "${KV_PY:-$R/venv_kvpool/bin/python}" profile_kvpool.py 10 > "$OUT/profile_kvpool.txt"
echo "report: $OUT/report.md, $OUT/summary.md, $OUT/profile_kvpool.txt" >&2
