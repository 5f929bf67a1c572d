# Provenance of a results folder, captured once: pip freeze, nvidia-smi -q (when present), git commit,
# the hardware detection and the sweep selection.

PROVENANCE_FILES = [f"{RES}/provenance/provenance.json", f"{RES}/provenance/pip_freeze.txt",
                    f"{RES}/provenance/nvidia_smi.txt"]


rule provenance:
    output:
        PROVENANCE_FILES,
    log:
        f"{RES}/logs/provenance.log",
    shell:
        "{PY:q} {SCRIPTS}/provenance.py --out-dir {RES}/provenance > {log:q} 2>&1"


rule sweep_info:
    """What ran and why: the selected sweep, the reason, the hardware, the effective settings."""
    output:
        f"{RES}/sweep.json",
    params:
        info={"sweep": SWEEP, "reason": SWEEP_REASON, "hardware": HW, "settings": SW, "steps": STEPS,
              "warmup": WARMUP, "launcher": LAUNCHER, "only_systems": sorted(ONLY),
              "only_models": sorted(ONLY_MODELS), "runs": RUNS,
              "multi_runs": MULTI_RUNS, "predicted_runs": PREDICTED_RUNS,
              "chips_available": CHIPS_AVAILABLE, "chips_reason": CHIPS_REASON, "multinode": MULTINODE,
              "hardware_key": HW_KEY},
    run:
        Path(output[0]).parent.mkdir(parents=True, exist_ok=True)
        Path(output[0]).write_text(json.dumps(params.info, indent=2, sort_keys=True) + "\n")
