"""reports/compare.py: two results folders whose reports differ only in numbers are the same structure;
a moved heading, a lost table row or a missing figure is a difference (exit 1)."""

from __future__ import annotations

from pathlib import Path

from reports.compare import main

REPORT = """<html><body><h1>Report</h1><h2>Throughput</h2>
<details><summary>Runs: 4 of 4 ok</summary></details>
<table><tr><th>system</th><th>model</th><th>tokens/s</th></tr>
<tr><td>superoffload</td><td>gpt-tiny</td><td>{a}</td></tr>
<tr><td>torch</td><td>gpt-tiny</td><td>{b}</td></tr></table>
<h2>Figures</h2><img alt="throughput vs size" src="data:image/svg+xml;base64,AAAA">
</body></html>"""


def _results(root: Path, html: str, figures: tuple[str, ...] = ("throughput.svg",)) -> Path:
    (root / "figures").mkdir(parents=True)
    (root / "report.html").write_text(html)
    for f in figures:
        (root / "figures" / f).write_text("<svg/>")
    (root / "sweep.json").write_text('{"runs": 4}')
    return root


def test_numbers_alone_leave_the_structure_the_same(tmp_path, capsys):
    before = _results(tmp_path / "b", REPORT.format(a="101.5", b="99.0"))
    after = _results(tmp_path / "a", REPORT.format(a="120.25", b="97.1"))
    assert main([str(before), str(after)]) == 0
    out = capsys.readouterr().out
    assert "cells changed 2 (numbers only: 2)" in out and "structure: the same" in out


def test_a_structural_change_is_reported(tmp_path, capsys):
    before = _results(tmp_path / "b", REPORT.format(a="1", b="2"))
    renamed = _results(tmp_path / "h", REPORT.format(a="1", b="2").replace("<h2>Figures", "<h2>Pictures"))
    assert main([str(before), str(renamed)]) == 1
    assert "headings (order): DIFFERENT" in capsys.readouterr().out
    lost_row = REPORT.format(a="1", b="2").replace("<tr><td>torch</td><td>gpt-tiny</td><td>2</td></tr>", "")
    assert main([str(before), str(_results(tmp_path / "r", lost_row))]) == 1
    assert "keys DIFFERENT" in capsys.readouterr().out
    no_figure = _results(tmp_path / "f", REPORT.format(a="1", b="2"), figures=())
    assert main([str(before), str(no_figure)]) == 1


def test_a_folder_without_a_report_is_refused(tmp_path, capsys):
    before = _results(tmp_path / "b", REPORT.format(a="1", b="2"))
    assert main([str(before), str(tmp_path)]) == 2
    assert "no report.html" in capsys.readouterr().err
