# Nightly regression tracking (docs/nightly.md): a small fixed matrix, each case run `repeats` times
# (serially, gpu=1) into results/nightly/<hardware key>/<UTC stamp>/; every repeat's raw values are
# appended to the history (results/history/nightly.sqlite) and the night is judged against the rolling
# baseline of its fingerprint. The job fails (so `snakemake nightly` exits non-zero) on a regression only;
# the Markdown summary (a log, kept when the job fails) says what moved, the commit range and how to bisect;
# results/history/nightly.html shows every case's trend.

NY = config["nightly"]
NIGHTLY_VERDICT = f"{NIGHTLY_DIR}/verdict.json"
NIGHTLY_MICRO = f"{NIGHTLY_DIR}/microbench-verdict.json"
NIGHTLY_TARGET = [NIGHTLY_VERDICT, NIGHTLY_MICRO]
HISTORY = NY.get("history") or f"{config['results_dir']}/history/nightly.sqlite"
NIGHTLY_PAGE = str(Path(HISTORY).parent / "nightly.html")  # every suite's trends, rewritten each night


def nightly_rule_args():
    args = [f"--window {NY['window']}", f"--min-baseline {NY['min_baseline']}", f"--persist {NY['persist']}",
            f"--sigma {NY['sigma']}", f"--threshold-pct {NY['threshold_pct']}"]
    args += [f"--bound {m}={v}" for m, v in sorted(NY["bounds"].items())]
    return " ".join(args)


def nightly_imports(suite):
    """The reference files of the nightly before the history existed, imported once (by content)."""
    if suite == "training":
        return f"--reference {shlex.quote(NIGHTLY_REFERENCE)}" if Path(NIGHTLY_REFERENCE).exists() else ""
    old = WF / "benchmarks" / "reference" / "pytest-benchmark" / HW_KEY
    return f"--pytest-benchmark-dir {shlex.quote(str(old))}" if old.exists() else ""


def nightly_accept(suite):
    """`nightly_update_reference=true` (the old way to refresh the reference): this night becomes the baseline."""
    if not NIGHTLY_UPDATE:
        return "true"
    return (f"{shlex.join(CLI)} nightly accept --suite {suite} --store {shlex.quote(HISTORY)} --case all "
            f"--note 'nightly_update_reference=true' {nightly_rule_args()}")


def nightly_check_cmd(suite, record_args, verdict, summary):
    imports = nightly_imports(suite)
    cli, store = shlex.join(CLI), shlex.quote(HISTORY)
    return " && ".join([
        *([f"{cli} nightly import --store {store} {imports}"] if imports else []),
        f"{cli} nightly record --suite {suite} --store {store} {record_args}",
        nightly_accept(suite),
        # the page first: a regression fails the check, and the page is where it is seen
        f"({shlex.quote(PY)} {shlex.quote(str(REPORTS))}/render.py nightly --store {store} "
        f"--out {shlex.quote(NIGHTLY_PAGE)} --repo {shlex.quote(str(WF))} {nightly_rule_args()} "
        "|| echo 'nightly: the page did not render (the check goes on)' >&2)",
        f"{cli} nightly check --suite {suite} --store {store} --repo {shlex.quote(str(WF))} {nightly_rule_args()} "
        f"--out {shlex.quote(verdict)} --summary {shlex.quote(summary)}",
    ])


rule nightly_run:
    output:
        f"{NIGHTLY_DIR}/{{case}}/rep{{rep}}.json",
    log:
        f"{NIGHTLY_DIR}/logs/{{case}}_rep{{rep}}.log",
    benchmark:
        f"{NIGHTLY_DIR}/benchmarks/{{case}}_rep{{rep}}.tsv"
    threads: EXCLUSIVE
    resources:
        gpu=1,
    params:
        cmd=lambda wc: guard(
            "record", f"{NIGHTLY_DIR}/{wc.case}/rep{wc.rep}.json", f"{NIGHTLY_DIR}/logs/{wc.case}_rep{wc.rep}.guard.log",
            bench_cmd(NIGHTLY_CASES[wc.case]["system"], NIGHTLY_CASES[wc.case]["model"],
                      NIGHTLY_CASES[wc.case]["seq"], NIGHTLY_CASES[wc.case]["batch"], NY["steps"], NY["warmup"],
                      {}, threads=NY["threads"], dtype=NY["dtype"])
            + ["--out", f"{NIGHTLY_DIR}/{wc.case}/rep{wc.rep}.json"],
            system=NIGHTLY_CASES[wc.case]["system"], model=NIGHTLY_CASES[wc.case]["model"],
            seq=NIGHTLY_CASES[wc.case]["seq"], batch=NIGHTLY_CASES[wc.case]["batch"], dtype=NY["dtype"],
            steps=NY["steps"], warmup=NY["warmup"]),
    shell:
        "{params.cmd} > {log:q} 2>&1"


