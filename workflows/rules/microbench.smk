# Microbenchmarks (GraceAdam kernel, cast / link bandwidth), calibration (HardwareProfile JSON).

CALIBRATION_FILE = f"{RES}/calibration/hardware.json"
MICROBENCH_FILES = [f"{RES}/microbench/adam.json", f"{RES}/microbench/cast.json"]


rule bench_adam:
    output:
        f"{RES}/microbench/adam.json",
    log:
        f"{RES}/logs/microbench/adam.log",
    benchmark:
        f"{RES}/benchmarks/microbench/adam.tsv"
    threads: EXCLUSIVE
    resources:
        gpu=1,
    params:
        cmd=lambda wc: guard(
            "json", f"{RES}/microbench/adam.json", f"{RES}/logs/microbench/adam.guard.log",
            [*CLI, "bench", "adam", "--numel", SW["microbench"]["adam"]["numel"],
             "--threads", SW["microbench"]["adam"]["threads"], "--out", f"{RES}/microbench/adam.json"],
            what="adam"),
    shell:
        "{params.cmd} > {log:q} 2>&1"


rule bench_cast:
    output:
        f"{RES}/microbench/cast.json",
    log:
        f"{RES}/logs/microbench/cast.log",
    benchmark:
        f"{RES}/benchmarks/microbench/cast.tsv"
    threads: EXCLUSIVE
    resources:
        gpu=1,
    params:
        cmd=lambda wc: guard(
            "json", f"{RES}/microbench/cast.json", f"{RES}/logs/microbench/cast.guard.log",
            [*CLI, "bench", "cast", *SW["microbench"]["cast"]["args"], "--out", f"{RES}/microbench/cast.json"],
            what="cast"),
    shell:
        "{params.cmd} > {log:q} 2>&1"


rule calibrate_run:
    output:
        CALIBRATION_FILE,
    log:
        f"{RES}/logs/calibrate.log",
    benchmark:
        f"{RES}/benchmarks/calibrate.tsv"
    priority: 50
    threads: EXCLUSIVE
    resources:
        gpu=1,
    params:
        cmd=lambda wc: guard(
            "json", CALIBRATION_FILE, f"{RES}/logs/calibrate.guard.log",
            [*CLI, "calibrate", "--out", CALIBRATION_FILE] + (["--quick"] if SW["calibrate"]["quick"] else [])
            + (["--workloads", WORKLOADS, "--dtype", SW["dtype"]] if SW["calibrate"]["profile_workloads"]
               and WORKLOADS else [])
            + (["--threads", str(SW["threads"])] if SW.get("threads") else []),
            what="calibrate"),
    shell:
        "{params.cmd} > {log:q} 2>&1"
