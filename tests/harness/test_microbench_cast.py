"""`superoffload bench cast` writes a record with the link curve and both casting paths."""

import json

import pytest

from superoffload.cli.main import main as cli_main
from superoffload.harness import record


def test_bench_cast_cpu_record(tmp_path, capsys):
    out = tmp_path / "cast.json"
    assert cli_main(["bench", "cast", "--sizes", "64K,1M", "--repeats", "2", "--out", str(out)]) == 0
    rec = record.read_result(out, "cast_bench")  # validated against cast_bench.schema.json
    assert rec["kind"] == "cast_bench" and rec["pinned_available"] is False
    assert {(r["direction"], r["memory"]) for r in rec["link"]} == {("h2d", "pageable"), ("d2h", "pageable")}
    assert {r["size_bytes"] for r in rec["link"]} == {64 << 10, 1 << 20}
    for rows, path in ((rec["grad_path"], "grad"), (rec["param_path"], "param")):
        assert {r["policy"] for r in rows} == {"device_cast", "host_cast"}
        assert all(r["path"] == path and r["median_s"] > 0 for r in rows)
    assert "GB/s" in capsys.readouterr().out


@pytest.mark.parametrize("sizes", ["1X", "2", "abc"])
def test_bench_cast_rejects_bad_sizes(tmp_path, capsys, sizes):
    assert cli_main(["bench", "cast", "--sizes", sizes, "--out", str(tmp_path / "c.json")]) == 2
    assert "size" in capsys.readouterr().err
    assert not (tmp_path / "c.json").exists()


def test_cast_schema_rejects_a_row_of_the_wrong_path(tmp_path):
    out = tmp_path / "cast.json"
    assert cli_main(["bench", "cast", "--sizes", "64K", "--repeats", "1", "--out", str(out)]) == 0
    rec = json.loads(out.read_text())
    rec["grad_path"][0]["path"] = "param"
    out.write_text(json.dumps(rec))
    with pytest.raises(record.ResultFileError, match="cast_bench.schema.json: at grad_path/0/path"):
        record.read_result(out, "cast_bench")
