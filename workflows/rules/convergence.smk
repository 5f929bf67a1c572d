# The convergence check (docs/finetune.md): gpt-tiny for 300 steps on byte-tokenized Python standard
# library source, with the engine (speculation forced on, clipping at 1.0) and with plain torch AdamW;
# both loss curves land in one schema-validated file, drawn by reports/figures/convergence.py.
# Its own target (`snakemake convergence`), not part of `all`: on a loaded 2-core machine it can take
# well over a minute. The report picks the figure up when it is re-rendered afterwards.

CONVERGENCE_FILE = f"{RES}/convergence/convergence.json"
CONVERGENCE_FIGURE = f"{RES}/convergence/convergence.svg"


rule convergence_check:
    output:
        CONVERGENCE_FILE,
    log:
        f"{RES}/logs/convergence.log",
    benchmark:
        f"{RES}/benchmarks/convergence.tsv"
    threads: EXCLUSIVE
    resources:
        gpu=1,
    params:
        cmd=lambda wc: guard(
            "json", CONVERGENCE_FILE, f"{RES}/logs/convergence.guard.log",
            [PY, "-m", "superoffload.finetune.convergence", "--out", CONVERGENCE_FILE]
            + (["--threads", str(SW["threads"])] if SW.get("threads") else []),
            what="convergence"),
    shell:
        "{params.cmd} > {log:q} 2>&1"


rule convergence_figure:
    input:
        CONVERGENCE_FILE,
    output:
        CONVERGENCE_FIGURE,
    log:
        f"{RES}/logs/convergence_figure.log",
    shell:
        "{PY:q} {REPORTS}/render.py figure convergence --results {RES} --out {output:q} > {log:q} 2>&1"


localrules:
    convergence_figure,
