"""The layer table of the whole tree: which package may import which, imports inside functions included.

Every import of every Python file under the project's packages (``superoffload/*``, ``grace_adam``,
``baselines``, ``reports``, ``workflows``, ``benchmarks``, ``examples``) is read with an AST walk, so a
lazy import inside a function counts as much as one at the top of a file. Each import is reduced to an
edge between two *units* (a top-level package or module of ``superoffload``, or one of the root
packages) and checked against ``LAYERS``: a unit may import the units of every lower level, and units of
its own level only through an edge listed in ``SIDEWAYS``. ``test_the_table_has_no_cycle`` proves that
the allowed edges themselves form no circle, so no import can run back up.

The planner stands out: it is also held to the stdlib and numpy (it is torch-free), and a subprocess
check proves importing it loads neither torch nor the harness.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import superoffload.planner

ROOT = Path(__file__).resolve().parents[2]
PROJECT_ROOTS = ("superoffload", "grace_adam", "baselines", "reports", "workflows", "benchmarks", "examples")

# Lowest level first. A unit may import any unit of a lower level.
LAYERS: list[tuple[str, frozenset[str]]] = [
    # tables and kernels: the shapes, options, bucket packing and unit tables, the catalog of systems
    # and GPUs, the DeepSpeed build helper, DeepSpeed's `comm` names over torch.distributed, and the
    # GraceAdam kernels. Everything above reads them, so they import nothing of the project
    ("base", frozenset({"shapes", "options", "packing", "units", "catalog", "ds_build", "comm", "grace_adam"})),
    # torch-free planning, the device backends and the model zoo: each stands on the base alone, so
    # the planner stays torch-free and the zoo can be built by anything that trains
    ("building blocks", frozenset({"device", "planner", "models"})),
    # what trains a model: the offload engine and the long-sequence building blocks (sequence
    # parallelism, tiled loss, host-held checkpoints), which reach the zoo only through its hooks
    ("training", frozenset({"engine", "sequence"})),
    # the public front doors (optimizer, integrations, `superoffload.initialize`, the DeepSpeed shim)
    # and the benchmark harness, which trains through those same doors
    ("front doors", frozenset({"optim", "integrations", "superoffload", "entry", "deepspeed", "harness"})),
    # products built on the harness and the front doors: measuring this machine, fine-tuning, the
    # nightly store, the baseline systems, the workflow's scripts and the report, which reads result
    # files through harness.record and the nightly store (REPORT_READS)
    ("users", frozenset({"calibrate", "finetune", "nightly", "baselines", "workflows", "reports"})),
    # the command line dispatches to every product
    ("commands", frozenset({"cli"})),
    # scripts and examples run the commands and the products; nothing imports them
    ("scripts", frozenset({"__main__", "benchmarks", "examples"})),
]

# Edges within one level, each with its reason; every other same-level import is refused.
SIDEWAYS: dict[tuple[str, str], str] = {
    ("integrations", "optim"): "the Trainer and Accelerate integrations hand out superoffload.AdamW",
    ("entry", "integrations"): "initialize takes DeepSpeed's call shape (integrations.deepspeed)",
    ("superoffload", "entry"): "the package's lazy public names: initialize",
    ("superoffload", "integrations"): "the package's lazy public names: init_distributed, add_config_arguments",
    ("superoffload", "optim"): "the package's lazy public names: AdamW",
    ("deepspeed", "superoffload"): "`superoffload.deepspeed` is the package in DeepSpeed's shape",
    ("deepspeed", "integrations"): "`superoffload.deepspeed` is the package in DeepSpeed's shape",
    ("harness", "superoffload"): "the superoffload system trains through the public initialize",
    ("harness", "optim"): "the superoffload system's plain-loop mode trains through superoffload.AdamW",
    ("reports", "nightly"): "the nightly page draws the nightly store's history and rules",
}

# The report only reads result files: of the project it may import these modules and nothing else.
REPORT_READS = ("superoffload.harness.record", "superoffload.nightly", "superoffload.planner.explain",
                "superoffload.shapes", "superoffload.units", "superoffload.catalog", "reports")

PLANNER = Path(superoffload.planner.__file__).parent
PLANNER_PROJECT = ("superoffload.shapes", "superoffload.options", "superoffload.packing", "superoffload.units",
                   "superoffload.catalog", "superoffload.planner")
PLANNER_THIRD_PARTY = ("numpy",)  # torch is not needed: the planner is torch-free

LEVEL = {unit: i for i, (_, units) in enumerate(LAYERS) for unit in units}


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, module) of every import in a file, at any depth; relative imports resolved. ``from X import
    name`` yields ``X.name`` (name may be a submodule; the unit is the same either way below X)."""
    module = module_name(path, root)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{node.module}" if node.module else anchor
            out += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return out


