import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "finetune"))

from helpers import make_dataset, make_tiny_llama  # noqa: E402


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> tuple[Path, Path]:
    """(model directory, 20-example JSONL file) for the fault tests, built once per session."""
    root = tmp_path_factory.mktemp("faults")
    data = make_dataset(root / "data.jsonl", n=20)
    return make_tiny_llama(root / "model", data), data
