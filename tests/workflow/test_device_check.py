"""scripts/device_check.sh, the prepared GPU comparison, rehearsed on this CPU so it cannot rot between draws.

The short rehearsal (REHEARSE=short: one tiny point, torch and superoffload, an infeasible probe, the launch
counters, the report) runs once per session (~55 s on a quiet 2-core machine, most of it the start of its ten
Python processes), with one stand-in wheel in its wheel folder, and its files are checked as a lent machine
would send them back: at most 8 files with plain names, every system's
record with telemetry and provenance, the refused point kept as "infeasible by design", the report
self-contained and opening with the comparison. The pieces it is built from (the refusal record, the NVML
identity, the goals, the GH200 point predictions, the report's telemetry columns) are checked directly with
stand-ins.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from reports import gpu_check
from superoffload.harness import gpu_identity, not_run, record
from superoffload.harness.system import RunConfig

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "device_check.sh"
PLAIN = re.compile(r"^[A-Za-z0-9._-]+$")  # the names a lent machine sends back
REFUSAL = ("superoffload bench run: error: torch on gpt-5b (seq 1024, batch 8) needs about 91.3 GiB of device "
           "memory (the cost model's estimate of weights, optimizer state, gradients and activations) but 78.6 "
           "GiB is available; choose a smaller model, micro-batch or sequence\n")


def _run(out: Path, mode: str = "short", timeout: float = 420, wheels: Path | None = None,
         site: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "REHEARSE": mode, "OUT": str(out), "PY": sys.executable,
           "WHEELS": str(wheels or out / "none"), "DEVICE_CHECK_SITE": str(site or out / "site")}
    return subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def _probe_wheel(folder: Path) -> Path:
    """A pure-Python wheel of one module, dc_probe, standing in for the wheels gpu_wheels.sh fetches."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "dc_probe-1.0-py3-none-any.whl"
    files = {"dc_probe/__init__.py": "WHERE = __file__\n",
             "dc_probe-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: dc_probe\nVersion: 1.0\n",
             "dc_probe-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                             "Tag: py3-none-any\n"}
    files["dc_probe-1.0.dist-info/RECORD"] = "".join(f"{n},,\n" for n in files) + "dc_probe-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return folder


@pytest.fixture(scope="module")
def short(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, subprocess.CompletedProcess]:
    """(what came back, the tarball unpacked, the process) of one short rehearsal."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("the rehearsal is the CPU form; on a GPU machine the script is the real run")
    out = tmp_path_factory.mktemp("device_out")
    scratch = tmp_path_factory.mktemp("scratch")
    proc = _run(out, wheels=_probe_wheel(scratch / "whl"), site=scratch / "site")
    unpacked = tmp_path_factory.mktemp("records")
    if (out / "records.tar.gz").is_file():
        with tarfile.open(out / "records.tar.gz") as tar:
            tar.extractall(unpacked, filter="data")
    return out, unpacked, proc


def test_at_most_eight_files_with_plain_names_come_back(short) -> None:
    out, _, proc = short
    assert proc.returncode == 0, proc.stderr[-3000:]
    names = sorted(p.name for p in out.rglob("*"))
    assert len(names) <= 8 and all(PLAIN.match(n) for n in names), names
    assert set(gpu_check.OUT_FILES) <= set(names), names


def test_every_system_has_its_record_with_telemetry_and_provenance(short) -> None:
    _, unpacked, _ = short
    runs = unpacked / "results" / "runs"
    for system in ("torch", "superoffload"):
        path = runs / system / "gpt-tiny_s64_b2.json"
        rec = json.loads(path.read_text())
        record.validate(rec)
        assert rec["status"] == "ok", rec["error"]
        tel = rec["telemetry"]
        assert {"gpu", "no_gpu_reason", "host", "samples", "interval_s"} <= set(tel)
        assert {"cpu_pct_mean", "rss_bytes_peak"} <= set(tel["host"])
        assert tel["gpu"] is None and tel["no_gpu_reason"]  # the CPU rehearsal says why there is no NVML
        prov = rec["provenance"]
        assert prov["torch"] and prov["git_commit"] and prov["grace_adam"], prov
        assert len(rec["timing"]["step_times_s"]) == 5 and len(rec["timing"]["warmup_times_s"]) == 2
    ours = json.loads((runs / "superoffload" / "gpt-tiny_s64_b2.json").read_text())
    # ~0.4 s of steps at one sample per 0.1 s (torch's ~0.15 s may fall between two samples)
    assert ours["provenance"]["device"] and ours["telemetry"]["samples"] >= 1
    assert ours["telemetry"]["host"]["cpu_pct_mean"] is not None and ours["telemetry"]["host"]["rss_bytes_peak"]


def test_the_point_that_cannot_fit_is_kept_as_infeasible_not_as_an_error(short) -> None:
    _, unpacked, _ = short
    rec = json.loads((unpacked / "results" / "runs" / "torch" / "gpt-100b_s1024_b8.json").read_text())
    record.validate(rec)
    assert rec["status"] == "oom" and rec["error"].startswith(not_run.PREFIX)
    assert rec["not_run"]["reason"] == "infeasible" and rec["not_run"]["memory"] == "host"


def test_the_report_renders_without_remote_assets_and_opens_with_the_comparison(short) -> None:
    out, _, _ = short
    html = (out / "report.html").read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", html, re.I)
    assert not re.search(r"url\(\s*['\"]?\s*(https?:)?//", html, re.I)
    assert not re.search(r"<(script|link|iframe)[^>]*\s(src|href)\s*=", html, re.I)
    body = html[html.index("<body>"):]
    first = body.index("SuperOffload against each peer, measured here, beside the GH200 prediction")
    assert first < body.index("SuperOffload benchmark report")  # the workflow's report follows it
    table = body[first:body.index("Every run, with its telemetry")]
    assert "gpt-tiny seq 64 batch 2" in table and "PyTorch, no offload" in table
    assert "predicted, one GH200, same point" in table and "infeasible by design (not run)" in table


def test_the_summary_and_comparison_put_the_systems_side_by_side(short) -> None:
    out, _, _ = short
    cmp = json.loads((out / "comparison.json").read_text())
    fits = next(p for p in cmp["points"] if p["role"] == "fits")
    assert set(fits["runs"]) == {"torch", "superoffload"} and "torch" in fits["ratios"]
    assert fits["planned"] == ["torch", "superoffload"] and fits["gh200"]["torch"]["ratio"] > 0
    assert [g["peer"] for g in cmp["goals"]] == ["torch"] and cmp["goals"][0]["verdict"] in ("met", "not met")
    assert cmp["goals"][0]["gh200_ratio"] == fits["gh200"]["torch"]["ratio"] and cmp["commit"]
    steps = {s["name"]: s for s in cmp["steps"]}
    assert steps["identity"]["status"] == "ok" and steps["gh200_points"]["status"] == "ok"
    assert steps["total"]["used_s"] <= 240 + 30  # the short mode's budget (TOTAL_S) and the report after it
    launch = steps["launch_costs"]["status"]
    assert launch == ("ok" if (ROOT / "benchmarks" / "launch_costs.py").is_file() else "not run: absent")
    summary = (out / "summary.txt").read_text()
    assert "budget plan (mode short)" in summary and "SuperOffload / torch" in summary


def test_the_launch_counters_come_back_with_the_engine_beside_torch(short) -> None:
    """benchmarks/launch_costs.py on the tiny model (sim): its JSON in the records, its headline in the summary."""
    out, unpacked, _ = short
    if not (ROOT / "benchmarks" / "launch_costs.py").is_file():
        pytest.skip("benchmarks/launch_costs.py is not in this tree")
    data = json.loads((unpacked / "results" / "microbench" / "launch_costs.json").read_text())
    assert data["status"] == "ok", data.get("error")
    assert data["device"] == "sim" and data["engine_aten_ops_per_step"] > 0 and data["torch_aten_ops_per_step"] > 0
    assert data["buckets_host"] + data["buckets_device"] >= 1 and data["steady"] is True
    summary = (out / "summary.txt").read_text()
    assert "launch counters: ok" in summary and "engine_aten_ops_per_step" in summary


def test_the_wheels_are_installed_into_a_target_on_the_path(short) -> None:
    out, unpacked, _ = short
    steps = {s["name"]: s for s in json.loads((out / "comparison.json").read_text())["steps"]}
    assert steps["wheels"]["status"] == "ok" and "1 wheels" in steps["wheels"]["note"]
    log = (unpacked / "log.txt").read_text()
    path = re.search(r"PYTHONPATH=(\S+)", log).group(1).split(":")
    assert (Path(path[0]) / "dc_probe" / "__init__.py").is_file() and str(ROOT) in path


def test_a_folder_with_other_files_is_refused_before_any_work(tmp_path: Path) -> None:
    (tmp_path / "notes.md").write_text("mine")
    proc = _run(tmp_path, timeout=30)
    assert proc.returncode == 2 and "holds notes.md" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.md"]


def test_a_bad_mode_is_refused(tmp_path: Path) -> None:
    proc = _run(tmp_path, mode="yes", timeout=30)
    assert proc.returncode == 2 and "REHEARSE must be 1 or short" in proc.stderr


# --- the pieces ------------------------------------------------------------------------------------------------
def test_the_memory_refusal_becomes_an_oom_record_and_nothing_else_does() -> None:
    run = RunConfig(system="torch", model="gpt-5b", seq=1024, batch=8, precision="bf16", steps=5, warmup=2,
                    activation_checkpointing=True, device="host")
    rec = not_run.not_run_record(run, REFUSAL, "NVIDIA H100 80GB HBM3")
    record.validate(rec)
    assert rec["status"] == "oom" and rec["timing"] is None and rec["provenance"]["device"] == "NVIDIA H100 80GB HBM3"
    assert rec["error"] == not_run.PREFIX + REFUSAL.removeprefix("superoffload bench run: error: ").strip()
    assert {k: rec["not_run"][k] for k in ("reason", "memory", "need", "available")} == \
        {"reason": "infeasible", "memory": "device", "need": "91.3 GiB", "available": "78.6 GiB"}
    assert not_run.not_run_record(run, "RuntimeError: CUDA error: an illegal memory access") is None
    assert not_run.not_run_record(run, "superoffload bench run: error: unknown model 'gpt-5'") is None


def test_not_run_cli_takes_bench_run_options_and_refuses_other_failures(tmp_path: Path) -> None:
    msg = tmp_path / "err.txt"
    msg.write_text(REFUSAL)
    out = tmp_path / "r.json"
    argv = ["--message-file", str(msg), "--out", str(out), "--system", "torch", "--model", "gpt-5b", "--seq",
            "1024", "--batch", "8", "--precision", "bf16", "--checkpointing", "--grad-clip", "1.0",
            "--init-device", "host", "--no-progress"]
    assert not_run.main(argv) == 0
    rec = json.loads(out.read_text())
    assert rec["run"]["grad_clip"] == 1.0 and rec["run"]["seq"] == 1024 and rec["run"]["dtype"] == "bf16"
    msg.write_text("Traceback ...\nValueError: something else\n")
    out.unlink()
    assert not_run.main(argv) == 3 and not out.exists()


class FakeNVML:
    """pynvml's names, answering as an H100 over PCIe would, or as a GH200 (C2C on)."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0

    def __init__(self, c2c: bool) -> None:
        self.c2c = c2c

    def nvmlDeviceGetHandleByIndex(self, i):  # noqa: N802 - pynvml's names
        return f"h{i}"

    def nvmlDeviceGetCount(self):  # noqa: N802
        return 1

    def nvmlDeviceGetName(self, h):  # noqa: N802
        return b"NVIDIA GH200 480GB" if self.c2c else b"NVIDIA H100 80GB HBM3"

    def nvmlSystemGetDriverVersion(self):  # noqa: N802
        return "580.159.04"

    def nvmlSystemGetCudaDriverVersion_v2(self):  # noqa: N802
        return 13000

    def nvmlDeviceGetMemoryInfo(self, h):  # noqa: N802
        return SimpleNamespace(total=81559 * 2**20, used=512 * 2**20)

    def nvmlDeviceGetClockInfo(self, h, kind):  # noqa: N802
        return {1: 1755, 2: 2619}[kind]

    def nvmlDeviceGetMaxClockInfo(self, h, kind):  # noqa: N802
        return {1: 1980, 2: 2619}[kind]

    def nvmlDeviceGetEnforcedPowerLimit(self, h):  # noqa: N802
        return 700000

    def nvmlDeviceGetCudaComputeCapability(self, h):  # noqa: N802
        return (9, 0)

    def nvmlDeviceGetC2cModeInfoV(self, h):  # noqa: N802
        if not self.c2c:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return SimpleNamespace(isC2cEnabled=1)

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):  # noqa: N802
        return 5

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):  # noqa: N802
        return 16

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):  # noqa: N802
        return 5

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):  # noqa: N802
        return 16


