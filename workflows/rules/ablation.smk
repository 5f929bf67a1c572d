# Ablation of the superoffload system: cumulative (baseline -> +each technique in order) and
# leave-one-out (all on, one off) runs, plus alternatives (e.g. host_optimizer=cpuadam).

AB = SW["ablation"]


rule ablation_variants:
    output:
        f"{RES}/ablation/variants.json",
    params:
        info={"system": config["ablation"]["system"], "model": AB["model"], "seq": AB["seq"],
              "dtype": AB["dtype"] or SW["dtype"],
              "batch": AB["batch"], "order": config["ablation"]["order"],
              "techniques": config["ablation"]["techniques"], "variants": ABLATION},
    run:
        Path(output[0]).parent.mkdir(parents=True, exist_ok=True)
        Path(output[0]).write_text(json.dumps(params.info, indent=2, sort_keys=True) + "\n")


rule ablation_run:
    output:
        f"{RES}/ablation/{{variant}}.json",
    wildcard_constraints:
        variant="|".join(re.escape(v) for v in ABLATION_MEASURED),
    log:
        f"{RES}/logs/ablation/{{variant}}.log",
    benchmark:
        f"{RES}/benchmarks/ablation/{{variant}}.tsv"
    threads: EXCLUSIVE
    resources:
        gpu=1,
    params:
        settings={"ablation": AB, "system": config["ablation"]["system"], "variants": ABLATION,
                  "dtype": SW["dtype"], "steps_override": config["steps_override"],
                  "warmup_override": config["warmup_override"], "launcher": LAUNCHER},
        cmd=lambda wc, threads: guard(
            "record", f"{RES}/ablation/{wc.variant}.json", f"{RES}/logs/ablation/{wc.variant}.guard.log",
            bench_cmd(config["ablation"]["system"], AB["model"], AB["seq"], AB["batch"],
                      config["steps_override"] or AB["steps"],
                      AB["warmup"] if config["warmup_override"] is None else config["warmup_override"],
                      ABLATION[wc.variant]["options"], threads=SW["threads"],
                      dtype=AB["dtype"] or SW["dtype"])
            + ["--out", f"{RES}/ablation/{wc.variant}.json"],
            system=config["ablation"]["system"], model=AB["model"], seq=AB["seq"], batch=AB["batch"],
            dtype=AB["dtype"] or SW["dtype"], steps=config["steps_override"] or AB["steps"], warmup=AB["warmup"]),
    shell:
        "{params.cmd} > {log:q} 2>&1"


# A variant with the options of an earlier one (common.smk: ablation_variants' `same_as`) is not measured
# again: its record is that run's, copied under its own name.
rule ablation_same:
    input:
        lambda wc: f"{RES}/ablation/{ABLATION[wc.variant]['same_as']}.json",
    output:
        f"{RES}/ablation/{{variant}}.json",
    wildcard_constraints:
        variant="|".join(re.escape(v) for v, d in ABLATION.items() if "same_as" in d) or "(?!)",
    run:
        tmp = Path(output[0] + ".tmp")
        shutil.copyfile(input[0], tmp)
        tmp.replace(output[0])

