# Cost-model predictions: `superoffload explain` per point, and the planner's predicted paper figures
# (superoffload.planner.paper.paper_comparison) with the preset hardware profile they assume.

PRED = SW["predictions"]
EXPLAIN_FILES = [f"{RES}/predictions/explain/{p['model']}_s{p['seq']}_b{p['batch']}.json"
                 for p in PRED["points"]]
PREDICTION_FILES = [f"{RES}/predictions/paper_comparison.json", *EXPLAIN_FILES]


rule explain:
    output:
        f"{RES}/predictions/explain/{{model}}_s{{seq}}_b{{batch}}.json",
    log:
        f"{RES}/logs/predictions/explain_{{model}}_s{{seq}}_b{{batch}}.log",
    params:
        cmd=lambda wc: guard(
            "stdout-json", f"{RES}/predictions/explain/{wc.model}_s{wc.seq}_b{wc.batch}.json",
            f"{RES}/logs/predictions/explain_{wc.model}_s{wc.seq}_b{wc.batch}.guard.log",
            [*CLI, "explain", "--model", wc.model, "--seq", wc.seq, "--batch", wc.batch,
             "--hardware", PRED["hardware"], "--json"],
            what="explain"),
    shell:
        "{params.cmd} > {log:q} 2>&1"


rule paper_comparison:
    output:
        f"{RES}/predictions/paper_comparison.json",
    log:
        f"{RES}/logs/predictions/paper_comparison.log",
    params:
        hardware=PRED["hardware"],
    shell:
        "{PY:q} {SCRIPTS}/predictions.py --hardware {params.hardware} --out {output:q} > {log:q} 2>&1"
