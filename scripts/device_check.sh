#!/usr/bin/env bash
# The one prepared GPU run: every peer side by side on a lent GPU, in one call of at most 8 minutes
# (docs/gpu_check.md). From the repository root:
#
#   DEVICE_CHECK_COMMIT=<sha> OUT=$OUT bash scripts/device_check.sh  # on the GPU machine (device tool: carry .whl)
#   REHEARSE=1 OUT=/tmp/rehearsal bash scripts/device_check.sh       # every step on this CPU (< 10 min on 2 cores)
#   REHEARSE=short OUT=/tmp/r bash scripts/device_check.sh           # CI's short form (tests/workflow/test_device_check.py)
#
# Steps, by value, each under a timeout inside its section's budget (the plan is printed first, in summary.txt):
#  a. setup: the wheels the machine lacks (scripts/gpu_wheels.sh fetches them into .whl) installed with
#     --no-index into a temporary target on PYTHONPATH; GraceAdam built; the environment and NVML identity (GPU,
#     driver, clocks, PCIe or C2C link); the GH200 prediction of every point. In the background: DeepSpeed's
#     CPU ops (a JIT build, timed), the paper's GH200 predictions;
#  b. the sweep: torch, superoffload as planned, zero_offload, fsdp_offload, ds_superoffload (zero_infinity if
#     time is left) on gpt-1b seq 1024 and gpt-5b seq 1024 and 4096, bf16, checkpointing, clipping at 1.0, 2
#     warm-up + 5 timed steps, weights drawn on the GPU (--init-device cuda), NVML telemetry in every record; a
#     point bench run refuses before building anything because it cannot fit (torch at gpt-5b on 80 GB) is kept
#     as a record "infeasible by design (not run)" (superoffload/harness/not_run.py), not as an error;
#  c. the engine's launch counters (benchmarks/launch_costs.py; "not run: absent" while the file is not in the
#     tree) and host Adam GB/s at 1, 4, 8, 16 threads for GraceAdam, torch and DeepSpeed (bench adam);
#  d. a full calibrate (a quick one when it did not finish), and the cost model validated against every run of
#     b (against the GPU's planner preset when neither finished);
#  e. the CUDA tests (pytest -m cuda, at most 90 s), then, if time is left, the speculation and overlap tests
#     under torch's CUDA sanitizer;
#  f. report.html (reports/gpu_check.py html): SuperOffload against each peer at each point, measured here,
#     beside the cost model's GH200 prediction of the same point, then the workflow's whole report.
# What comes back (7 files, each rewritten atomically after every step, so a run cut off returns what finished):
# summary.txt, report.html, comparison.json, records.tar.gz (every record, log and result file), env.json,
# cuda_tests.txt, log.txt. Give the device call a limit of 540 s: the script ends by 470 s (TOTAL_S) plus the
# wheels' install; the machine's start is not counted in the call's limit.
# REHEARSE=1: tiny models for gpt-1b / gpt-5b (gpt-tiny, gpt-small), superoffload on the simulated device
# (sim), the peers on the CPU, a quick calibrate, torch at gpt-100b as the infeasible point; REHEARSE=short:
# one tiny point, torch and superoffload, 2 + 5 steps, launch counters on a tiny model, no calibrate, host Adam,
# CUDA tests or paper predictions.
# DEVICE_CHECK_COMMIT=<sha> names the commit where the tree has no .git (the device machine's copy).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
MODE=${REHEARSE:-gpu}
case $MODE in
  gpu | 1 | short) ;;
  0 | "") MODE=gpu ;;
  *) echo "device_check: REHEARSE must be 1 or short (unset: the GPU run), got '$MODE'" >&2; exit 2 ;;
