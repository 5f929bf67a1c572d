"""Find the first bad commit between a good and a bad one, measuring each candidate A/B against good.

Every candidate is checked out in a throw-away ``git worktree`` (the current Python environment is
reused; only the project's code and its C kernel are rebuilt: ``grace_adam/build.py`` in the tree, once per
distinct kernel source in a bisection: ``kernel_key``), and
the case runs ``superoffload bench run`` from that tree. Each round runs the good tree and the candidate
back to back, alternating which goes first, so drift of a shared machine (another job, thermal state)
lands on both sides of the ratio and cancels (as ``asv continuous`` does). A candidate is bad when its
median ratio to good lies nearer the bad commit's ratio than 1 (on a log scale); for the loss hash, when
its trajectory's bits differ from good's. Commits are searched by bisection over
``git rev-list --ancestry-path good..bad``, which assumes one change (the first bad commit stays bad).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from superoffload.nightly.metrics import loss_hash

CASE_NAME = re.compile(r"^(?P<system>[a-z_]+)_(?P<model>[a-z0-9][a-z0-9.\-]*)_s(?P<seq>\d+)_b(?P<batch>\d+)$")
BISECT_METRICS = ("tokens_per_s", "step_s_median", "loss_hash")


@dataclass(frozen=True)
class CaseSpec:
    system: str
    model: str
    seq: int
    batch: int
    steps: int = 8
    warmup: int = 2
    threads: int | None = 1
    dtype: str = "fp32"
    grad_clip: float | None = None
    extra: tuple[str, ...] = ()

    @classmethod
    def parse(cls, case: str, **kw: Any) -> CaseSpec:
        m = CASE_NAME.match(case)
        if not m:
            raise ValueError(f"case {case!r} is not SYSTEM_MODEL_sSEQ_bBATCH (e.g. superoffload_gpt-tiny_s128_b2)")
        return cls(m["system"], m["model"], int(m["seq"]), int(m["batch"]), **kw)

    @property
    def name(self) -> str:
        return f"{self.system}_{self.model}_s{self.seq}_b{self.batch}"

    def bench_args(self) -> list[str]:
        args = ["bench", "run", "--system", self.system, "--model", self.model, "--seq", str(self.seq),
                "--batch", str(self.batch), "--steps", str(self.steps), "--warmup", str(self.warmup),
                "--dtype", self.dtype, "--no-progress"]
        if self.threads:
            args += ["--threads", str(self.threads)]
        if self.grad_clip is not None:
            args += ["--grad-clip", str(self.grad_clip)]
        return args + list(self.extra)


def git(repo: Path, *args: str) -> str:
    r = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed in {repo}: {r.stderr.strip()}")
    return r.stdout.strip()


def kernel_key(tree: Path) -> str:
    """What the C kernel a tree builds depends on: its sources and build script, the compiler asked for
    (``CC``) and the machine. Most commits of a bisection leave them alone, so most trees reuse a build."""
    h = hashlib.sha256(f"{os.environ.get('CC', '')}\0{platform.machine()}\0".encode())
    root = tree / "grace_adam"
    for f in sorted([root / "build.py", *(p for p in (root / "csrc").rglob("*") if p.is_file())]):
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:20]


def _build_kernel(path: Path, commit: str, cache: Path) -> None:
    """Build ``path``'s C kernel into its ``grace_adam/_lib``, or copy in the build of an identical kernel
    (``cache``, one folder per kernel_key)."""
    lib, done = path / "grace_adam" / "_lib", cache / kernel_key(path)
    if done.is_dir():
        shutil.copytree(done, lib, dirs_exist_ok=True)
        return
    r = subprocess.run([sys.executable, str(path / "grace_adam" / "build.py")], cwd=path, capture_output=True,
                       text=True)
    if r.returncode != 0:
        raise RuntimeError(f"building the C kernel at {commit[:10]} failed:\n{r.stderr[-2000:]}")
    if lib.is_dir() and any(lib.iterdir()):  # (an old commit may build elsewhere: then it is not kept)
        tmp = Path(tempfile.mkdtemp(prefix=".part-", dir=cache))
        shutil.copytree(lib, tmp, dirs_exist_ok=True)
        with contextlib.suppress(OSError):  # another tree of the same kernel got there first: keep theirs
            tmp.rename(done)
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def worktree(repo: Path, commit: str, parent: Path) -> Iterator[Path]:
    """``commit`` checked out in a new worktree under ``parent`` with its C kernel built (or reused from an
    earlier worktree under ``parent`` with the same kernel_key); removed after."""
    path = Path(tempfile.mkdtemp(prefix=f"{commit[:10]}-", dir=parent))
    path.rmdir()
    git(repo, "worktree", "add", "--detach", "--quiet", str(path), commit)
    try:
        if (path / "grace_adam" / "build.py").exists():
            cache = parent / ".kernels"
            cache.mkdir(exist_ok=True)
            _build_kernel(path, commit, cache)
        yield path
    finally:
        with contextlib.suppress(RuntimeError):
            git(repo, "worktree", "remove", "--force", str(path))
        shutil.rmtree(path, ignore_errors=True)


def run_case(tree: Path, spec: CaseSpec, out: Path, timeout_s: float = 1800) -> dict[str, Any]:
    """One ``bench run`` of the case with ``tree``'s code; its record (an error record when none came)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, "-m", "superoffload", *spec.bench_args(), "--out", str(out)]
    try:
        r = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout_s)
        tail = (r.stderr or r.stdout)[-1500:]
    except subprocess.TimeoutExpired:
        tail = f"timed out after {timeout_s:.0f} s"
    if out.exists():
        return json.loads(out.read_text())
    return {"status": "error", "error": tail}


