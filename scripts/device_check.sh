#!/usr/bin/env bash
# The one prepared GPU check. From the repository root on a CUDA machine:  OUT=/some/dir bash scripts/device_check.sh
# Everything lands under $OUT (default ./device_out): the environment, the CUDA tests run under PyTorch's CUDA
# sanitizer with sync-debug "error" on the engine's hot path, bench memory on CUDA against the planner, a short
# benchmark of torch vs superoffload, a quick calibration and the cost model's validation against those runs.
# Uses .venv when scripts/bootstrap.sh can make one, else the machine's python3 with the checkout on PYTHONPATH
# (a machine without network: carry missing wheels, e.g. jsonschema, as docs/results.md describes).
# At most 8 files come back from a lent machine: this writes 8 (summary.txt holds the environment and every log
# line). On a machine without a package index: OFFLINE=1 (and the wheels it lacks in .whl). It took 345 s on an
# H200 (2026-12-04, before the sanitizer run was narrowed); give the call a limit of 540 s.
set -uo pipefail
OUT=${OUT:-device_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
LOG=$(mktemp)
# A machine that cannot reach a package index (OFFLINE=1) skips the bootstrap, whose pip would spend minutes
# retrying, and installs the wheels carried in $WHEELS (default .whl) beside the machine's own torch.
WHEELS=${WHEELS:-.whl}
if [ "${OFFLINE:-0}" != 1 ] && timeout 300 scripts/bootstrap.sh bench,test >"$LOG" 2>&1; then
  PY=.venv/bin/python
else
  PY=python3
  if compgen -G "$WHEELS/*.whl" >/dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$WHEELS"/*.whl >>"$LOG" 2>&1
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
  fi
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
  echo "no bootstrap (OFFLINE=${OFFLINE:-0} or it failed): $(command -v python3), PYTHONPATH=$PYTHONPATH" >>"$OUT/summary.txt"
  timeout 120 $PY -m grace_adam.build >>"$LOG" 2>&1 || echo "grace_adam build failed (torch fallback)" >>"$OUT/summary.txt"
fi
SO="$PY -m superoffload"
{ date -u; nvidia-smi -q 2>/dev/null | head -30
  $PY -c 'import torch; print(torch.__version__, torch.cuda.get_device_name())'; tail -5 "$LOG"; } >>"$OUT/summary.txt" 2>&1
# 1. the CUDA tests, then the hot path again under torch's CUDA sanitizer (stream ordering checked for every
# kernel) with sync-debug "error": the whole suite under the sanitizer outran 200 s on an H200 (2026-12-04),
# so only the speculation and overlap tests run there. One file: at most 8 come back from a lent machine.
timeout 150 $PY -m pytest -q -rfE --timeout=90 -m cuda tests -p no:cacheprovider >"$OUT/cuda_tests.txt" 2>&1
echo "cuda tests rc=$?" | tee -a "$OUT/summary.txt"
tail -5 "$OUT/cuda_tests.txt" | tee -a "$OUT/summary.txt"
echo "--- under TORCH_CUDA_SANITIZER=1, SUPEROFFLOAD_CUDA_SYNC_DEBUG=error" >>"$OUT/cuda_tests.txt"
TORCH_CUDA_SANITIZER=1 SUPEROFFLOAD_CUDA_SYNC_DEBUG=error timeout 150 $PY -m pytest -q -rfE --timeout=120 -m cuda \
  tests/engine/test_cuda.py -k "speculation or overlap" -p no:cacheprovider >>"$OUT/cuda_tests.txt" 2>&1
echo "cuda tests under the sanitizer rc=$?" | tee -a "$OUT/summary.txt"
tail -3 "$OUT/cuda_tests.txt" | tee -a "$OUT/summary.txt"
# 2. device memory: measured (the allocator and the engine's ledger) vs the planner, as JSON
for m in "gpt-small 256 2" "gpt-1b 1024 2"; do
  set -- $m
  timeout 60 $SO bench memory --model "$1" --seq "$2" --batch "$3" --device cuda --checkpointing \
    --out "$OUT/memory_$1.json" >>"$OUT/summary.txt" 2>&1
done
# 3. a short benchmark, a quick calibration, and the cost model validated against the two runs
for sys in torch superoffload; do
  timeout 75 $SO bench run --system $sys --model gpt-1b --seq 1024 --batch 4 --dtype bf16 \
    --steps 8 --warmup 3 --checkpointing --no-progress --out "$OUT/run_$sys.json" >>"$OUT/summary.txt" 2>&1
done
timeout 60 $SO calibrate --quick --workloads gpt-1b:1024:4 --dtype bf16 --out "$OUT/profile.json" \
  >>"$OUT/summary.txt" 2>&1
timeout 30 $SO validate "$OUT" --hardware "$OUT/profile.json" --out "$OUT/validation.json" >>"$OUT/summary.txt" 2>&1
cat "$OUT/summary.txt"
