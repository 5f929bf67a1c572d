# SuperOffload benchmark workflow (Snakemake 9). Targets: all (default), figures, seqlen, ablation, nightly,
# calibrate, report, convergence, plan_optimality. See docs/workflow.md.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


report: "workflows/report/workflow.rst"


include: "workflows/rules/common.smk"
include: "workflows/rules/provenance.smk"
include: "workflows/rules/sweep.smk"
include: "workflows/rules/microbench.smk"
include: "workflows/rules/predict.smk"
include: "workflows/rules/ablation.smk"
include: "workflows/rules/report.smk"
include: "workflows/rules/nightly.smk"
include: "workflows/rules/convergence.smk"
include: "workflows/rules/seqlen.smk"
include: "workflows/rules/optimality.smk"


# Aggregation, predictions and rendering never go to a cluster scheduler.
localrules:
    all,
    figures,
    ablation,
    report,
    calibrate,
    nightly,
    sweep_info,
    provenance,
    ablation_variants,
    explain,
    paper_comparison,
    render_figures,
    render_report,
    nightly_check,
    convergence,
    seqlen,
    plan_optimality,


rule all:
    default_target: True
    input:
        REPORT_HTML,
        PROVENANCE_FILES,
        SEQLEN_FIGURE,


rule figures:
    input:
        FIGURES_DIR,


rule seqlen:
    input:
        SEQLEN_RECORDS,
        SEQLEN_FIGURE,


rule ablation:
    input:
        ABLATION_RECORDS,
        f"{RES}/ablation/variants.json",


rule calibrate:
    input:
        CALIBRATION_FILE,


rule report:
    input:
        REPORT_HTML,


rule nightly:
    input:
        NIGHTLY_TARGET,


rule convergence:
    input:
        CONVERGENCE_FILE,
        CONVERGENCE_FIGURE,


rule plan_optimality:
    input:
        PLAN_OPTIMALITY_FILE,


onstart:
    print_selection()
