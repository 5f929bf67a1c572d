# Nightly regression check: a small fixed matrix, each case run `repeats` times (serially, gpu=1),
# compared with benchmarks/reference/nightly-<hardware key>.json by reports/nightly.py.
# Each invocation measures afresh: results go to results/nightly/<hardware key>/<UTC stamp>/.

NY = config["nightly"]
NIGHTLY_VERDICT = f"{NIGHTLY_DIR}/verdict.json"
NIGHTLY_MICRO = f"{NIGHTLY_DIR}/microbench-verdict.json"
NIGHTLY_TARGET = [NIGHTLY_VERDICT, NIGHTLY_MICRO]
UPDATE = "--update" if NIGHTLY_UPDATE else ""


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


rule nightly_compare:
    """Prints the table; exits non-zero on a regression (or writes the reference with --update)."""
    input:
        NIGHTLY_RECORDS,
    output:
        NIGHTLY_VERDICT,
    params:
        threshold=NY["threshold_pct"],
        sigma=NY["sigma"],
    shell:
        "{PY:q} {REPORTS}/nightly.py compare --runs {NIGHTLY_DIR} --reference {NIGHTLY_REFERENCE:q} "
        "--hardware-key {HW_KEY} --threshold-pct {params.threshold} --sigma {params.sigma} "
        "--out {output:q} {UPDATE}"


rule nightly_microbench:
    """pytest-benchmark microbenchmarks, compared with the saved baseline of this hardware key."""
    output:
        NIGHTLY_MICRO,
    log:
        f"{NIGHTLY_DIR}/logs/microbench.log",
    threads: EXCLUSIVE
    resources:
        gpu=1,
    params:
        threshold=NY["threshold_pct"],
        sigma=NY["sigma"],
    shell:
        "{PY:q} {REPORTS}/nightly.py microbench --storage {WF}/benchmarks/reference/pytest-benchmark/{HW_KEY} "
        "--work-dir {NIGHTLY_DIR}/microbench --threshold-pct {params.threshold} --sigma {params.sigma} "
        "--out {output:q} {UPDATE}"