def metric_value(rec: dict[str, Any], metric: str) -> float | str | None:
    if rec.get("status") != "ok":
        return None
    if metric == "loss_hash":
        return loss_hash(rec.get("losses") or [])
    if metric == "tokens_per_s":
        return float((rec.get("throughput") or {}).get("tokens_per_s") or 0) or None
    if metric == "step_s_median":
        return float((rec.get("timing") or {}).get("median_s") or 0) or None
    raise ValueError(f"bisect measures one of {', '.join(BISECT_METRICS)}, not {metric!r}")


@dataclass
class Comparison:
    commit: str
    good_values: list[Any] = field(default_factory=list)
    values: list[Any] = field(default_factory=list)

    def ratios(self) -> list[float]:
        return [c / g for g, c in zip(self.good_values, self.values, strict=True)
                if isinstance(g, float) and isinstance(c, float) and g]

    @property
    def ratio(self) -> float | None:
        r = self.ratios()
        return statistics.median(r) if r else None

    def spread(self) -> tuple[float, float] | None:
        r = self.ratios()
        return (min(r), max(r)) if r else None

    def describe(self, metric: str) -> str:
        if metric == "loss_hash":
            same = all(a == b for a, b in zip(self.good_values, self.values, strict=True))
            return "loss bits identical to good" if same else "loss bits differ from good"
        if self.ratio is None:
            return "no measurement (a run failed)"
        lo, hi = self.spread() or (self.ratio, self.ratio)
        return f"{metric} {self.ratio:.3f}x good (rounds {lo:.3f}-{hi:.3f}, n={len(self.ratios())})"


def compare(repo: Path, good_tree: Path, commit: str, spec: CaseSpec, metric: str, repeats: int, work: Path,
            log: Callable[[str], None]) -> Comparison:
    """``repeats`` interleaved rounds of the good tree and ``commit``'s."""
    c = Comparison(commit)
    with worktree(repo, commit, work) as tree:
        for r in range(repeats):
            order = [("good", good_tree), ("cand", tree)]
            if r % 2:
                order.reverse()
            got: dict[str, Any] = {}
            for side, t in order:
                rec = run_case(t, spec, work / f"{commit[:10]}-{side}-{r}.json")
                got[side] = metric_value(rec, metric)
                if got[side] is None:
                    log(f"  {side} run at round {r} failed: {str(rec.get('error'))[:300]}")
            c.good_values.append(got["good"])
            c.values.append(got["cand"])
    log(f"  {commit[:10]}: {c.describe(metric)}")
    return c


def is_bad(c: Comparison, bad: Comparison, metric: str) -> bool:
    if metric == "loss_hash":
        return any(a != b for a, b in zip(c.good_values, c.values, strict=True))
    if c.ratio is None:
        return True  # a candidate that does not run is not the good behaviour
    assert bad.ratio is not None
    return abs(math.log(c.ratio / bad.ratio)) < abs(math.log(c.ratio))


@dataclass
class BisectResult:
    first_bad: str | None
    candidates: list[str]
    measured: dict[str, Comparison]
    reproduced: bool
    message: str


def bisect(repo: Path, spec: CaseSpec, good: str, bad: str, metric: str = "tokens_per_s", repeats: int = 3,
           min_change: float = 0.05, work: Path | None = None, log: Callable[[str], None] = print) -> BisectResult:
    if metric not in BISECT_METRICS:
        raise ValueError(f"bisect measures one of {', '.join(BISECT_METRICS)}, not {metric!r}")
    if repeats < 1:
        raise ValueError("--repeats must be at least 1")
    good, bad = git(repo, "rev-parse", good), git(repo, "rev-parse", bad)
    if subprocess.run(["git", "-C", str(repo), "merge-base", "--is-ancestor", good, bad]).returncode != 0:
        raise ValueError(f"good {good[:10]} is not an ancestor of bad {bad[:10]}: give --good an older commit")
    candidates = git(repo, "rev-list", "--reverse", "--ancestry-path", f"{good}..{bad}").split()
    owned = work is None
    work = Path(tempfile.mkdtemp(prefix="superoffload-bisect-")) if work is None else work
    work.mkdir(parents=True, exist_ok=True)
    measured: dict[str, Comparison] = {}
    try:
        log(f"bisect {spec.name} on {metric}: {len(candidates)} commits after good {good[:10]}, "
            f"{repeats} interleaved rounds each")
        with worktree(repo, good, work) as good_tree:
            measured[bad] = worst = compare(repo, good_tree, bad, spec, metric, repeats, work, log)
            reproduced = (metric == "loss_hash" and is_bad(worst, worst, metric)) or (
                worst.ratio is not None and abs(math.log(worst.ratio)) >= math.log1p(min_change))
            if not reproduced:
                msg = f"bad {bad[:10]} does not reproduce against good ({worst.describe(metric)}): nothing to bisect"
                return BisectResult(None, candidates, measured, False, msg)
            lo, hi = -1, len(candidates) - 1  # candidates[lo] good (or the good commit), candidates[hi] bad
            while hi - lo > 1:
                mid = (lo + hi) // 2
                c = measured[candidates[mid]] = compare(repo, good_tree, candidates[mid], spec, metric, repeats,
                                                        work, log)
                if is_bad(c, worst, metric):
                    hi = mid
                else:
                    lo = mid
        first = candidates[hi]
        subject = git(repo, "log", "-1", "--format=%h %s", first)
        msg = f"first bad commit: {subject}\n  {measured[first].describe(metric)}"
        return BisectResult(first, candidates, measured, True, msg)
    finally:
        if owned:
            shutil.rmtree(work, ignore_errors=True)
        with contextlib.suppress(RuntimeError):
            git(repo, "worktree", "prune")
