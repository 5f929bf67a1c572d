# The planner's choice against a grid around it, measured side by side (benchmarks/plan_optimality.py):
# every point's plan is made on this machine's profile, calibrated for the grid itself (each workload's compute
# in each precision of the grid, collectives on two ranks: plan_optimality_calibrate), and every run is given
# that profile. Its own target (`snakemake plan_optimality`), not part of `all`: the default grid is ~160 runs
# (about an hour on a 2-core machine). The script keeps its progress in progress.json beside the result and
# resumes from it; the declared output is copied from it once every run is done.

PO = config["plan_optimality"]
PLAN_OPTIMALITY_FILE = f"{RES}/plan_optimality/plan_optimality.json"
PLAN_OPTIMALITY_PROGRESS = f"{RES}/plan_optimality/progress.json"
PLAN_OPTIMALITY_HARDWARE = f"{RES}/plan_optimality/hardware.json"


def plan_optimality_workloads():
    """MODEL:SEQ:BATCH of every grid workload (a workload without a batch runs at the grid's `batch`)."""
    return ",".join(w if w.count(":") == 2 else f"{w}:{PO['batch']}" for w in PO["workloads"])


def plan_optimality_cmd():
    cmd = [PY, "benchmarks/plan_optimality.py", "--out", PLAN_OPTIMALITY_PROGRESS, "--hardware",
           PLAN_OPTIMALITY_HARDWARE, "--workloads", ",".join(PO["workloads"]), "--batch", str(PO["batch"]),
           "--world", ",".join(map(str, PO["world"])),
           "--dtype", ",".join(PO["dtype"]), "--grid", PO["grid"], "--repeats", str(PO["repeats"]),
           "--steps", str(PO["steps"]), "--warmup", str(PO["warmup"]), "--threads", str(PO["threads"]),
           "--run-timeout", str(config["run_timeout_s"])]
    if PO["peers"]:
        cmd += ["--peers", ",".join(PO["peers"])]
    if PO["bind_cores"]:
        cmd += ["--bind-cores"]
    return shlex.join(cmd)


rule plan_optimality_calibrate:
    output:
        PLAN_OPTIMALITY_HARDWARE,
    log:
        f"{RES}/logs/plan_optimality_calibrate.log",
    benchmark:
        f"{RES}/benchmarks/plan_optimality_calibrate.tsv"
    threads: EXCLUSIVE
    resources:
        gpu=1,
    params:
        cmd=lambda wc: guard(
            "json", PLAN_OPTIMALITY_HARDWARE, f"{RES}/logs/plan_optimality_calibrate.guard.log",
            [*CLI, "calibrate", "--out", PLAN_OPTIMALITY_HARDWARE, "--workloads", plan_optimality_workloads(),
             "--dtype", ",".join(PO["dtype"])] + (["--threads", str(PO["threads"])] if PO["threads"] else []),
            what="calibrate"),
    shell:
        "{params.cmd} > {log:q} 2>&1"


rule plan_optimality_run:
    input:
        PLAN_OPTIMALITY_HARDWARE,
    output:
        PLAN_OPTIMALITY_FILE,
    log:
        f"{RES}/logs/plan_optimality.log",
    benchmark:
        f"{RES}/benchmarks/plan_optimality.tsv"
    threads: EXCLUSIVE
    resources:
        gpu=1,
    params:
        cmd=lambda wc: plan_optimality_cmd(),
    shell:
        "{params.cmd} > {log:q} 2>&1 && cp {PLAN_OPTIMALITY_PROGRESS:q} {output:q}"
