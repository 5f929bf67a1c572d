# Long sequences (the paper's Fig 12; `snakemake seqlen`, part of `all`): the sweep's sequence-parallel points
# (matrices with `sp`), measured where the machine has their chips (rule bench_run_sp) and otherwise
# predicted by the cost model (paper_comparison's fig12 rows), drawn as one figure: MFU per device vs the
# global sequence length per system and chip count, with the paper's 55% at 1M tokens on 8 GH200.

SEQLEN_FIGURE = f"{RES}/seqlen/seqlen.svg"


rule seqlen_figure:
    input:
        SEQLEN_RECORDS,
        f"{RES}/predictions/paper_comparison.json",
        f"{RES}/sweep.json",
    output:
        SEQLEN_FIGURE,
    log:
        f"{RES}/logs/seqlen_figure.log",
    shell:
        "{PY:q} {REPORTS}/render.py figure seqlen --results {RES} --out {output:q} > {log:q} 2>&1"


localrules:
    seqlen_figure,
