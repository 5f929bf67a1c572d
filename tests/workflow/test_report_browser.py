"""The report as a person sees it: headless Chromium opens the smoke sweep's report (the end-to-end run's,
shared through the session's `smoke_results`, so no second sweep runs), takes a screenshot, and the test
fails on console errors, images that do not load, tables wider than the page, and any `None`, `nan` or
`[MISSING]` in the visible text or the figures.

Chromium is driven by reports/browser.py (Debian's chromium + chromium-driver through Selenium's WebDriver:
the W3C protocol, matched browser and driver versions, console logs and in-page probes without protocol code
of our own; its docstring says why). Without Chromium the tests skip with the reason; CI sets
SUPEROFFLOAD_REQUIRE_CHROMIUM=1 (.ci/run installs the packages), and there a missing browser fails them.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from wf_helpers import _record

from reports import browser as B
from reports import render as R


def _browser_or_skip() -> None:
    why = B.browser_paths()
    if isinstance(why, str):
        if os.environ.get("SUPEROFFLOAD_REQUIRE_CHROMIUM") == "1":
            pytest.fail(f"SUPEROFFLOAD_REQUIRE_CHROMIUM=1 but {why}")
        pytest.skip(f"headless Chromium not available: {why}")


def test_the_checker_sees_what_a_reader_would(tmp_path: Path):
    """A page with each fault: the checker names every one (so a clean report is clean, not unchecked)."""
    _browser_or_skip()
    page = tmp_path / "bad.html"
    page.write_text(
        "<!DOCTYPE html><html><body style='margin:0'>"
        "<p>peak device: None</p>"
        "<details><summary>closed</summary><p>MFU nan</p><table style='width:3000px'><tr><td>x</td></tr></table>"
        "</details>"
        "<p>[MISSING]</p><img alt='gone' src='does-not-exist.png'><pre>" + "x" * 300 + "</pre>"
        "<script>console.error('deliberate failure')</script>"
        "</body></html>")
    found = B.check(page, screenshot=tmp_path / "bad.png", width=800, height=600)
    problems = "\n".join(found.problems)
    assert any("deliberate failure" in e for e in found.console_errors), problems
    assert found.broken_images == ["gone"], problems
    assert len(found.wide_tables) == 1 and "closed" in found.wide_tables[0], problems  # a collapsed table too
    assert {t for t in found.bad_text} >= {"peak device: None", "MFU nan", "[MISSING]"}, problems
    assert any(p.startswith("page wider than the window") and "pre: xxx" in p for p in found.problems), problems
    assert (tmp_path / "bad.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_gpu_sweep_report_fits_the_page(tmp_path: Path):
    """A report with every column a GPU sweep fills (peak device memory, energy) and an error message with a
    long path fits a 1280 px window: the CPU smoke report leaves those columns out, so it cannot show this."""
    _browser_or_skip()
    import json

    res = tmp_path / "gh200"
    timeline = [{"t": 0.1 * i, "step": i, "gpu_util_pct": 60.0, "host_cpu_pct": 90.0} for i in range(5)]
    for system in ("torch", "superoffload", "zero_offload", "zero_infinity", "ds_superoffload", "fsdp_offload"):
        for model in ("gpt-8b", "llama3.1-8b"):
            rec = _record(system, model=model, seq=1024, batch=8, tps=12345.678, params=8.03e9, timeline=timeline)
            rec["memory"]["peak_device_bytes"] = 87.3e9
            rec["noise"] = {"flags": ["spread", "loaded"]}
            if system == "zero_infinity":
                rec.update(status="error", throughput=None, timing=None,
                           error="RuntimeError: " + "/a/long/path/without/spaces" * 8 + ".json not found")
            path = res / "runs" / system / f"{model}_s1024_b8.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(rec))
    (res / "sweep.json").write_text(json.dumps({"sweep": "gh200", "reason": "a GH200", "steps": 10, "warmup": 3,
                                                "hardware": {"device_name": "NVIDIA GH200 480GB", "cpu": "Grace",
                                                             "cpu_count": 72, "arch": "aarch64"}}))
    page = R.render_html(res, tmp_path / "no-figures", tmp_path / "report.html")
    found = B.check(page)
    assert not found.problems, "\n".join(found.problems)


def test_the_smoke_report_in_chromium(smoke_results: Path, tmp_path: Path):
    _browser_or_skip()
    report = smoke_results / "cpu_smoke" / "report.html"
    shot = tmp_path / "report_top.png"
    found = B.check(report, screenshot=shot)
    assert not found.problems, "\n".join(found.problems)
    assert found.images >= 5 and found.tables >= 5  # the page has its figures and tables, not an error page
    assert shot.stat().st_size > 10_000
    out = os.environ.get("SUPEROFFLOAD_SCREENSHOT_DIR")  # where CI or a developer wants to look at it
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(out) / shot.name)
