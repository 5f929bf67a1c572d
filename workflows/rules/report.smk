# Figures (deterministic SVG) and the self-contained HTML report of the selected sweep.

FIGURES_DIR = f"{RES}/figures"
REPORT_HTML = f"{RES}/report.html"
REPORT_INPUTS = [*RUN_RECORDS, *MULTI_RECORDS, *ABLATION_RECORDS, f"{RES}/ablation/variants.json", *MICROBENCH_FILES,
                 CALIBRATION_FILE, *PREDICTION_FILES, f"{RES}/sweep.json",
                 f"{RES}/provenance/provenance.json"]


rule render_figures:
    input:
        REPORT_INPUTS,
    output:
        report(directory(FIGURES_DIR), patterns=["{name}.svg"], caption="../report/figures.rst",
               category="Figures"),
    log:
        f"{RES}/logs/figures.log",
    shell:
        "{PY:q} {REPORTS}/render.py figures --results {RES} --out {output:q} > {log:q} 2>&1"


rule render_report:
    input:
        REPORT_INPUTS,
        FIGURES_DIR,
    output:
        report(REPORT_HTML, caption="../report/report.rst", category="Report"),
    log:
        f"{RES}/logs/report.log",
    shell:
        "{PY:q} {REPORTS}/render.py html --results {RES} --figures {FIGURES_DIR} --out {output:q} > {log:q} 2>&1"
