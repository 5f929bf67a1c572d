# The sweep: one job per (system, model, seq, batch), one JSON run record each.


rule bench_run:
    output:
        f"{RES}/runs/{{system}}/{{model}}_s{{seq}}_b{{batch}}.json",
    log:
        f"{RES}/logs/runs/{{system}}/{{model}}_s{{seq}}_b{{batch}}.log",
    benchmark:
        f"{RES}/benchmarks/runs/{{system}}/{{model}}_s{{seq}}_b{{batch}}.tsv"
    threads: EXCLUSIVE
    resources:
        gpu=1,
    params:
        # static (non-callable) params are what Snakemake's params rerun trigger compares: a change of the
        # sweep's run settings reruns the runs
        settings={k: SW.get(k) for k in ("device", "dtype", "threads", "grad_clip", "checkpointing",
                                         "system_options")} | {"steps": STEPS, "warmup": WARMUP,
                                                                "launcher": LAUNCHER},
        cmd=lambda wc, threads: guard(
            "record", f"{RES}/runs/{wc.system}/{wc.model}_s{wc.seq}_b{wc.batch}.json",
            f"{RES}/logs/runs/{wc.system}/{wc.model}_s{wc.seq}_b{wc.batch}.guard.log",
            bench_cmd(wc.system, wc.model, wc.seq, wc.batch, STEPS, WARMUP,
                      SW.get("system_options", {}).get(wc.system, {}), threads=SW["threads"])
            + ["--out", f"{RES}/runs/{wc.system}/{wc.model}_s{wc.seq}_b{wc.batch}.json"],
            system=wc.system, model=wc.model, seq=wc.seq, batch=wc.batch, dtype=SW["dtype"],
            steps=STEPS, warmup=WARMUP),
    shell:
        "{params.cmd} > {log:q} 2>&1"
