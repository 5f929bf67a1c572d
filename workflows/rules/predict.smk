# Cost-model predictions: `superoffload explain` per point, and the planner's predicted paper figures
# (superoffload.planner.paper.paper_comparison) with the preset hardware profile they assume.

PRED = SW["predictions"]
EXPLAIN_FILES = [f"{RES}/predictions/explain/{p['model']}_s{p['seq']}_b{p['batch']}.json"
                 for p in PRED["points"]]
VALIDATION_FILE = f"{RES}/predictions/validation.json"
PREDICTION_FILES = [f"{RES}/predictions/paper_comparison.json", *EXPLAIN_FILES, VALIDATION_FILE]


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
        figures=f"--figures {','.join(PRED['figures'])}" if PRED.get("figures") else "",
    shell:
        "{PY:q} {SCRIPTS}/predictions.py --hardware {params.hardware} {params.figures} --out {output:q} > {log:q} 2>&1"


rule validate_cost_model:
    """The cost model with this machine's calibrated profile against this sweep's run records (the
    "Validation against measurement" of docs/cost_model.md: reported, never tuned)."""
    input:
        RUN_RECORDS,
        CALIBRATION_FILE,
    output:
        VALIDATION_FILE,
    log:
        f"{RES}/logs/predictions/validation.log",
    params:
        cmd=lambda wc: guard(
            "json", VALIDATION_FILE, f"{RES}/logs/predictions/validation.guard.log",
            [*CLI, "validate", f"{RES}/runs", "--hardware", CALIBRATION_FILE, "--out", VALIDATION_FILE],
            what="validate"),
    shell:
        "{params.cmd} > {log:q} 2>&1"