@pytest.mark.parametrize("c2c", [False, True])
def test_the_identity_reads_what_nvml_answers_and_lists_what_it_does_not(c2c: bool) -> None:
    g = gpu_identity.gpu_identity(FakeNVML(c2c))
    assert g["name"] == ("NVIDIA GH200 480GB" if c2c else "NVIDIA H100 80GB HBM3")
    assert g["memory_total_mib"] == 81559 and g["cuda_driver"] == "13.0" and g["compute_capability"] == "9.0"
    assert g["power_limit_w"] == 700.0 and g["clocks"]["sm_max_mhz"] == 1980
    assert g["link"]["kind"] == ("c2c" if c2c else "pcie") and g["link"]["pcie_width"] == 16
    assert ("c2c_mode" in g["unsupported"]) != c2c
    assert {"uuid", "pstate", "mig_mode", "clock_sm_app"} <= set(g["unsupported"])
    line = gpu_identity.describe({"gpu": g})
    assert ("NVLink-C2C" in line) == c2c and ("PCIe gen5 x16" in line) != c2c


def _point(role: str, ours: float | None, **peers: float | None) -> dict:
    runs = {"superoffload": {"tokens_per_s": ours, "status": "ok" if ours else "error"}}
    runs |= {p: {"tokens_per_s": v, "status": "ok" if v else "oom"} for p, v in peers.items()}
    ratios = {p: ours / v for p, v in peers.items() if ours and v}
    return {"role": role, "model": "m", "seq": 1, "batch": 1, "runs": runs, "ratios": ratios}


