# Shared helpers: config validation, hardware detection, sweep selection, the run matrix.
import copy
import datetime
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError

from superoffload import catalog
from superoffload.ds_build import default_extensions_dir


def _config_checker():
    """workflows/scripts/config_check.py, loaded by path because workflows/scripts is not a package."""
    import importlib.util

    path = Path(workflow.basedir) / "workflows" / "scripts" / "config_check.py"
    spec = importlib.util.spec_from_file_location("config_check", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# The config is checked (one line per error: key path, schema message, closest valid name; the full message in
# .snakemake/config_error.txt), then the schema's defaults, which the rules rely on, are filled into it. Not
# Snakemake's validate(): it prints the whole schema on an error, and its default filling fails on a block set
# to null (an optional one, such as nightly.plan_optimality). Raised here, before any rule is defined or job
# runs, and at top level: a one-line traceback.
CONFIG_SCHEMA = Path(workflow.basedir) / "workflows" / "schemas" / "config.schema.yaml"
_checker = _config_checker()
if _bad_config := _checker.check_config(config, CONFIG_SCHEMA, Path(".snakemake") / "config_error.txt"):
    raise WorkflowError(_bad_config)
_checker.fill_defaults(config, CONFIG_SCHEMA)

PY = sys.executable  # the interpreter running Snakemake (the venv's)
WF = Path(workflow.basedir)  # repository root (where the Snakefile is)
SCRIPTS = WF / "workflows" / "scripts"
REPORTS = WF / "reports"
CLI = [PY, "-m", "superoffload"]

# DeepSpeed JIT-builds its CPU ops once (~2 min); keep them across runs (same default as the Makefile: in the
# venv, superoffload.ds_build.default_extensions_dir).
os.environ.setdefault(
    "TORCH_EXTENSIONS_DIR",
    config.get("torch_extensions_dir") or str(default_extensions_dir()),
)
if config.get("torch_extensions_dir"):
    os.environ["TORCH_EXTENSIONS_DIR"] = config["torch_extensions_dir"]


def _slug(s):
    return re.sub(r"[^a-z0-9.]+", "-", s.lower()).strip("-") or "unknown"


def _cpu_model():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def detect_hardware():
    """What the workflow runs on. Fast path: no nvidia-smi and no /dev/nvidia0 -> no GPU (torch is not
    imported); otherwise torch.cuda decides and names the device."""
    hw = {"cuda": False, "device_name": None, "cpu": _cpu_model(), "arch": platform.machine(),
          "cpu_count": os.cpu_count(), "gpu_count": 0}
    if shutil.which("nvidia-smi") is None and not os.path.exists("/dev/nvidia0"):
        hw["detail"] = "no NVIDIA driver (nvidia-smi not found, no /dev/nvidia0)"
        return hw
    try:
        import torch

        if torch.cuda.is_available():
            hw["cuda"] = True
            hw["device_name"] = torch.cuda.get_device_name(0)
            hw["gpu_count"] = torch.cuda.device_count()
            hw["detail"] = f"torch.cuda.is_available() is True; device 0 is {hw['device_name']!r}"
        else:
            hw["detail"] = "torch.cuda.is_available() is False (driver present, no usable CUDA device)"
    except Exception as e:  # noqa: BLE001 - detection must never break parsing
        hw["detail"] = f"could not query torch.cuda ({type(e).__name__}: {e})"
    return hw


def select_sweep(cfg, hw):
    """(sweep name, reason)."""
    name = cfg["sweep"]
    if name != "auto":
        if name not in cfg["sweeps"]:
            raise ValueError(f"config: sweep {name!r} is not defined; choose auto or one of "
                             f"{', '.join(cfg['sweeps'])}")
        return name, f"set in the config (sweep={name}); hardware: {hw['detail']}"
    if not hw["cuda"]:
        return "cpu_smoke", f"sweep=auto and no CUDA GPU: {hw['detail']}"
    gpu = catalog.gpu_for(hw["device_name"])  # the GPU's sweep is its catalog record's
    if gpu is None:
        return "gpu", f"sweep=auto and a CUDA GPU superoffload/catalog.py does not list: {hw['detail']}"
    return gpu.sweep, f"sweep=auto and the GPU is a {gpu.name}, whose sweep is {gpu.sweep}: {hw['detail']}"


HW = detect_hardware()
SWEEP, SWEEP_REASON = select_sweep(config, HW)
SW = config["sweeps"][SWEEP]
RES = f"{config['results_dir']}/{SWEEP}"
STEPS = config["steps_override"] or SW["steps"]
WARMUP = SW["warmup"] if config["warmup_override"] is None else config["warmup_override"]
LAUNCHER = config.get("launcher") or SW.get("launcher") or ""
ONLY = set(config["only_systems"] or [])
ONLY_MODELS = set(config["only_models"] or [])


def print_selection():
    print(f"superoffload workflow: sweep {SWEEP!r} -> {RES}/ ({SWEEP_REASON})", file=sys.stderr)
    if MULTI_RUNS or PREDICTED_RUNS:
        print(f"superoffload workflow: {len(MULTI_RUNS)} multi-rank runs measured, {len(PREDICTED_RUNS)} need "
              f"more chips than the {CHIPS_AVAILABLE} available ({CHIPS_REASON}) and are predicted",
              file=sys.stderr)


# --- the run matrix -----------------------------------------------------------------------------------
def sp_degrees(m, chips):
    """A matrix's Ulysses degrees on `chips` chips: `sp: chips` (SP = the chip count, the paper's Fig 12) or a
    list of degrees, each of which must divide the chip count."""
    sp = m.get("sp", [1])
    if sp == "chips":
        return [chips]
    bad = [k for k in sp if chips % k]
    if bad:
        raise ValueError(f"config: matrix {m['name']!r}: sp {bad} must divide its chip count {chips}")
    return list(sp)


def sweep_runs():
    """Unique (system, model, seq, batch, chips, sp) dicts over the sweep's matrices, in config order; a point
    with sp > 1 also carries its matrix's long-sequence flags (offload_checkpoints, the system's loss tile)."""
    seen, runs = set(), []
    for m in SW["matrices"]:
        for system in m["systems"]:
            if ONLY and system not in ONLY:
                continue
            for model in m["models"]:
                if ONLY_MODELS and model not in ONLY_MODELS:
                    continue
                for seq in m["seq"]:
                    for batch in m["batch"]:
                        for chips in m.get("chips") or [1]:
                            for sp in sp_degrees(m, chips):
                                key = (system, model, seq, batch, chips, sp)
                                if key in seen:
                                    continue
                                seen.add(key)
                                run = {"system": system, "model": model, "seq": seq, "batch": batch,
                                       "chips": chips, "matrix": m["name"]}
                                if sp > 1:
                                    run.update(sp=sp, offload_checkpoints=bool(m.get("offload_checkpoints")),
                                               loss_tile=(m.get("loss_tile") or {}).get(system),
                                               steps=config["steps_override"] or m.get("steps") or STEPS,
                                               warmup=WARMUP if config["warmup_override"] is not None
                                               or m.get("warmup") is None else m["warmup"],
                                               run_timeout_s=m.get("run_timeout_s") or config["run_timeout_s"])
                                runs.append(run)
    return runs


def detect_chips():
    """(chips one run may use, why): `chips_available` from the config, else this machine's GPUs for a
    CUDA sweep, or its cores for a CPU sweep (gloo ranks need a core each)."""
    if config.get("chips_available"):
        return int(config["chips_available"]), "chips_available in the config"
    if SW["device"] == "cpu" or not HW["cuda"]:
        if SW["device"] != "cpu":
            return 1, "no CUDA GPU on this machine"
        n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        return n, f"{n} cores for gloo ranks on this machine"
    return HW.get("gpu_count") or 1, f"{HW.get('gpu_count')} CUDA GPUs on this machine"


ALL_RUNS = sweep_runs()
RUNS = [r for r in ALL_RUNS if r["chips"] == 1]  # sp divides chips: one-chip points have sp 1
RUN_RECORDS = [f"{RES}/runs/{r['system']}/{r['model']}_s{r['seq']}_b{r['batch']}.json" for r in RUNS]
# Several chips: measured (one job running every rank) when the machine, or the cluster of the slurm
# profile, has that many; otherwise the point is predicted by the cost model (paper_comparison), exactly
# like the paper points a single GPU cannot measure.
CHIPS_AVAILABLE, CHIPS_REASON = detect_chips()
MULTINODE = config["multinode"]
MULTI_RUNS = [r for r in ALL_RUNS if r["chips"] > 1 and r["chips"] <= CHIPS_AVAILABLE]
PREDICTED_RUNS = [r for r in ALL_RUNS if r["chips"] > CHIPS_AVAILABLE]


def multi_record(r):
    """runs_w<chips>/<system>/<model>_s<seq>_b<batch>.json; a sequence-parallel point ends in _sp<K>."""
    sp = f"_sp{r['sp']}" if r.get("sp", 1) > 1 else ""
    return f"{RES}/runs_w{r['chips']}/{r['system']}/{r['model']}_s{r['seq']}_b{r['batch']}{sp}.json"


MULTI_RECORDS = [multi_record(r) for r in MULTI_RUNS]
# Long sequences (`snakemake seqlen`): the sequence-parallel points, measured (their records) or predicted
SEQLEN_RUNS = [r for r in ALL_RUNS if r.get("sp", 1) > 1]
SEQLEN_RECORDS = [multi_record(r) for r in MULTI_RUNS if r.get("sp", 1) > 1]
SEQLEN_BY_PATH = {multi_record(r): r for r in MULTI_RUNS if r.get("sp", 1) > 1}
# the sweep's distinct (model, seq, batch), for calibrate --workloads
WORKLOADS = ",".join(dict.fromkeys(f"{r['model']}:{r['seq']}:{r['batch']}" for r in RUNS))


def option_args(options):
    out = []
    for k, v in sorted(options.items()):
        val = v if isinstance(v, str) else json.dumps(v)
        out += ["-o", f"{k}={val}"]
    return out


def bench_cmd(system, model, seq, batch, steps, warmup, options, threads=None, dtype=None):
    cmd = [*CLI, "bench", "run", "--system", system, "--model", model, "--seq", str(seq),
           "--batch", str(batch), "--steps", str(steps), "--warmup", str(warmup),
           "--dtype", dtype or SW["dtype"], "--grad-clip", str(SW["grad_clip"]), "--no-progress"]
    if SW["device"] != "auto":
        cmd += ["--device", SW["device"]]
    if threads:
        cmd += ["--threads", str(threads)]
    if SW["checkpointing"]:
        cmd.append("--checkpointing")
    return cmd + option_args(options)


def sequence_args(point):
    """bench run flags of a sequence-parallel point: --sp and its matrix's --offload-checkpoints / --loss-tile."""
    if not point or point.get("sp", 1) <= 1:
        return []
    args = ["--sp", str(point["sp"])]
    if point.get("offload_checkpoints"):
        args.append("--offload-checkpoints")
    if point.get("loss_tile"):
        args += ["--loss-tile", str(point["loss_tile"])]
    return args


def multi_cmd(system, model, seq, batch, chips, out, point=None):
    """A run on `chips` ranks: `bench run --nproc` on this host, or (slurm profile, multinode.enabled)
    workflows/scripts/launch_ranks.py, which runs srun + torchrun over the job's nodes when the ranks need
    more than one node. Every rank is bound to its own cores (--bind-cores). `point`: a sequence-parallel
    point of the run list (its --sp and long-sequence flags)."""
    steps, warmup = (point or {}).get("steps", STEPS), (point or {}).get("warmup", WARMUP)
    args = bench_cmd(system, model, seq, batch, steps, warmup, SW.get("system_options", {}).get(system, {}),
                     threads=SW["threads"])[len(CLI):] + sequence_args(point) + ["--bind-cores", "--out", out]
    if MULTINODE["enabled"]:
        return [PY, str(SCRIPTS / "launch_ranks.py"), "--chips", str(chips), "--gpus-per-node",
                str(MULTINODE["gpus_per_node"]), "--port", str(MULTINODE["port"]), "--", *args]
    return [*CLI, *args, "--nproc", str(chips)]


def nodes_for(chips):
    g = MULTINODE["gpus_per_node"]
    return -(-int(chips) // g) if MULTINODE["enabled"] else 1


def guard(mode, out, log, cmd, launcher=True, timeout=None, **meta):
    """Shell line: run `cmd` under workflows/scripts/guard.py, which always leaves a result at `out`.
    `launcher=False`: without the sweep's launcher prefix (multi-rank runs bind each rank themselves);
    `timeout`: this command's wall-clock limit (default: the config's run_timeout_s)."""
    g = [PY, str(SCRIPTS / "guard.py"), mode, "--out", out, "--log", log,
         "--timeout", str(timeout or config["run_timeout_s"])]
    for k, v in meta.items():
        g += [f"--{k.replace('_', '-')}", str(v)]
    pre = shlex.split(LAUNCHER) if LAUNCHER and launcher else []
    return shlex.join(g + ["--", *pre, *cmd])


# A measured job claims every core of the workflow, so that Snakemake schedules nothing beside it (the
# gpu=1 resource only serialises measured jobs among themselves; a report or prediction job running on
# the "free" core slowed the CPU smoke runs by up to 40 %). The run's own thread count is --threads.
EXCLUSIVE = workflow.cores


# --- ablation --------------------------------------------------------------------------------------------
def ablation_variants():
    """name -> {kind, step, technique, options} for cumulative, leave-one-out and alternative runs."""
    ab = config["ablation"]
    techs, order = ab["techniques"], ab["order"]
    missing = [t for t in order if t not in techs]
    if missing:
        raise ValueError(f"config: ablation.order names unknown techniques {missing}; "
                         f"known: {', '.join(techs)}")
    base = {**SW.get("system_options", {}).get(ab["system"], {}), **ab["extra_options"]}
    all_on = {**base, **{t: techs[t]["enabled"] for t in order}}
    variants = {}
    for i in range(len(order) + 1):
        opts = {**base, **{t: (techs[t]["enabled"] if j < i else techs[t]["disabled"]) for j, t in enumerate(order)}}
        name = f"cum{i}-{order[i - 1] if i else 'baseline'}"
        variants[name] = {"kind": "cumulative", "step": i, "technique": order[i - 1] if i else None,
                          "options": opts}
    for t in order:
        variants[f"loo-{t}"] = {"kind": "leave_one_out", "step": None, "technique": t,
                                "options": {**all_on, t: techs[t]["disabled"]}}
    for alt in ab["alternatives"]:
        label = "-".join(f"{k}-{_slug(str(v))}" for k, v in sorted(alt.items()))
        variants[f"alt-{label}"] = {"kind": "alternative", "step": None, "technique": None,
                                    "options": {**all_on, **alt}}
    # a variant with the options of an earlier one is that run, not another: leave-one-out of the last
    # technique is always the cumulative step before it (with one technique, the baseline). It is measured
    # once and its record copied (rule ablation_same), so both tables read one measurement.
    seen = {}
    for name, v in variants.items():
        key = json.dumps(v["options"], sort_keys=True, default=str)
        if key in seen:
            v["same_as"] = seen[key]
        else:
            seen[key] = name
    return variants


ABLATION = ablation_variants()
ABLATION_MEASURED = [v for v, d in ABLATION.items() if "same_as" not in d]
ABLATION_RECORDS = ([] if ONLY and config["ablation"]["system"] not in ONLY
                    else [f"{RES}/ablation/{v}.json" for v in ABLATION])


# --- nightly -------------------------------------------------------------------------------------------
def hardware_key():
    if config["nightly_hardware_key"]:
        return config["nightly_hardware_key"]
    if HW["cuda"]:
        return "cuda-" + _slug(HW["device_name"].replace("NVIDIA", ""))
    cpu = _slug(re.sub(r"\((R|TM)\)|CPU|Processor|@.*$", " ", HW["cpu"], flags=re.I))
    return f"cpu-{_slug(HW['arch'])}-{cpu}-{HW['cpu_count']}c"


HW_KEY = hardware_key()
NIGHTLY_UPDATE = str(config["nightly_update_reference"]).lower() in ("true", "yes", "1")
NIGHTLY_STAMP = os.environ.setdefault("SUPEROFFLOAD_NIGHTLY_STAMP",
                                      datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ"))
NIGHTLY_DIR = f"{config['results_dir']}/nightly/{HW_KEY}/{NIGHTLY_STAMP}"
NIGHTLY_REFERENCE = str(WF / "benchmarks" / "reference" / f"nightly-{HW_KEY}.json")
NIGHTLY_CASES = {f"{c['system']}_{c['model']}_s{c['seq']}_b{c['batch']}": c for c in config["nightly"]["cases"]}
NIGHTLY_RECORDS = [f"{NIGHTLY_DIR}/{case}/rep{i}.json" for case in NIGHTLY_CASES
                   for i in range(config["nightly"]["repeats"])]
# the planner regression case (docs/nightly.md): one plan_optimality result, whose points are the cases
NIGHTLY_PO = config["nightly"].get("plan_optimality")
NIGHTLY_PO_FILE = f"{NIGHTLY_DIR}/plan_optimality/rep0.json"
NIGHTLY_PO_PROGRESS = f"{NIGHTLY_DIR}/plan_optimality/progress.json"  # not rep*.json: `nightly record` reads those
if NIGHTLY_PO:
    NIGHTLY_RECORDS.append(NIGHTLY_PO_FILE)


wildcard_constraints:
    system="[a-z_]+",
    model="[a-z0-9][a-z0-9.\\-]*",
    seq="[0-9]+",
    batch="[0-9]+",
    variant="(cum|loo|alt)[a-z0-9_.\\-]*",
    world="[0-9]+",
    sp="[0-9]+",
    case="[a-z0-9_.\\-]+",
    rep="[0-9]+",