def nightly_plan_optimality_cmd():
    """The plan against a small grid around it, interleaved, `repeats` times (paired by repeat), at the nightly's
    dtype, steps and threads; unbound, as the other cases run."""
    po, ny = NIGHTLY_PO, NY
    cmd = [PY, str(WF / "benchmarks" / "plan_optimality.py"), "--out", NIGHTLY_PO_PROGRESS,
           "--hardware", po["hardware"], "--workloads", ",".join(po["workloads"]),
           "--world", ",".join(map(str, po["world"])), "--dtype", ny["dtype"], "--grid", po["grid"],
           "--repeats", str(po["repeats"]), "--steps", str(ny["steps"]), "--warmup", str(ny["warmup"]),
           "--threads", str(ny["threads"] or 0), "--run-timeout", str(config["run_timeout_s"])]
    return shlex.join(cmd)


ruleorder: nightly_plan_optimality > nightly_run  # its file is <case>/rep0.json too


rule nightly_plan_optimality:
    """The planner regression case: its points' planned / best tokens/s go to the history like every metric."""
    output:
        NIGHTLY_PO_FILE,
    log:
        f"{NIGHTLY_DIR}/logs/plan_optimality.log",
    benchmark:
        f"{NIGHTLY_DIR}/benchmarks/plan_optimality.tsv"
    threads: EXCLUSIVE
    resources:
        gpu=1,
    params:
        cmd=lambda wc: nightly_plan_optimality_cmd(),
        progress=NIGHTLY_PO_PROGRESS,
    shell:
        # the script rewrites its progress file after every run; the case's file appears once it is done
        "{params.cmd} > {log:q} 2>&1 && mv {params.progress:q} {output:q}"


rule nightly_check:
    """Record the night's raw values in the history, judge them; exit 1 on a regression only."""
    input:
        NIGHTLY_RECORDS,
    output:
        NIGHTLY_VERDICT,
    log:
        summary=f"{NIGHTLY_DIR}/summary.md",
    params:
        cmd=lambda wc: nightly_check_cmd("training", f"--runs {shlex.quote(NIGHTLY_DIR)} --source {shlex.quote(NIGHTLY_DIR)}",
                                         NIGHTLY_VERDICT, f"{NIGHTLY_DIR}/summary.md"),
    shell:
        "{params.cmd}"


rule nightly_microbench:
    """pytest-benchmark microbenchmarks through the same history and rules, gated on their own."""
    output:
        NIGHTLY_MICRO,
    log:
        run=f"{NIGHTLY_DIR}/logs/microbench.log",
        summary=f"{NIGHTLY_DIR}/microbench-summary.md",
    threads: EXCLUSIVE
    resources:
        gpu=1,
    params:
        json=f"{NIGHTLY_DIR}/microbench/microbench.json",
        check=lambda wc: nightly_check_cmd(
            "microbench", f"--pytest-benchmark {shlex.quote(NIGHTLY_DIR + '/microbench/microbench.json')} "
            f"--source {shlex.quote(NIGHTLY_DIR + '/microbench')}", NIGHTLY_MICRO, f"{NIGHTLY_DIR}/microbench-summary.md"),
    shell:
        # its own pytest session: the variables of a pytest-xdist worker that started this workflow (a test of
        # it) would make pytest-benchmark turn itself off and refuse --benchmark-only
        "mkdir -p {NIGHTLY_DIR}/microbench && env -u PYTEST_XDIST_WORKER -u PYTEST_XDIST_WORKER_COUNT "
        "{PY:q} -m pytest -q -p no:cacheprovider -o addopts= --timeout=600 "
        "{WF}/benchmarks/test_microbench.py --benchmark-only --benchmark-json={params.json:q} > {log.run:q} 2>&1 "
        "&& {params.check}"