def unit_of(module: str) -> str | None:
    """The unit a module belongs to; None for a module outside the project (stdlib, third party)."""
    parts = module.split(".")
    if parts[0] == "superoffload":
        if len(parts) == 1 or parts[1] not in LEVEL:  # `from superoffload import initialize`: the package
            return "superoffload"
        return parts[1]
    return parts[0] if parts[0] in PROJECT_ROOTS else None


def allowed(src: str, dst: str) -> bool:
    if src == dst:
        return True
    if LEVEL[dst] < LEVEL[src]:
        return True
    return LEVEL[dst] == LEVEL[src] and (src, dst) in SIDEWAYS


def violations(edges: list[tuple[str, str, str]]) -> list[str]:
    """``edges``: (where, importing unit, imported unit). What the table refuses, one line each."""
    bad = []
    for where, src, dst in edges:
        if src not in LEVEL or dst not in LEVEL:
            bad.append(f"{where}: {src} -> {dst}: a unit missing from LAYERS (place it in the table)")
        elif not allowed(src, dst):
            bad.append(f"{where}: {src} (level {LAYERS[LEVEL[src]][0]!r}) imports {dst} "
                       f"(level {LAYERS[LEVEL[dst]][0]!r})")
    return bad


def project_files(root: Path = ROOT) -> list[Path]:
    return sorted(p for r in PROJECT_ROOTS if (root / r).is_dir() for p in (root / r).rglob("*.py")
                  if ".venv" not in p.parts)


def tree_edges(root: Path = ROOT) -> list[tuple[str, str, str]]:
    edges = []
    for path in project_files(root):
        src = unit_of(module_name(path, root))
        for line, mod in imports(path, root):
            dst = unit_of(mod)
            if src is not None and dst is not None and dst != src:
                edges.append((f"{path.relative_to(root)}:{line}", src, dst))
    return edges


def test_every_import_follows_the_layer_table() -> None:
    bad = violations(tree_edges())
    assert not bad, "imports that run against the layer table (tests/planner/test_layering.py):\n" + "\n".join(bad)


def test_the_table_has_no_cycle() -> None:
    """The allowed edges of one level (SIDEWAYS) form no circle; with levels strictly ordered, neither do all."""
    for (src, dst) in SIDEWAYS:
        assert LEVEL[src] == LEVEL[dst], f"SIDEWAYS {src} -> {dst} crosses levels: list only same-level edges"
    graph: dict[str, set[str]] = {}
    for src, dst in SIDEWAYS:
        graph.setdefault(src, set()).add(dst)
    done: set[str] = set()

    def visit(node: str, path: tuple[str, ...]) -> None:
        assert node not in path, f"SIDEWAYS has a cycle: {' -> '.join((*path, node))}"
        if node in done:
            return
        for nxt in graph.get(node, ()):
            visit(nxt, (*path, node))
        done.add(node)

    for node in graph:
        visit(node, ())


def test_every_unit_in_the_table_exists() -> None:
    found = {unit_of(module_name(p)) for p in project_files()} - {None}
    assert set(LEVEL) - found == set(), "LAYERS names units that do not exist"


