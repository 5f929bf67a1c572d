"""``superoffload nightly``: record a night into the history, judge it, accept, annotate, import, bisect.

    superoffload nightly record --runs DIR [--store H.sqlite]        a night's run records (DIR/<case>/rep*.json)
    superoffload nightly record --pytest-benchmark F.json            a microbenchmark night (suite microbench)
    superoffload nightly check [--suite S] [--out V.json] [--summary S.md]   exit 1 on a regression only
    superoffload nightly accept --case C [--metric M] --note "..."   the current level becomes the baseline
    superoffload nightly annotate --case C --commit SHA --note "..."  an intended change: baseline from SHA on
    superoffload nightly import --reference REF.json | --pytest-benchmark-dir DIR   old references, as history
    superoffload nightly history [--case C] [--metric M]             the nights of a fingerprint
    superoffload nightly noise                                       the measured spread (docs/nightly.md)
    superoffload nightly bisect --case C --good SHA --bad SHA        the first bad commit, measured A/B
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import math
import re
import statistics
import sys
from pathlib import Path
from typing import Any

from superoffload.nightly import fingerprint as F
from superoffload.nightly import metrics as M
from superoffload.nightly import rules as R
from superoffload.nightly.store import History, Night, Sample

DEFAULT_STORE = "results/history/nightly.sqlite"
EXIT_REGRESSION = 1
REPO = Path(__file__).resolve().parents[2]


def _err(msg: str) -> int:
    print(f"superoffload nightly: error: {msg}", file=sys.stderr)
    return 2


# --- record ----------------------------------------------------------------------------------------------
def _load_runs(runs: Path) -> dict[str, list[dict[str, Any]]]:
    cases: dict[str, list[dict[str, Any]]] = {}
    for case_dir in sorted(p for p in runs.iterdir() if p.is_dir()):
        recs = []
        for f in sorted(case_dir.glob("rep*.json"), key=lambda p: int("".join(filter(str.isdigit, p.stem)) or 0)):
            try:
                recs.append(json.loads(f.read_text()))
            except (OSError, json.JSONDecodeError) as e:
                recs.append({"status": "error", "error": f"unreadable record {f.name}: {e}"})
        if recs:
            cases[case_dir.name] = recs
    return cases


def record_runs(store: History, runs: Path, source: str | None = None) -> int | None:
    """Append the night in ``runs``; None when that source is already in the history."""
    source = source or str(runs.resolve())
    if store.has_source(source):
        return None
    cases = _load_runs(runs)
    if not cases:
        raise ValueError(f"{runs} holds no <case>/rep*.json run records")
    recs = [r for rs in cases.values() for r in rs]
    samples = [s for case, rs in cases.items() for i, r in enumerate(rs) for s in M.from_record(case, i, r)]
    provs = [r.get("provenance") or {} for r in recs if r.get("provenance")]
    commits = sorted({p.get("git_commit") for p in provs if p.get("git_commit")})
    commit = commits[0] if len(commits) == 1 else (None if not commits else "|".join(commits))
    dirty = any(bool(p.get("git_dirty")) for p in provs) if provs else None
    stamps = sorted(r["created_utc"] for r in recs if r.get("created_utc"))
    utc = stamps[0] if stamps else dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    fp = F.merge([F.from_record(r) for r in recs if r.get("provenance")] or [F.from_record({})])
    return store.add_night("training", utc, commit, dirty, fp, source, samples)


def _microbench_fingerprint(obj: dict[str, Any], imported: bool) -> dict[str, Any]:
    """A microbenchmark night's fingerprint: this machine's (the nightly ran it just now) or, for an imported
    file, what its pytest-benchmark ``machine_info`` says (no library versions: a fingerprint of its own)."""
    if imported:
        cpu = (obj.get("machine_info") or {}).get("cpu") or {}
        return {f: None for f in F.FIELDS} | {"device": "imported", "cpu": cpu.get("brand_raw"),
                                                "cpu_count": cpu.get("count")}
    from superoffload.harness import provenance

    return F.from_record({"provenance": provenance.collect("cpu"), "run": {"bind_cores": False}})


def record_pytest_benchmark(store: History, path: Path, source: str | None = None,
                            imported: bool = False) -> int | None:
    source = source or str(path.resolve())
    if store.has_source(source):
        return None
    from superoffload.harness import provenance

    obj = json.loads(path.read_text())
    info = obj.get("commit_info") or {}
    commit, dirty = (info.get("id"), info.get("dirty")) if info.get("id") else provenance.git_commit()
    utc = obj.get("datetime") or dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    return store.add_night("microbench", utc, commit, dirty, _microbench_fingerprint(obj, imported), source,
                           M.from_pytest_benchmark(obj))


def cmd_record(a: argparse.Namespace) -> int:
    with History(a.store) as h:
        try:
            if a.pytest_benchmark:
                night = record_pytest_benchmark(h, Path(a.pytest_benchmark), a.source)
            else:
                night = record_runs(h, Path(a.runs), a.source)
        except (OSError, ValueError) as e:
            return _err(str(e))
    print(f"nightly: {'already recorded' if night is None else f'recorded night {night}'} in {a.store}")
    return 0


# --- check -----------------------------------------------------------------------------------------------
def rule_config(a: argparse.Namespace) -> R.RuleConfig:
    floors: dict[str, float] = {}
    if a.threshold_pct is not None:
        floors.update(tokens_per_s=a.threshold_pct / 100, step_s_median=a.threshold_pct / 100,
                      time_median_s=a.threshold_pct / 100)
    for item in a.bound or []:
        name, _, val = item.partition("=")
        if not val:
            raise ValueError(f"--bound takes METRIC=VALUE, got {item!r}")
        floors[name] = float(val)
    return R.RuleConfig(window=a.window, min_baseline=a.min_baseline, persist=a.persist, k=a.sigma, floors=floors)


def pick_fingerprint(h: History, suite: str, want: str | None) -> tuple[str, dict[str, Any]] | None:
    fps = h.fingerprints(suite)
    if not fps:
        return None
    if want in (None, "latest"):  # the fingerprint of the night recorded last (an imported file is not a night)
        nights = h.nights(suite)
        measured = [n for n in nights if n.fingerprint_fields.get("device") != "imported"] or nights
        newest = max(measured, key=lambda n: n.id)
        return newest.fingerprint, newest.fingerprint_fields
    for key, fields, _, _ in fps:
        if key.startswith(want):
            return key, fields
    raise ValueError(f"no fingerprint {want!r} in the {suite} history; known: {', '.join(k for k, *_ in fps)}")


def _ranges(judged: dict[tuple[str, str], list[R.Judgement]], rows: list[R.Judgement],
            nights: dict[int, Night]) -> dict[tuple[str, str], str]:
    """For each violation: the commits between the last unremarkable night and the first violating one."""
    out = {}
    for j in rows:
        if j.direction == 0:
            continue
        start = R.violation_start(judged[(j.case, j.metric)], j)
        good = nights.get(start.baseline_nights[-1]) if start.baseline_nights else None
        a, b = (good.commit if good else None) or "unknown", start.night.commit or "unknown"
        # the same commit on both sides: the code did not change, the machine or the environment did
        out[(j.case, j.metric)] = f"{a[:12]} (same commit: not the code)" if a == b != "unknown" and \
            not start.night.dirty else f"{a[:12]}..{b[:12]}"
    return out


def _bisect_cmd(h: History, case: str, metric: str, commits: str, night: Night, store: str) -> str | None:
    good, _, bad = commits.partition("..")
    if not bad or "unknown" in (good, bad) or metric not in ("tokens_per_s", "step_s_median", "loss_hash",
                                                             "planned_over_best"):
        return None  # nothing to bisect (one commit, or an unknown end)
    spec = next((json.loads(s.text) for s in h.samples(night.id) if s.case == case and s.metric == "spec" and s.text),
                {})
    if metric == "planned_over_best":
        return _plan_optimality_cmd(case, spec, good, bad)
    flags = "".join(f" --{k.replace('_', '-')} {v}" for k, v in sorted(spec.items()))
    return f"superoffload nightly bisect --case {case} --metric {metric} --good {good} --bad {bad}{flags}"


def _plan_optimality_cmd(case: str, spec: dict[str, Any], good: str, bad: str) -> str | None:
    """A planner regression is not bisected run by run: the command measures the case's grid, to run in a checkout
    of each end (the plans, and which configuration wins, say what changed)."""
    m = re.fullmatch(r"plan_optimality_(?P<model>.+)_s(?P<seq>\d+)_b(?P<batch>\d+)_w(?P<world>\d+)_(?P<dtype>\w+)",
                     case)
    if m is None:
        return None
    flags = "".join(f" --{k.replace('_', '-')} {v}" for k, v in (("grid", spec.get("grid") and ",".join(spec["grid"])),
                                                                  ("repeats", spec.get("repeats")),
                                                                  ("steps", spec.get("steps")),
                                                                  ("warmup", spec.get("warmup")),
                                                                  ("threads", spec.get("threads")),
                                                                  ("hardware", spec.get("hardware"))) if v is not None)
    return (f"python benchmarks/plan_optimality.py --workloads {m['model']}:{m['seq']}:{m['batch']} --world "
            f"{m['world']} --dtype {m['dtype']}{flags} --out po-COMMIT.json   # in a checkout of {good} and of {bad}")


def check(h: History, suite: str, cfg: R.RuleConfig, fp_want: str | None = None, repo: str | None = None,
          store_path: str = DEFAULT_STORE) -> tuple[str, dict[str, Any]] | None:
    """(Markdown summary, verdict) of the newest night of a suite on a fingerprint; None with no history."""
    from superoffload.nightly import changes as C
    from superoffload.nightly import summary as S

    got = pick_fingerprint(h, suite, fp_want)
    if got is None:
        return None
    key, fields = got
    catalog = M.SUITES[suite]
    judged = R.judge(h, suite, key, cfg, repo=repo)
    rows = R.latest(judged)
    all_nights = {n.id: n for n in h.nights(suite, key)}
    ranges = _ranges(judged, rows, all_nights)
    changes: list[C.ChangePoint] = []
    values = h.values(list(all_nights.values()))  # one read for every series
    for (case, metric), series in judged.items():
        nights = [j.night for j in series]
        changes += C.detect(case, catalog[metric], nights, [values[n.id].get((case, metric), []) for n in nights], cfg)
    cmds = [c for j in rows if j.alert and (c := _bisect_cmd(h, j.case, j.metric, ranges.get((j.case, j.metric), ""),
                                                               j.night, store_path))]
    checked = S.Checked(suite, key, fields, rows, ranges, changes, cmds)
    return S.markdown(checked, catalog), S.verdict(checked)


def cmd_check(a: argparse.Namespace) -> int:
    from superoffload.harness.record import write_json_atomic, write_text_atomic

    try:
        cfg = rule_config(a)
        with History(a.store) as h:
            got = check(h, a.suite, cfg, a.fingerprint, repo=str(a.repo), store_path=a.store)
    except (ValueError, RuntimeError) as e:
        return _err(str(e))
    if got is None:
        return _err(f"no {a.suite} nights in {a.store}: record one with `superoffload nightly record`")
    md, verdict = got
    print(md)
    if a.summary:
        write_text_atomic(a.summary, md)
    if a.out:
        write_json_atomic(a.out, verdict)
    if verdict["regression"]:
        print(f"nightly: REGRESSION in {', '.join(verdict['regressed'])}", file=sys.stderr)
        return EXIT_REGRESSION
    return 0


# --- accept / annotate -----------------------------------------------------------------------------------
def cmd_accept(a: argparse.Namespace) -> int:
    try:
        cfg = rule_config(a)
        with History(a.store) as h:
            got = pick_fingerprint(h, a.suite, a.fingerprint)
            if got is None:
                return _err(f"no {a.suite} nights in {a.store}")
            key, _ = got
            judged = R.judge(h, a.suite, key, cfg, repo=str(a.repo))
            done = 0
            for (case, metric), series in judged.items():
                if a.case not in ("all", case) or (a.metric and a.metric != metric):
                    continue
                start = R.violation_start(series, series[-1]) if series[-1].direction else series[-1]
                h.annotate("accept", a.suite, key, case, a.note, metric=metric, from_night=start.night.id)
                print(f"nightly: {case} {metric}: baseline from night {start.night.id} ({start.night.utc}, "
                      f"{start.night.short_commit}) on")
                done += 1
    except (ValueError, RuntimeError) as e:
        return _err(str(e))
    if not done:
        return _err(f"no series of case {a.case!r}{' metric ' + a.metric if a.metric else ''} on this fingerprint")
    return 0


def cmd_annotate(a: argparse.Namespace) -> int:
    from superoffload.nightly.bisect import git

    try:
        commit = git(Path(a.repo), "rev-parse", a.commit)
        with History(a.store) as h:
            got = pick_fingerprint(h, a.suite, a.fingerprint)
            if got is None:
                return _err(f"no {a.suite} nights in {a.store}")
            h.annotate("intended", a.suite, got[0], a.case, a.note, metric=a.metric, commit=commit)
    except (ValueError, RuntimeError) as e:
        return _err(str(e))
    print(f"nightly: {a.case} {a.metric or 'every metric'}: intended change at {commit[:12]}: baseline from there on")
    return 0


# --- import ----------------------------------------------------------------------------------------------
def import_reference(h: History, path: Path) -> int | None:
    """A reference file of the old nightly (case -> per-repeat tokens/s and step times) as one night."""
    text = path.read_text()
    source = f"reference:{path.name}:{hashlib.sha256(text.encode()).hexdigest()[:16]}"  # the same in every clone
    if h.has_source(source):
        return None
    ref = json.loads(text)
    samples: list[Sample] = []
    for case, c in (ref.get("cases") or {}).items():
        tps = (c.get("tokens_per_s") or {}).get("values") or []
        steps = (c.get("step_s") or {}).get("values") or []
        for i in range(max(len(tps), len(steps), 1)):
            samples.append(Sample(case, i, "status", text=c.get("status", "ok")))
            if i < len(tps):
                samples.append(Sample(case, i, "tokens_per_s", value=float(tps[i])))
            if i < len(steps):
                samples.append(Sample(case, i, "step_s_median", value=float(steps[i])))
    fp = {f: None for f in F.FIELDS} | {"device": "imported", "cpu": ref.get("hardware_key")}
    return h.add_night("training", ref.get("created_utc") or "1970-01-01T00:00:00+00:00", None, None, fp, source,
                       samples)


def cmd_import(a: argparse.Namespace) -> int:
    with History(a.store) as h:
        done = []
        for ref in a.reference or []:
            done.append((ref, import_reference(h, Path(ref))))
        for d in a.pytest_benchmark_dir or []:
            for f in sorted(Path(d).rglob("*.json")):
                digest = hashlib.sha256(f.read_bytes()).hexdigest()[:16]
                done.append((str(f), record_pytest_benchmark(h, f, source=f"reference:{f.name}:{digest}",
                                                              imported=True)))
    if not done:
        return _err("give --reference FILE and/or --pytest-benchmark-dir DIR")
    for src, night in done:
        print(f"nightly: {src}: {'already in the history' if night is None else f'night {night}'}")
    return 0


# --- history / noise -------------------------------------------------------------------------------------
def cmd_history(a: argparse.Namespace) -> int:
    with History(a.store) as h:
        for key, fields, count, last in h.fingerprints(a.suite):
            print(f"fingerprint {key}: {count} nights, latest {last}: {F.describe(fields)}")
        got = pick_fingerprint(h, a.suite, a.fingerprint)
        if got is None:
            return 0
        cfg = rule_config(a)
        judged = R.judge(h, a.suite, got[0], cfg, repo=str(a.repo))
        print(f"\n{'night':>5}  {'utc':25}  {'commit':16}  {'case':36}  {'metric':18}  {'value':>14}  label")
        for (case, metric), series in sorted(judged.items()):
            if (a.case and a.case != case) or (a.metric and a.metric != metric):
                continue
            for j in series:
                v = j.value if isinstance(j.value, str) else ("–" if j.value is None else f"{j.value:.6g}")
                print(f"{j.night.id:>5}  {j.night.utc:25}  {j.night.short_commit:16}  {case:36}  {metric:18}  "
                      f"{str(v)[:14]:>14}  {j.label}")
    return 0


def noise_table(h: History, suite: str, key: str, cfg: R.RuleConfig) -> list[dict[str, Any]]:
    """Per case and metric: nights, robust night-to-night spread (1.4826 MAD / median of the night medians),
    the repeats' robust spread within a night, the widest deviation of a night from the median of all, and
    what the rules labelled the nights."""
    judged = R.judge(h, suite, key, cfg)
    values = h.values(h.nights(suite, key))
    rows = []
    for (case, metric), series in sorted(judged.items()):
        vals = [j.value for j in series if isinstance(j.value, float)]
        if len(vals) < 2:
            continue
        med = statistics.median(vals)
        mad = statistics.median(abs(v - med) for v in vals)
        labels: dict[str, int] = {}
        for j in series:
            labels[j.label] = labels.get(j.label, 0) + 1
        # within a night: the repeats' robust sd around their night's median (log scale)
        devs = []
        for j in series:
            xs = [s.value for s in values[j.night.id].get((case, metric), []) if s.value and s.value > 0]
            if len(xs) > 1:
                m = statistics.median(xs)
                devs += [abs(math.log(x / m)) for x in xs if x != m]
        rows.append({"case": case, "metric": metric, "nights": len(vals),
                     "robust_cv": R.MAD_TO_SIGMA * mad / med if med else 0.0,
                     "repeat_sd": R.MAD_TO_SIGMA * statistics.median(devs) if devs else 0.0,
                     "max_dev": max(abs(v / med - 1) for v in vals) if med else 0.0, "labels": labels})
    return rows


def cmd_noise(a: argparse.Namespace) -> int:
    with History(a.store) as h:
        got = pick_fingerprint(h, a.suite, a.fingerprint)
        if got is None:
            return _err(f"no {a.suite} nights in {a.store}")
        rows = noise_table(h, a.suite, got[0], rule_config(a))
    if a.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'case':40}  {'metric':18}  {'nights':>6}  {'nights sd':>9}  {'repeats sd':>10}  {'max dev':>8}  labels")
    for r in rows:
        labels = ", ".join(f"{k} {v}" for k, v in sorted(r["labels"].items()))
        print(f"{r['case']:40}  {r['metric']:18}  {r['nights']:>6}  {100 * r['robust_cv']:8.2f}%  "
              f"{100 * r['repeat_sd']:9.2f}%  {100 * r['max_dev']:7.2f}%  {labels}")
    return 0


# --- bisect ----------------------------------------------------------------------------------------------
def cmd_bisect(a: argparse.Namespace) -> int:
    from superoffload.nightly.bisect import CaseSpec, bisect

    try:
        spec = CaseSpec.parse(a.case, steps=a.steps, warmup=a.warmup, threads=a.threads, dtype=a.dtype,
                              grad_clip=a.grad_clip)
        res = bisect(Path(a.repo), spec, a.good, a.bad, metric=a.metric, repeats=a.repeats,
                     min_change=a.min_change / 100, work=Path(a.work_dir) if a.work_dir else None)
    except (ValueError, RuntimeError) as e:
        return _err(str(e))
    print(res.message)
    if a.out:
        from superoffload.harness.record import write_json_atomic

        write_json_atomic(a.out, {
            "case": a.case, "metric": a.metric, "first_bad": res.first_bad, "reproduced": res.reproduced,
            "candidates": res.candidates, "message": res.message,
            "measured": {c: {"ratio": m.ratio, "spread": m.spread(), "good": m.good_values, "candidate": m.values}
                         for c, m in res.measured.items()},
        })
    return 0 if res.reproduced else 3


def rules_args(p: argparse.ArgumentParser) -> None:
    """The rule flags (`check`, `accept`, `history`, `noise` and the nightly page take the same ones)."""
    d = R.RuleConfig()
    p.add_argument("--window", type=int, default=d.window, help=f"baseline nights (default {d.window})")
    p.add_argument("--min-baseline", type=int, default=d.min_baseline,
                   help=f"fewer earlier nights: insufficient data (default {d.min_baseline})")
    p.add_argument("--persist", type=int, default=d.persist,
                   help=f"consecutive violations that make a regression (default {d.persist})")
    p.add_argument("--sigma", type=float, default=d.k, help=f"allowed robust sigmas (default {d.k:g})")
    p.add_argument("--threshold-pct", type=float, default=None,
                   help="floor of the throughput and step-time bounds, in %% (default: the catalog's, 10)")
    p.add_argument("--bound", action="append", metavar="METRIC=VALUE",
                   help="override one metric's bound (a fraction; absolute for rollback_rate); repeatable")


def add_cli(sub: argparse._SubParsersAction) -> None:
    top = sub.add_parser("nightly", help="nightly regression history: record, check, accept, annotate, bisect",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    nsub = top.add_subparsers(dest="nightly_command", required=True, metavar="ACTION")

    def action(name: str, help_: str, func: Any, rules: bool = True) -> argparse.ArgumentParser:
        p = nsub.add_parser(name, help=help_, description=help_)
        p.add_argument("--store", default=DEFAULT_STORE, help=f"history file (default {DEFAULT_STORE})")
        p.add_argument("--suite", default="training", choices=sorted(M.SUITES))
        p.add_argument("--repo", default=str(REPO), help="git repository the commits are in (default: this one)")
        if rules:
            p.add_argument("--fingerprint", default=None, help="fingerprint key (prefix); default the newest night's")
            rules_args(p)
        p.set_defaults(func=func)
        return p

    p = action("record", "append one night's raw values to the history", cmd_record, rules=False)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--runs", help="a night's folder of <case>/rep<i>.json run records")
    g.add_argument("--pytest-benchmark", help="a pytest-benchmark --benchmark-json file (suite microbench)")
    p.add_argument("--source", default=None, help="the night's unique name (default: the path)")

    p = action("check", "judge the newest night; exit 1 on a regression only", cmd_check)
    p.add_argument("--out", help="verdict JSON")
    p.add_argument("--summary", help="Markdown summary")

    p = action("accept", "make the current level of a case the baseline (after an improvement or a "
               "regression you accept)", cmd_accept)
    p.add_argument("--case", required=True, help="case name, or 'all'")
    p.add_argument("--metric", default=None, help="one metric (default: every metric of the case)")
    p.add_argument("--note", required=True, help="why (kept in the history)")

    p = action("annotate", "mark an intended change at a commit: the baseline restarts there", cmd_annotate)
    p.add_argument("--case", required=True, help="case name, or '*' for every case")
    p.add_argument("--metric", default=None)
    p.add_argument("--commit", required=True)
    p.add_argument("--note", required=True)

    p = action("import", "import old reference files as history", cmd_import, rules=False)
    p.add_argument("--reference", action="append", help="benchmarks/reference/nightly-*.json (repeatable)")
    p.add_argument("--pytest-benchmark-dir", action="append", help="a saved pytest-benchmark storage folder")

    p = action("history", "print the nights and their labels", cmd_history)
    p.add_argument("--case")
    p.add_argument("--metric")

    p = action("noise", "the measured night-to-night spread per case and metric", cmd_noise)
    p.add_argument("--json", action="store_true")

    p = nsub.add_parser("bisect", help="name the first bad commit, measured A/B against good",
                        description="Bisect good..bad on one case: each candidate in a throw-away worktree, "
                                    "measured in interleaved rounds against good.")
    p.add_argument("--case", required=True, help="SYSTEM_MODEL_sSEQ_bBATCH, as the nightly names it")
    p.add_argument("--good", required=True)
    p.add_argument("--bad", required=True)
    p.add_argument("--metric", default="tokens_per_s", choices=("tokens_per_s", "step_s_median", "loss_hash"))
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds per candidate (default 3)")
    p.add_argument("--min-change", type=float, default=5.0,
                   help="%% the bad commit must differ from good to bisect at all (default 5)")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dtype", default="fp32", choices=("fp32", "bf16", "fp16"))
    p.add_argument("--grad-clip", type=float, default=None)
    p.add_argument("--repo", default=str(REPO))
    p.add_argument("--work-dir", default=None, help="keep worktrees' records here (default: a temp folder)")
    p.add_argument("--out", help="result JSON")
    p.set_defaults(func=cmd_bisect)
