"""The engine's walls: no module calls another module's classes' private methods, and engine.py stays a
coordinator (its parts live in launch.py, validate.py, tail.py, adopt.py, bucket.py, build.py)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "superoffload"


def _private_methods(trees: dict[Path, ast.Module]) -> dict[str, set[Path]]:
    """Private method name (`_x`, not dunder) -> the modules whose classes define it."""
    out: dict[str, set[Path]] = {}
    for path, tree in trees.items():
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            for fn in cls.body:
                if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(fn.name):
                    out.setdefault(fn.name, set()).add(path)
    return out


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_calls(trees: dict[Path, ast.Module]) -> list[str]:
    """`obj._method(...)` where `obj` is not `self`/`cls`/`super()` and `_method` is a private method of a
    project class defined in another module: a call through the wall."""
    defined = _private_methods(trees)
    bad = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            name, recv = node.func.attr, node.func.value
            if not _private(name) or name not in defined or path in defined[name]:
                continue
            if isinstance(recv, ast.Name) and recv.id in ("self", "cls"):
                continue
            if isinstance(recv, ast.Call) and isinstance(recv.func, ast.Name) and recv.func.id == "super":
                continue
            bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node.func)}()")
    return bad


def _trees() -> dict[Path, ast.Module]:
    return {p: ast.parse(p.read_text(), str(p)) for p in sorted(PACKAGE.rglob("*.py"))}


def test_no_module_calls_another_modules_private_methods():
    assert private_calls(_trees()) == []


def test_a_planted_private_call_is_found():
    trees = _trees()
    planted = PACKAGE / "engine" / "plain_loop.py"
    trees[planted] = ast.parse(planted.read_text() + "\n\ndef planted(e):\n    e._check_ready_for_backward()\n")
    found = private_calls(trees)
    assert len(found) == 1 and "_check_ready_for_backward" in found[0]


def test_engine_py_stays_a_coordinator():
    lines = (PACKAGE / "engine" / "engine.py").read_text().count("\n")
    assert lines <= 700, f"superoffload/engine/engine.py has {lines} lines; move a concept into its own module"
