"""The planner stands alone: profile in, plan out. Every import of every module under
superoffload/planner, including imports inside functions, is checked against an allow-list, so a
run-time dependency on the harness, the engine, the calibrate package or DeepSpeed cannot creep back in
behind a lazy import."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import superoffload.planner

PLANNER = Path(superoffload.planner.__file__).parent
ALLOWED_PROJECT = ("superoffload.shapes", "superoffload.options", "superoffload.packing", "superoffload.units",
                   "superoffload.planner")
ALLOWED_THIRD_PARTY = ("numpy",)  # torch is not needed: the planner is torch-free


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in a file, at any depth; relative imports resolved."""
    package = "superoffload.planner"
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                if node.module:
                    out.append((node.lineno, f"{base}.{node.module}"))
                else:  # `from . import x`: x may be a module of the package
                    out += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
            else:
                out.append((node.lineno, node.module or ""))
    return out


def _allowed(module: str) -> bool:
    top = module.split(".")[0]
    if top == "superoffload":
        return module in ALLOWED_PROJECT or module.startswith("superoffload.planner.")
    return top in sys.stdlib_module_names or top in ALLOWED_THIRD_PARTY


MODULES = sorted(PLANNER.glob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=[p.name for p in MODULES])
def test_planner_imports_only_the_allowed_modules(path: Path) -> None:
    bad = [f"{path.name}:{line} imports {mod}" for line, mod in _imports(path) if not _allowed(mod)]
    assert not bad, "the planner may import only the stdlib, numpy and " + ", ".join(ALLOWED_PROJECT) + ":\n" + \
        "\n".join(bad)


def test_the_checker_sees_imports_inside_functions(tmp_path) -> None:
    src = tmp_path / "m.py"
    src.write_text("import math\n\ndef f():\n    from superoffload.harness.models import get_shape\n"
                   "    import deepspeed\n    from . import costmodel\n")
    mods = [m for _, m in _imports(src)]
    assert mods == ["math", "superoffload.harness.models", "deepspeed", "superoffload.planner.costmodel"]
    assert [m for m in mods if not _allowed(m)] == ["superoffload.harness.models", "deepspeed"]


def test_importing_the_planner_loads_no_torch_and_no_harness() -> None:
    mods = ", ".join(f"superoffload.planner.{p.stem}" for p in MODULES if p.stem != "__init__")
    code = (f"import sys, {mods}; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'deepspeed') "
            "or m.startswith(('superoffload.harness', 'superoffload.engine', 'superoffload.calibrate'))))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "[]"


def test_the_harness_builds_the_shapes_table() -> None:
    """One table of named shapes, at the shapes level (the planner's `explain` and `paper` need them);
    the harness re-exports it rather than keeping a copy."""
    from superoffload.harness import models
    from superoffload.shapes import MODELS

    assert models.MODELS is MODELS
