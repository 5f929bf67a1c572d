"""The nightly page (`reports/render.py nightly`) from a synthetic history: one self-contained HTML file with
a trend figure per judged numeric series, the regression and its commit range first, an empty suite that
says so; the trend figures are byte-identical across renders."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest

from reports import render as RR
from reports.figures import nightly as NF
from superoffload.nightly import fingerprint as FP
from superoffload.nightly import rules as NR
from superoffload.nightly.store import History
from tests.nightly.history_helpers import CASE, add_night
from tests.nightly.history_helpers import FP as FIELDS

NIGHTS, DROP_AT = 12, 8
NOISE = (0.0, 0.012, -0.008, 0.005, -0.011, 0.009, -0.004, 0.007, -0.006, 0.003, -0.009, 0.01)


def commit(i: int) -> str:
    return f"{i:02x}" + "ab" * 19


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """12 nights of one case, 3 repeats each, throughput 20 % lower from night 8 on."""
    path = tmp_path / "history" / "nightly.sqlite"
    with History(path) as h:
        for i in range(NIGHTS):
            level = 1000.0 * (0.8 if i >= DROP_AT else 1.0) * (1 + NOISE[i])
            add_night(h, i, [level * f for f in (0.99, 1.0, 1.01)], commit=commit(i), device_bytes=5e8)
    return path


def _uris(html: str) -> list[bytes]:
    return [base64.b64decode(u) for u in re.findall(r'src="data:image/svg\+xml;base64,([^"]+)"', html)]


def _numeric_series(path: Path) -> list[tuple[str, str]]:
    with History(path) as h:
        key = h.nights("training")[0].fingerprint
        judged = NR.judge(h, "training", key, NR.RuleConfig())
    return [k for k in judged if NF.SUITES["training"][k[1]].rule not in NF.CATEGORICAL]


def test_nightly_page(store: Path, tmp_path: Path, capsys):
    out = tmp_path / "page" / "nightly.html"
    assert RR.main(["nightly", "--store", str(store), "--out", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    assert [p.name for p in out.parent.iterdir()] == ["nightly.html"]  # one file, no temp left behind
    html = out.read_text()
    # embedded figures, one per judged numeric series (tokens/s, step time, device memory); nothing linked
    series = _numeric_series(store)
    assert sorted(m for _, m in series) == ["peak_device_bytes", "step_s_median", "tokens_per_s"]
    svgs = _uris(html)
    assert len(svgs) == len(series) and all(s.lstrip().startswith(b"<?xml") and b"<svg" in s for s in svgs)
    assert "<script" not in html and "http://" not in html.replace("http://www.w3.org", "")
    # the answer first: the regression of the newest night, before the change points and the figures
    assert 'class="answer bad"' in html and f"{CASE}:tokens_per_s" in html and f"{CASE}:step_s_median" in html
    assert html.index(">regression<") < html.index("Change points over the whole history") < html.index("<img")
    # the change point's commit range (the last night before the drop, the first after it), in the table
    # and (short) in the figure
    cp_range = f"{commit(DROP_AT - 1)[:12]}..{commit(DROP_AT)[:12]}"
    assert cp_range in html
    assert f"{commit(DROP_AT - 1)[:7]}..{commit(DROP_AT)[:7]}".encode() in b"".join(svgs)
    assert re.search(r"<td>-(19|20|21)\.\d %</td>", html)  # the drop, in the change-point table
    assert "superoffload nightly bisect --case " + CASE in html
    # the fingerprint, described, and its row in the fingerprints table
    assert FP.describe(FIELDS) in html and FP.key(FIELDS) in html
    # status and loss hash are a table, not figures
    assert "Status and loss hash" in html and "feedc0de" in html
    # the suite with no nights says so
    assert "No microbench nights in the history yet" in html
    assert oct(out.stat().st_mode & 0o777) == "0o644"


def test_empty_suite_alone(store: Path, tmp_path: Path):
    out = tmp_path / "micro.html"
    assert RR.main(["nightly", "--store", str(store), "--out", str(out), "--suite", "microbench"]) == 0
    html = out.read_text()
    assert "No microbench nights in the history yet" in html and "Suite training" not in html
    assert "No regression" in html and "<img" not in html


def test_missing_store_and_unknown_fingerprint(store: Path, tmp_path: Path, capsys):
    missing = tmp_path / "nope.sqlite"
    assert RR.main(["nightly", "--store", str(missing), "--out", str(tmp_path / "a.html")]) == 2
    assert not missing.exists() and not (tmp_path / "a.html").exists()  # nothing created
    assert "no nightly history" in capsys.readouterr().err
    args = ["nightly", "--store", str(store), "--out", str(tmp_path / "b.html"), "--fingerprint", "ffffffff"]
    assert RR.main([*args, "--suite", "training"]) == 2
    assert "no fingerprint 'ffffffff'" in capsys.readouterr().err
    assert RR.main(args) == 0  # with every suite: each section says it has no such fingerprint
    assert "no fingerprint &#39;ffffffff&#39;" in (tmp_path / "b.html").read_text()


def test_rule_flags_reach_the_page(store: Path, tmp_path: Path):
    """A bound above the drop: the same history is no regression (the page judges as `nightly check`)."""
    out = tmp_path / "loose.html"
    assert RR.main(["nightly", "--store", str(store), "--out", str(out), "--suite", "training",
                    "--threshold-pct", "30"]) == 0
    html = out.read_text()
    assert 'class="answer bad"' not in html and f"{CASE}:tokens_per_s" not in html


def test_page_escapes_names(tmp_path: Path):
    path = tmp_path / "h.sqlite"
    with History(path) as h:
        for i in range(6):
            add_night(h, i, [100.0, 101.0], case="<b>case&</b>", commit=commit(i))
    out = tmp_path / "p.html"
    assert RR.main(["nightly", "--store", str(path), "--out", str(out)]) == 0
    html = out.read_text()
    assert "<b>case&" not in html and "&lt;b&gt;case&amp;&lt;/b&gt;" in html


def test_trend_svg_is_deterministic(store: Path):
    with History(store) as h:
        key = h.nights("training")[0].fingerprint
        ts = NF.trends(h, "training", key, NR.RuleConfig())
    t = next(t for t in ts if t.metric.name == "tokens_per_s")
    assert [c.bad.commit for c in t.changes] == [commit(DROP_AT)]
    assert [j.label for j in t.series][-1] == NR.REGRESSION
    a, b = NF.trend_svg(t), NF.trend_svg(t)
    assert a == b and a.startswith("<?xml") and "<dc:date>" not in a
    assert "tokens_per_s (tokens/s)" in a and "regression" in a and "insufficient data" in a


def test_units_and_band():
    m = NF.SUITES["training"]
    assert NF.scale(m["peak_device_bytes"], [2.0**20]) == (1 / 2**20, "MiB")
    assert NF.scale(m["step_s_median"], [0.25]) == (1e3, "ms")
    assert NF.scale(NF.SUITES["microbench"]["time_median_s"], [2e-5]) == (1e6, "µs")
    assert NF.tick_positions(3) == [0, 1, 2]
    ticks = NF.tick_positions(40)
    assert len(ticks) <= NF.MAX_TICKS and ticks[0] == 0 and ticks[-1] == 39
