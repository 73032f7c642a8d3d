#!/usr/bin/env bash
# One prepared GPU check (issue 17), under 8 minutes on one H100/H200, printing one table:
#   MFU of gpt_1b bf16 ZeRO-2 (goal >= 45%), the job / a bare DeepSpeed loop (<= 1.03), probes at
#   the default interval and at every step / off (<= 1.02, <= 1.15), fp16 with loss scaling, a
#   planted NaN caught at its step and named, peak memory / diag/memory.py's estimate.
#
#   bash bench/gpu_check.sh          # on a GPU node (PYTHON=... to pick the interpreter)
#   bash bench/gpu_check.sh --cpu    # tiny sizes on a CPU: CI proves the script works this way
#
# Each side runs in a process of its own (its peak memory is its own, a 1B engine is gone
# before the next is built) with a time limit; a side that fails shows as "no result".
set -uo pipefail
cd "$(dirname "$0")/.."

size=gpu
if [[ "${1:-}" == "--cpu" ]]; then
    size=cpu
elif [[ $# -gt 0 ]]; then
    echo "gpu_check.sh: unknown argument '$1': give nothing (a GPU) or --cpu" >&2
    exit 2
fi
PYTHON=${PYTHON:-python}
SIDE_LIMIT_S=${SIDE_LIMIT_S:-150}  # 7 sides: a stuck one cannot take the check past 8 minutes

out=$(mktemp -d -t hyprun-gpu-check-XXXXXX)
trap 'rm -rf "$out"' EXIT
export MLFLOW_TRACKING_URI="sqlite:///$out/mlflow.db"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

start=$(date +%s)
for side in bare off nan_check default every_step fp16 nan; do
    if ! timeout "$SIDE_LIMIT_S" "$PYTHON" -m bench.gpu_check measure "$side" --size "$size" \
        --out "$out" >"$out/$side.log" 2>&1; then
        echo "gpu_check: side '$side' failed; the end of its log:" >&2
        tail -n 20 "$out/$side.log" >&2
    fi
done
"$PYTHON" -m bench.gpu_check table "$out" --size "$size" --seconds "$(($(date +%s) - start))"