esac
OUT=${OUT:-device_out}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd) || exit 2
OURS="summary.txt report.html comparison.json records.tar.gz env.json cuda_tests.txt log.txt"
for f in "$OUT"/* "$OUT"/.[!.]*; do
  [ -e "$f" ] || continue
  case " $OURS " in *" $(basename "$f") "*) ;; *)
    echo "device_check: OUT=$OUT holds $(basename "$f"), which is not one of this script's files; use an" \
         "empty folder (at most 8 files come back from a lent machine)" >&2; exit 2 ;;
  esac
done
if [ -z "${PY:-}" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
WORK=$(mktemp -d "${TMPDIR:-/tmp}/device_check.XXXXXX") || exit 2
DS_PID= PRED_PID=
# background jobs still running at the end (each has its own timeout too) are stopped with their children
# and the work folder goes (everything in it is in records.tar.gz) unless KEEP_WORK=1
stop_bg() { for p in $DS_PID $PRED_PID; do pkill -TERM -P "$p" 2>/dev/null; kill "$p" 2>/dev/null; done; }
on_exit() { stop_bg; [ "${KEEP_WORK:-0}" = 1 ] || rm -rf "$WORK"; }
trap on_exit EXIT
RES=$WORK/results LOG=$WORK/log.txt STEPS=$WORK/steps.tsv
mkdir -p "$RES"/{runs,microbench,calibration,predictions,provenance,logs/runs}
: >"$LOG"; : >"$STEPS"; rm -f "$OUT"/*.part
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$HOME/.cache/superoffload/torch_extensions}
export DEVICE_CHECK_COMMIT=${DEVICE_CHECK_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}

# --- what runs in each mode -------------------------------------------------------------------------------
# POINTS: "role model seq batch" (role fits: torch holds it; offload: it may not; probe: meant not to fit)
# SWEEP: "point-index system cap-seconds", in the order they run (most valuable first)
if [ "$MODE" = gpu ]; then
  DEV=cuda SODEV=cuda INIT=cuda PREC=bf16 NSTEPS=5 NWARM=2 THREADS=()
  POINTS=("fits gpt-1b 1024 8" "offload gpt-5b 1024 8" "offload gpt-5b 4096 2")
  SWEEP=("0 torch 45" "0 superoffload 50"
         "1 superoffload 70" "1 zero_offload 75" "1 fsdp_offload 80" "1 ds_superoffload 75" "1 torch 40"
         "2 superoffload 70" "2 zero_offload 75" "2 fsdp_offload 80" "2 ds_superoffload 75" "2 torch 40"
         "0 zero_offload 45" "0 fsdp_offload 45" "0 ds_superoffload 45" "1 zero_infinity 90")
  # counters: launch_costs (cap 30) then bench adam (cap 40) must both fit, so 60 s of it; the sweep keeps 250
  TOTAL_S=470 SECTIONS=("setup 25" "sweep 250" "counters 60" "calibrate 70" "cuda 45" "report 20")
  ADAM=(--numel 16M --threads 1,4,8,16 --repeats 3)
  LAUNCH=(--device cuda --model gpt-1b --seq 1024 --batch 4 --precision bf16) LAUNCH_CAP=30  # gpt-1b: two builds, 2 x 3 steps
  CAL=(--workloads gpt-1b:1024:8 --dtype bf16 --collectives 0)
elif [ "$MODE" = 1 ]; then
  DEV=host SODEV=sim INIT=host PREC=bf16 NSTEPS=5 NWARM=2 THREADS=(--threads 1)
  POINTS=("fits gpt-tiny 128 2" "offload gpt-small 128 2" "offload gpt-small 256 1" "probe gpt-100b 1024 8")
  SWEEP=("0 torch 45" "0 superoffload 60"
         "1 superoffload 60" "1 zero_offload 60" "1 fsdp_offload 60" "1 ds_superoffload 60" "3 torch 20"
         "2 superoffload 60" "2 zero_offload 60" "2 fsdp_offload 60" "2 ds_superoffload 60"
         "0 zero_offload 45" "0 fsdp_offload 45" "0 ds_superoffload 45" "1 zero_infinity 60")
  TOTAL_S=570 SECTIONS=("setup 40" "sweep 300" "counters 60" "calibrate 80" "cuda 40" "report 50")
  ADAM=(--numel 1M --threads 1,2 --repeats 3)
  LAUNCH=(--device sim --model gpt-tiny --seq 64 --batch 1 --precision bf16) LAUNCH_CAP=24
  CAL=(--quick --workloads gpt-tiny:128:2 --dtype bf16 --threads 1 --collectives 0)
else
  DEV=host SODEV=sim INIT=host PREC=bf16 NSTEPS=5 NWARM=2 THREADS=(--threads 1)
  POINTS=("fits gpt-tiny 64 2" "probe gpt-100b 1024 8")
  # caps are limits, not durations: quiet, this mode takes about a minute; they leave room for a busy machine
  SWEEP=("0 torch 50" "0 superoffload 60" "1 torch 10")
  TOTAL_S=240 SECTIONS=("setup 25" "sweep 120" "counters 40" "calibrate 5" "cuda 0" "report 50")
  ADAM=() CAL=()
  LAUNCH=(--device sim --model gpt-tiny --seq 32 --batch 1 --precision bf16) LAUNCH_CAP=36
fi
printf '%s\n' "${POINTS[@]}" >"$WORK/points.tsv"
for r in "${SWEEP[@]}"; do set -- $r; p=(${POINTS[$1]}); echo "${p[1]} ${p[2]} ${p[3]} $2"; done >"$WORK/planned.tsv"
SYSTEMS=$(cut -d' ' -f4 "$WORK/planned.tsv" | awk '!seen[$0]++' | paste -sd, -)

# --- the budget: each section ends at the sum of the budgets before it and its own -------------------------
T0=$SECONDS
declare -A SEC_END
acc=0
{ echo "budget plan (mode $MODE): $TOTAL_S s in all; a step's timeout is the least of its cap and what is left"
  echo "of its section, and time a section leaves over passes to the next"
  for s in "${SECTIONS[@]}"; do
    set -- $s; acc=$((acc + $2)); SEC_END[$1]=$acc
    printf '  %-10s %4s s  (ends at %4s s)\n' "$1" "$2" "$acc"
  done
  echo "sweep: ${#SWEEP[@]} runs, in this order (point: system, cap s):"
  for r in "${SWEEP[@]}"; do set -- $r; echo "  ${POINTS[$1]}: $2, $3 s"; done
} >"$WORK/plan.txt"
if ((acc > TOTAL_S)); then echo "device_check: the sections' budgets add up to $acc s > $TOTAL_S s" >&2; exit 2; fi
cat "$WORK/plan.txt"
SECTION=setup

left() { echo $((T0 + SEC_END[$SECTION] - SECONDS)); }
note() { printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$SECTION" "$1" "$2" "$3" "$4" "${5:-}" >>"$STEPS"; }
# step NAME CAP CMD...: CMD under a timeout of min(CAP, what is left of the section), its output in log.txt (or,
# with STEP_OUT=FILE, in FILE) and one line in steps.tsv (NOTE=TEXT: its note); returns CMD's status (124:
# timed out; 125: skipped, no time left in the section)
step() {
  local name=$1 cap=$2 t s rc status head
  shift 2
  t=$(left); ((cap < t)) && t=$cap
  if ((t < 3)); then note "$name" skipped 0 "$t" "no time left in the section"; NOTE=; return 125; fi
  head="=== [$((SECONDS - T0)) s] $SECTION/$name (timeout $t s): $*"
  echo "$head" >>"$LOG"
  [ -n "${STEP_OUT:-}" ] && echo "$head" >>"$STEP_OUT"
  s=$SECONDS
  timeout -k 10 "$t" "$@" >>"${STEP_OUT:-$LOG}" 2>&1
  rc=$?
  case $rc in 0) status=ok ;; 124 | 137) status=timeout ;; *) status="exit $rc" ;; esac
  note "$name" "$status" $((SECONDS - s)) "$t" "${NOTE:-}"
  NOTE=
  return $rc
}
# allow CAP: the timeout for workflows/scripts/guard.py inside a step of cap CAP. The guard stops a command
# that outruns it (SIGTERM, SIGKILL 10 s later, then its marked processes 5 s later) and only then writes the
# stand-in result, so it needs ~20 s before the step's own timeout would stop it
allow() {
  local t
  t=$(left); (($1 < t)) && t=$1
  echo $((t > 40 ? t - 20 : t / 2))
}
pack() { $PY reports/gpu_check.py pack --work "$WORK" --out "$OUT" --mode "$MODE" >>"$LOG" 2>&1; }

# --- a. setup -------------------------------------------------------------------------------------------------
WHEELS=${WHEELS:-.whl}
BASE_PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONPATH=$BASE_PYTHONPATH
# The wheels go into a folder named after their contents (under $TMPDIR), reused by the next run with the same
# wheels: its DeepSpeed's sources then keep their path, and the ops DeepSpeed JIT-builds from them (cached in
# TORCH_EXTENSIONS_DIR, which moves beside them) are built once, without touching the cache of any other
# DeepSpeed on this machine (a build keyed on another copy's paths would be rebuilt back and forth)
install_wheels() {
  local key site tag pure=() bin=()
  key=$(cd "$WHEELS" && sha256sum -- *.whl | sha256sum | cut -c1-16)
  site=${DEVICE_CHECK_SITE:-${TMPDIR:-/tmp}/device_check_site}/$key
  for w in "$WHEELS"/*.whl; do
    case $w in *-none-any.whl) pure+=("$w") ;; *) bin+=("$w") ;; esac
  done
  tag=$($PY -c 'import platform, sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}-{platform.machine()}")')
  if [ -f "$site/$tag.done" ]; then
    echo "reusing $site (the same wheels, installed before)"
  else
    rm -rf "$site"; mkdir -p "$site" || return 1
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site/pure" "${pure[@]}" || return 1
    if ((${#bin[@]})) && [ "$tag" = cp312-x86_64 ]; then
      $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site/bin" "${bin[@]}" || return 1
    fi
    touch "$site/$tag.done"
  fi
  if [ -d "$site/bin" ]; then
    export PYTHONPATH=$site/pure:$site/bin:$BASE_PYTHONPATH
  else
    export PYTHONPATH=$site/pure:$BASE_PYTHONPATH
    ((${#bin[@]})) && echo "binary wheels (for the lent machine's cp312-x86_64) left out on this $tag, which" \
      "keeps its own builds: $(basename -a "${bin[@]}" | tr '\n' ' ')"
  fi
  if [ -d "$site/pure/deepspeed" ]; then
    # only device_check runs build here, and superoffload.ds_build sees whether a process on this machine holds
    # a build's lock: one nobody holds is a build killed with an earlier run, removed at once
    export TORCH_EXTENSIONS_DIR=$site/torch_extensions SUPEROFFLOAD_DS_LOCK_STALE_S=0
  fi
  echo "PYTHONPATH=$PYTHONPATH TORCH_EXTENSIONS_DIR=$TORCH_EXTENSIONS_DIR"
}
if compgen -G "$WHEELS/*.whl" >/dev/null; then  # in this shell (it sets PYTHONPATH), so timed here
  echo "=== [$((SECONDS - T0)) s] setup/wheels: installing $WHEELS/*.whl" >>"$LOG"
  s=$SECONDS; install_wheels >>"$LOG" 2>&1; rc=$?
  note wheels "$([ $rc = 0 ] && echo ok || echo "exit $rc")" $((SECONDS - s)) 30 "$(ls "$WHEELS"/*.whl | wc -l) wheels from $WHEELS"
else
  note wheels skipped 0 0 "no wheels in $WHEELS (scripts/gpu_wheels.sh fetches them)"
fi
ISA=$($PY -c 'import grace_adam; print(grace_adam.isa())' 2>/dev/null)  # one import of torch (~3 s), not two
if [ -n "$ISA" ] && [ "$ISA" != torch ]; then
  note grace_adam_build ok 0 0 "already built: $ISA"
else
  step grace_adam_build 30 $PY -m grace_adam.build
fi
step identity 20 $PY -m superoffload.harness.gpu_identity --out "$WORK/env.json"
step provenance 15 $PY workflows/scripts/provenance.py --out-dir "$RES/provenance"
$PY reports/gpu_check.py sweep --work "$WORK" --mode "$MODE" --steps "$NSTEPS" --warmup "$NWARM" >>"$LOG" 2>&1
step gh200_points 20 $PY workflows/scripts/point_predictions.py --points "$WORK/points.tsv" --systems "$SYSTEMS" \
  --hardware gh200 --out "$RES/predictions/gh200_points.json"
# In the background, each timed into the log: DeepSpeed's CPU ops (a JIT build on first use: cpu_adam, and on
# the CPU accelerator its shared-memory collectives), and the paper's GH200 predictions (~1 core for 30-60 s).
# Both at nice 19: the scheduler then gives them a core mostly where the runs they overlap leave one idle (Linux
# CFS weighs nice 19 at 15 against 1024 for nice 0), since those runs' host Adam wants every core
DS_OP='import time
from superoffload import ds_build
from deepspeed.accelerator import get_accelerator
acc = get_accelerator()
ds_build.prepare_deepspeed_ops()
for cls in ds_build.CPU_OFFLOAD_BUILDERS:
    builder = acc.create_op_builder(cls)
    if builder is None:
        print(f"{cls}: not an op of the {acc.device_name()} accelerator")
        continue
    t = time.time()
    builder.load()
    print(f"DeepSpeed op {builder.NAME} ready in {time.time() - t:.1f} s")'
if [ "$MODE" != short ]; then
  (s=$SECONDS; timeout -k 5 240 nice -n 19 $PY -c "$DS_OP" >"$WORK/ds_build.log" 2>&1
   echo "$? $((SECONDS - s))" >"$WORK/ds_build.rc") &
  DS_PID=$!
  (s=$SECONDS; timeout -k 5 240 nice -n 19 $PY workflows/scripts/predictions.py --hardware gh200 \
    --out "$RES/predictions/paper_comparison.json" >"$WORK/predictions.log" 2>&1
   echo "$? $((SECONDS - s))" >"$WORK/predictions.rc") &
  PRED_PID=$!
fi
pack

# wait_bg NAME PID RCFILE LOGFILE: wait for a background job (no longer than the section allows), note its time
wait_bg() {
  local name=$1 pid=$2 rcf=$3 logf=$4 s=$SECONDS t
  [ -n "$pid" ] || return 0
  t=$(left)
  while kill -0 "$pid" 2>/dev/null && ((SECONDS - s < t)); do sleep 1; done
  if [ -f "$rcf" ]; then
    set -- $(cat "$rcf")
    note "$name" "$([ "$1" = 0 ] && echo ok || echo "exit $1")" "$2" 240 "in the background; waited $((SECONDS - s)) s"
  else
    note "$name" "still running" $((SECONDS - s)) "$t" "not finished when needed"
  fi
  { echo "=== $name:"; tail -20 "$logf" 2>/dev/null; } >>"$LOG"
}

# --- b. the sweep -------------------------------------------------------------------------------------------
SECTION=sweep
DS_WAITED=
bench() {  # bench POINT-INDEX SYSTEM CAP
  set -- ${POINTS[$1]} "$2" "$3"
  local role=$1 model=$2 seq=$3 batch=$4 sys=$5 cap=$6 dev=$DEV
  local name=${model}_s${seq}_b${batch} rec log args status
  [ "$sys" = superoffload ] && dev=$SODEV
  rec=$RES/runs/$sys/$name.json log=$RES/logs/runs/${sys}_$name.log
  case $sys in zero_offload | zero_infinity | ds_superoffload)
    if [ -z "$DS_WAITED" ]; then wait_bg ds_ops_build "$DS_PID" "$WORK/ds_build.rc" "$WORK/ds_build.log"; DS_WAITED=1; fi ;;
  esac
  args=(--system "$sys" --model "$model" --seq "$seq" --batch "$batch" --precision "$PREC" --checkpointing
        --grad-clip 1.0 --steps "$NSTEPS" --warmup "$NWARM" --device "$dev" --init-device "$INIT" "${THREADS[@]}")
  step "$sys $name" "$cap" $PY workflows/scripts/guard.py record --out "$rec" --log "$log" --timeout "$(allow "$cap")" \
    --system "$sys" --model "$model" --seq "$seq" --batch "$batch" --dtype "$PREC" --steps "$NSTEPS" \
    --warmup "$NWARM" -- $PY -m superoffload bench run "${args[@]}" --no-progress --out "$rec"
  [ $? = 125 ] && return
  # bench run's memory check refused the point before building anything: infeasible by design, not an error
  if grep -q "written_by" "$rec" 2>/dev/null && grep -q "needs about" "$log" 2>/dev/null; then
    $PY -m superoffload.harness.not_run --message-file "$log" --out "$rec" "${args[@]}" >>"$LOG" 2>&1
  fi
  status=$($PY -c 'import json, sys; print(json.load(open(sys.argv[1])).get("status", "?"))' "$rec" 2>/dev/null)
  sed -i "\$s/\$/ [record: ${status:-none}]/" "$STEPS"
  pack
}
for r in "${SWEEP[@]}"; do set -- $r; bench "$1" "$2" "$3"; done
[ -z "$DS_WAITED" ] && [ -n "$DS_PID" ] && wait_bg ds_ops_build "$DS_PID" "$WORK/ds_build.rc" "$WORK/ds_build.log"

# --- c. launch counters and host Adam ------------------------------------------------------------------------
SECTION=counters
if ((${#LAUNCH[@]})); then
  if [ -f benchmarks/launch_costs.py ]; then
    # the guard, stopping a benchmark that outruns it, then waits 10 s for its process group (stop_group sees the
    # unreaped leader as alive): 12 s of the step are kept for that where the step has 24, the rest is the
    # benchmark's (it writes the engine's counts before it runs torch's, so a run cut off still says something)
    lt=$(left); ((lt > LAUNCH_CAP)) && lt=$LAUNCH_CAP
    step launch_costs "$LAUNCH_CAP" $PY workflows/scripts/guard.py json --what launch_costs \
      --out "$RES/microbench/launch_costs.json" --log "$RES/logs/launch_costs.log" \
      --timeout "$((lt >= 24 ? lt - 12 : lt / 2))" -- \
      $PY benchmarks/launch_costs.py "${LAUNCH[@]}" --out "$RES/microbench/launch_costs.json"
  else
    note launch_costs "not run: absent" 0 0 "benchmarks/launch_costs.py is not in this tree"
    echo '{"status": "not run", "error": "absent: benchmarks/launch_costs.py is not in this tree"}' \
      >"$RES/microbench/launch_costs.json"
  fi
fi
if ((${#ADAM[@]})); then
  step bench_adam 40 $PY workflows/scripts/guard.py json --what "bench adam" --out "$RES/microbench/adam.json" \
    --log "$RES/logs/adam.log" --timeout "$(allow 40)" -- $PY -m superoffload bench adam "${ADAM[@]}" --out "$RES/microbench/adam.json"
else
  note bench_adam skipped 0 0 "the short rehearsal leaves it out"
fi
pack

# --- d. calibrate and validate ---------------------------------------------------------------------------------
SECTION=calibrate
HW=$RES/calibration/hardware.json
is_profile() { $PY -c 'import sys; from superoffload.planner.presets import get_profile; get_profile(sys.argv[1])' "$1" 2>/dev/null; }
calibrate() {  # calibrate NAME ARGS...: under the guard, leaving 10 s of the section to the validation
  local name=$1 cap
  shift
  cap=$(($(left) - 10)); ((cap > 120)) && cap=120
  step "$name" "$cap" $PY workflows/scripts/guard.py json --what calibrate --out "$HW" --log "$RES/logs/$name.log" \
    --timeout "$(allow "$cap")" -- $PY -m superoffload calibrate "$@" --out "$HW"
}
if ((${#CAL[@]})); then
  calibrate calibrate "${CAL[@]}"
  # cut off or failed: a quick one (smaller problems, no system timings) where 25 s are left
  if ! is_profile "$HW" && (($(left) >= 25)); then
    NOTE="the full one did not finish" calibrate calibrate_quick "${CAL[@]}" --quick --no-systems
  fi
fi
# validation needs a profile: the calibrated one, else (calibrate left out, cut off or failed) the device's preset
if ! is_profile "$HW"; then
  HW=$($PY -c 'import json, sys; print(json.load(open(sys.argv[1])).get("planner_preset") or "cpu")' "$WORK/env.json" \
       2>/dev/null || echo cpu)
  NOTE="no calibrated profile: against the $HW preset"
fi
step validate 20 $PY workflows/scripts/guard.py json --what validate --out "$RES/predictions/validation.json" \
  --log "$RES/logs/validate.log" --timeout "$(allow 20)" -- $PY -m superoffload validate "$RES/runs" --hardware "$HW" \
  --out "$RES/predictions/validation.json"
pack

# --- e. the CUDA tests ------------------------------------------------------------------------------------------
SECTION=cuda
CUDA_FILES=$(grep -rl "pytest.mark.cuda" tests --include='test_*.py' | sort | tr '\n' ' ')
if [ "$MODE" != short ]; then
  STEP_OUT=$WORK/cuda_tests.txt step cuda_tests 90 $PY -m pytest -q -rfE --timeout=60 -m cuda -p no:cacheprovider \
    $CUDA_FILES
  if [ "$MODE" = gpu ] && (($(left) >= 40)); then  # the hot path under torch's CUDA sanitizer, if time is left
    STEP_OUT=$WORK/cuda_tests.txt NOTE="TORCH_CUDA_SANITIZER=1" step cuda_sanitizer 60 env TORCH_CUDA_SANITIZER=1 \
      SUPEROFFLOAD_CUDA_SYNC_DEBUG=error $PY -m pytest -q -rfE --timeout=60 -m cuda -p no:cacheprovider \
      tests/engine/test_cuda.py -k "speculation or overlap"
  fi
else
  echo "not run in the short rehearsal: $CUDA_FILES" >"$WORK/cuda_tests.txt"
  note cuda_tests skipped 0 0 "the short rehearsal leaves them out"
fi
pack

# --- f. the report -----------------------------------------------------------------------------------------------
SECTION=report
[ -n "$PRED_PID" ] && wait_bg gh200_paper_predictions "$PRED_PID" "$WORK/predictions.rc" "$WORK/predictions.log"
[ "$MODE" = short ] && note gh200_paper_predictions skipped 0 0 "the short rehearsal leaves them out (~1 min on 2 cores)"
step figures 30 $PY reports/render.py figures --results "$RES" --out "$RES/figures"
step report 30 $PY reports/gpu_check.py html --work "$WORK" --mode "$MODE" --out "$RES/report.html"
echo "=== done in $((SECONDS - T0)) s" >>"$LOG"
note total done $((SECONDS - T0)) "$TOTAL_S" "the whole script"
pack
cat "$OUT/summary.txt"
ls -l "$OUT"
