"""The README's ways in are the scripts in examples/: each runs as documented (two steps here)."""

from __future__ import annotations

import sys

import pytest

from tests import warm
from tests.ranks import REPO, rank_env

EXAMPLES = {
    "torch_loop.py": [],
    "accelerate_loop.py": [],
    "hf_trainer.py": ["--output-dir", "{tmp}/hf"],
    "trl_sft.py": ["--output-dir", "{tmp}/trl"],
    "deepspeed_script.py": ["--deepspeed_config", "examples/ds_config.json", "--save-dir", "{tmp}/ds"],
}


@pytest.mark.parametrize("script", sorted(EXAMPLES))
def test_example_runs(script, tmp_path):
    argv = [a.format(tmp=tmp_path) for a in EXAMPLES[script]]
    res = warm.run([sys.executable, f"examples/{script}", "--steps", "2", *argv], cwd=REPO, env=rank_env(),
                   capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]


def test_the_readme_torch_loop_runs(tmp_path):
    """The README's complete torch-loop snippet, as printed there."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("**A plain torch loop**"):]
    code = section[section.index("```python\n") + len("```python\n"):]
    code = code[:code.index("```")]
    script = tmp_path / "readme_loop.py"
    script.write_text(code)
    res = warm.run([sys.executable, str(script)], cwd=tmp_path, env=rank_env(), capture_output=True, text=True,
                   timeout=300)
    assert res.returncode == 0, res.stderr[-4000:]
