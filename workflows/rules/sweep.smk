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


rule bench_run_multi:
    """A sweep point on several chips (a matrix's `chips`): all ranks in one job, rank 0 writes the record.
    Only points the machine (or the slurm profile's cluster) can hold become jobs; the others are predicted
    (docs/workflow.md, "Several chips")."""
    output:
        f"{RES}/runs_w{{world}}/{{system}}/{{model}}_s{{seq}}_b{{batch}}.json",
    log:
        f"{RES}/logs/runs_w{{world}}/{{system}}/{{model}}_s{{seq}}_b{{batch}}.log",
    benchmark:
        f"{RES}/benchmarks/runs_w{{world}}/{{system}}/{{model}}_s{{seq}}_b{{batch}}.tsv"
    threads: EXCLUSIVE
    resources:
        gpu=1,
        # the slurm executor: one torchrun per node, every GPU of the node (see profiles/slurm)
        nodes=lambda wc: nodes_for(wc.world),
        tasks=lambda wc: nodes_for(wc.world),
        slurm_extra=lambda wc: "'--gpus-per-node={} --ntasks-per-node=1'".format(
            min(int(wc.world), MULTINODE["gpus_per_node"])),
    params:
        settings={k: SW.get(k) for k in ("device", "dtype", "threads", "grad_clip", "checkpointing",
                                         "system_options")} | {"steps": STEPS, "warmup": WARMUP,
                                                                "launcher": LAUNCHER, "multinode": MULTINODE},
        cmd=lambda wc, threads: guard(
            "record", f"{RES}/runs_w{wc.world}/{wc.system}/{wc.model}_s{wc.seq}_b{wc.batch}.json",
            f"{RES}/logs/runs_w{wc.world}/{wc.system}/{wc.model}_s{wc.seq}_b{wc.batch}.guard.log",
            multi_cmd(wc.system, wc.model, wc.seq, wc.batch, wc.world,
                      f"{RES}/runs_w{wc.world}/{wc.system}/{wc.model}_s{wc.seq}_b{wc.batch}.json"),
            launcher=False,  # numactl / taskset would put every rank on one node: --bind-cores splits them
            system=wc.system, model=wc.model, seq=wc.seq, batch=wc.batch, dtype=SW["dtype"],
            steps=STEPS, warmup=WARMUP, world_size=wc.world),
    shell:
        "{params.cmd} > {log:q} 2>&1"


rule bench_run_sp:
    """A sequence-parallel point (a matrix's `sp`): `chips` ranks, every sequence split over `sp` of them
    (Ulysses), `--seq` the global length; the matrix's `offload_checkpoints` / `loss_tile` as flags. Only points
    the machine (or cluster) can hold become jobs; the others are predicted (`snakemake seqlen`,
    docs/workflow.md "Long sequences")."""
    output:
        f"{RES}/runs_w{{world}}/{{system}}/{{model}}_s{{seq}}_b{{batch}}_sp{{sp}}.json",
    log:
        f"{RES}/logs/runs_w{{world}}/{{system}}/{{model}}_s{{seq}}_b{{batch}}_sp{{sp}}.log",
    benchmark:
        f"{RES}/benchmarks/runs_w{{world}}/{{system}}/{{model}}_s{{seq}}_b{{batch}}_sp{{sp}}.tsv"
    threads: EXCLUSIVE
    resources:
        gpu=1,
        nodes=lambda wc: nodes_for(wc.world),
        tasks=lambda wc: nodes_for(wc.world),
        slurm_extra=lambda wc: "'--gpus-per-node={} --ntasks-per-node=1'".format(
            min(int(wc.world), MULTINODE["gpus_per_node"])),
    params:
        settings={k: SW.get(k) for k in ("device", "dtype", "threads", "grad_clip", "checkpointing",
                                         "system_options")} | {"steps": STEPS, "warmup": WARMUP,
                                                                "launcher": LAUNCHER, "multinode": MULTINODE,
                                                                "points": {p: [*sequence_args(r), r["steps"],
                                                                               r["warmup"], r["run_timeout_s"]]
                                                                           for p, r in SEQLEN_BY_PATH.items()}},
        cmd=lambda wc, output: guard(
            "record", output[0],
            f"{RES}/logs/runs_w{wc.world}/{wc.system}/{wc.model}_s{wc.seq}_b{wc.batch}_sp{wc.sp}.guard.log",
            multi_cmd(wc.system, wc.model, wc.seq, wc.batch, wc.world, output[0],
                      point=SEQLEN_BY_PATH.get(output[0], {"sp": int(wc.sp)})),
            launcher=False, timeout=SEQLEN_BY_PATH.get(output[0], {}).get("run_timeout_s"),
            system=wc.system, model=wc.model, seq=wc.seq, batch=wc.batch, dtype=SW["dtype"],
            steps=SEQLEN_BY_PATH.get(output[0], {}).get("steps", STEPS),
            warmup=SEQLEN_BY_PATH.get(output[0], {}).get("warmup", WARMUP), world_size=wc.world, sp=wc.sp),
    shell:
        "{params.cmd} > {log:q} 2>&1"