def test_the_goals_are_the_issues_with_their_bounds() -> None:
    got = gpu_check.goals([_point("fits", 95.0, torch=100.0),
                           _point("offload", 150.0, zero_offload=100.0, fsdp_offload=150.0, ds_superoffload=None),
                           _point("probe", 1.0, torch=None)])
    verdicts = {(g["peer"], g["verdict"]) for g in got}
    assert verdicts == {("torch", "met"), ("zero_offload", "met"), ("fsdp_offload", "not met"),
                        ("ds_superoffload", "not measured: superoffload ok, ds_superoffload oom")}
    assert gpu_check.goals([_point("fits", 94.0, torch=100.0)])[0]["verdict"] == "not met"


def test_the_gh200_point_predictions_price_every_point_and_say_what_they_cannot(tmp_path: Path) -> None:
    points = tmp_path / "points.tsv"
    points.write_text("fits gpt-1b 1024 8\noffload gpt-5b 4096 2\nprobe gpt-100b 1024 8\nfits gpt-1b 1024 8\n")
    out = tmp_path / "gh200.json"
    proc = subprocess.run([sys.executable, str(ROOT / "workflows/scripts/point_predictions.py"), "--points",
                           str(points), "--systems", "superoffload,zero_offload,nosuch", "--out", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["status"] == "ok" and data["hardware"] == "gh200"
    rows = {(r["model"], r["seq"], r["system"]): r for r in data["rows"]}
    assert len(data["rows"]) == 9  # the repeated point once
    assert "unknown system" in rows[("gpt-1b", 1024, "nosuch")]["error"]
    assert rows[("gpt-1b", 1024, "superoffload")]["fits"] and rows[("gpt-1b", 1024, "superoffload")]["step_s"] > 0
    assert not rows[("gpt-100b", 1024, "zero_offload")]["fits"]  # 100B of fp32 state: more than 480 GB of host
    by = gpu_check.predicted_ratios({r["system"]: r for r in data["rows"] if r["model"] == "gpt-100b"})
    assert by["zero_offload"]["ratio"] is None and "would not fit" in by["zero_offload"]["note"]
    assert by["nosuch"]["ratio"] is None and "unknown system" in by["nosuch"]["note"]
    ok = gpu_check.predicted_ratios({r["system"]: r for r in data["rows"] if r["model"] == "gpt-1b"})
    assert ok["zero_offload"]["ratio"] == pytest.approx(rows[("gpt-1b", 1024, "superoffload")]["tokens_per_s"]
                                                         / rows[("gpt-1b", 1024, "zero_offload")]["tokens_per_s"])


def test_the_report_shows_nvml_telemetry_of_a_gpu_run(short, tmp_path: Path) -> None:
    """A GPU run's telemetry (a CPU record given NVML's numbers) reaches the report's run table."""
    _, unpacked, _ = short
    work = tmp_path / "work"
    (work / "results" / "runs").mkdir(parents=True)
    for name in ("points.tsv", "planned.tsv", "steps.tsv", "env.json"):
        (work / name).write_text((unpacked / name).read_text())
    for system in ("torch", "superoffload"):
        rec = json.loads((unpacked / "results" / "runs" / system / "gpt-tiny_s64_b2.json").read_text())
        rec["telemetry"]["gpu"] = {"util_pct_mean": 87.5, "power_w_mean": 612.0, "mem_used_bytes_peak": 40 * 2**30,
                                   "sm_clock_mhz_mean": 1980.0, "pcie_tx_kbps_mean": 2.0e7,
                                   "pcie_rx_kbps_mean": 3.0e7, "energy_j_per_step": 123.0, "unsupported": []}
        record.write_record(work / "results" / "runs" / system / "gpt-tiny_s64_b2.json", rec)
    out = gpu_check.render_html(work, "1", work / "report.html")
    html = out.read_text()
    runs = html[html.index("Every run, with its telemetry"):html.index("The check itself")]
    for header, value in (("GPU util %", "87.5"), ("power W", "612"), ("GPU mem GiB (NVML)", "40.0"),
                          ("PCIe rx/tx GB/s", "30.0 / 20.0"), ("J/step", "123")):
        assert header in runs and value in runs, (header, value)
    assert "A rehearsal on this CPU (REHEARSE=1)" in html
