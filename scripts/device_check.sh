#!/usr/bin/env bash
# The one prepared GPU check: CUDA tests + short benchmarks, results under $OUT (default ./device_out).
# Run on a CUDA machine from the repository root:  OUT=/some/dir bash scripts/device_check.sh
set -uo pipefail
OUT=${OUT:-device_out}
mkdir -p "$OUT"
scripts/bootstrap.sh bench,test >"$OUT/bootstrap.log" 2>&1 || { echo "bootstrap failed"; tail -20 "$OUT/bootstrap.log"; exit 1; }
PY=.venv/bin/python
{ date -u; nvidia-smi -q 2>/dev/null | head -40; $PY -c 'import torch; print(torch.__version__, torch.cuda.get_device_name())'; } >"$OUT/env.txt" 2>&1
timeout 240 $PY -m pytest -q -m cuda tests -p no:cacheprovider >"$OUT/cuda_tests.txt" 2>&1; echo "cuda tests rc=$?" | tee -a "$OUT/summary.txt"
tail -3 "$OUT/cuda_tests.txt" | tee -a "$OUT/summary.txt"
timeout 120 .venv/bin/superoffload bench cast --sizes 1M,16M,64M,256M,1G --repeats 5 --out "$OUT/cast.json" >>"$OUT/summary.txt" 2>&1
for sys in torch superoffload; do
  timeout 120 .venv/bin/superoffload bench run --system $sys --model gpt-1b --seq 1024 --batch 4 --dtype bf16 \
    --steps 8 --warmup 3 --checkpointing --no-progress --out "$OUT/run_$sys.json" >>"$OUT/summary.txt" 2>&1
done
timeout 90 .venv/bin/superoffload calibrate --quick --workloads gpt-1b:1024:4 --dtype bf16 --out "$OUT/profile.json" \
  >>"$OUT/summary.txt" 2>&1
# the cost model against the two runs above (issue 8's H200 validation; quick profile: no system machinery)
timeout 60 .venv/bin/superoffload validate "$OUT" --hardware "$OUT/profile.json" --out "$OUT/validation.json" \
  >>"$OUT/summary.txt" 2>&1
cat "$OUT/summary.txt"