def test_a_planted_back_edge_fails() -> None:
    """The checker refuses an upward edge and an unlisted sideways one, and passes the allowed ones."""
    edges = [("a.py:1", "sequence", "harness"), ("b.py:2", "harness", "cli"), ("c.py:3", "models", "sequence"),
             ("d.py:4", "optim", "integrations"), ("e.py:5", "harness", "models"), ("f.py:6", "newpkg", "shapes")]
    assert violations(edges) == [
        "a.py:1: sequence (level 'training') imports harness (level 'front doors')",
        "b.py:2: harness (level 'front doors') imports cli (level 'commands')",
        "c.py:3: models (level 'building blocks') imports sequence (level 'training')",
        "d.py:4: optim (level 'front doors') imports integrations (level 'front doors')",
        "f.py:6: newpkg -> shapes: a unit missing from LAYERS (place it in the table)",
    ]


def test_a_planted_lazy_back_edge_in_a_copy_of_the_tree_fails(tmp_path) -> None:
    """An import inside a function, in a file of a copied tree, is found and refused."""
    (tmp_path / "superoffload" / "models").mkdir(parents=True)
    (tmp_path / "superoffload" / "__init__.py").write_text("")
    (tmp_path / "superoffload" / "models" / "__init__.py").write_text("from superoffload.shapes import MODELS\n")
    (tmp_path / "superoffload" / "models" / "gpt.py").write_text(
        "import torch\n\n\ndef f():\n    from superoffload.harness import runner\n    from ..sequence import loss\n")
    assert violations(tree_edges(tmp_path)) == [
        "superoffload/models/gpt.py:5: models (level 'building blocks') imports harness (level 'front doors')",
        "superoffload/models/gpt.py:6: models (level 'building blocks') imports sequence (level 'training')",
    ]


def test_the_report_reads_only_result_files() -> None:
    bad = [f"{p.relative_to(ROOT)}:{line} imports {mod}" for p in sorted((ROOT / "reports").rglob("*.py"))
           for line, mod in imports(p) if unit_of(mod) is not None
           and not any(mod == ok or mod.startswith(ok + ".") for ok in REPORT_READS)]
    assert not bad, "the report may import only " + ", ".join(REPORT_READS) + ":\n" + "\n".join(bad)


# ------------------------------------------------------------------------------------ the planner
def _planner_allowed(module: str) -> bool:
    top = module.split(".")[0]
    if top == "superoffload":
        return any(module == ok or module.startswith(ok + ".") for ok in PLANNER_PROJECT)
    return top in sys.stdlib_module_names or top in PLANNER_THIRD_PARTY


MODULES = sorted(PLANNER.glob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=[p.name for p in MODULES])
def test_planner_imports_only_the_allowed_modules(path: Path) -> None:
    bad = [f"{path.name}:{line} imports {mod}" for line, mod in imports(path) if not _planner_allowed(mod)]
    assert not bad, "the planner may import only the stdlib, numpy and " + ", ".join(PLANNER_PROJECT) + ":\n" + \
        "\n".join(bad)


def test_the_checker_sees_imports_inside_functions(tmp_path) -> None:
    pkg = tmp_path / "superoffload" / "planner"
    pkg.mkdir(parents=True)
    src = pkg / "m.py"
    src.write_text("import math\n\ndef f():\n    from superoffload.harness.models import get_shape\n"
                   "    import deepspeed\n    from . import costmodel\n")
    mods = [m for _, m in imports(src, tmp_path)]
    assert mods == ["math", "superoffload.harness.models.get_shape", "deepspeed", "superoffload.planner.costmodel"]
    assert [m for m in mods if not _planner_allowed(m)] == ["superoffload.harness.models.get_shape", "deepspeed"]


def test_importing_the_planner_loads_no_torch_and_no_harness() -> None:
    mods = ", ".join(f"superoffload.planner.{p.stem}" for p in MODULES if p.stem != "__init__")
    code = (f"import sys, {mods}; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'deepspeed') "
            "or m.startswith(('superoffload.harness', 'superoffload.engine', 'superoffload.calibrate'))))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "[]"


def test_the_harness_builds_the_shapes_table() -> None:
    """One table of named shapes, at the shapes level (the planner's `explain` and `paper` need them);
    the zoo and the harness re-export it rather than keeping a copy."""
    from superoffload import models
    from superoffload.harness import models as harness_models
    from superoffload.shapes import MODELS

    assert models.MODELS is MODELS
    assert harness_models.MODELS is MODELS
