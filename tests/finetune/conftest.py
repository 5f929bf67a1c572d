import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from helpers import make_dataset, make_tiny_llama  # noqa: E402


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> tuple[Path, Path]:
    """(model directory, 50-example JSONL file), built once per session."""
    root = tmp_path_factory.mktemp("tiny-llama")
    data = make_dataset(root / "data.jsonl")
    return make_tiny_llama(root / "model", data), data
