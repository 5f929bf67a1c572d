"""The DeepSpeed way in: the import lines a DeepSpeed SuperOffload script changes (DeepSpeedExamples'
finetune_zero3.py does `import deepspeed` and `from deepspeed import comm as dist`), said the same in the
README, the docs' table and the example, and `superoffload.comm` answering what the script asks."""

from __future__ import annotations

import re
from pathlib import Path

import superoffload

ROOT = Path(__file__).resolve().parents[2]


def changed_lines() -> list[tuple[str, str]]:
    """(new line, the DeepSpeed line it replaces) of every `# was:` line of the example."""
    text = (ROOT / "examples" / "deepspeed_script.py").read_text()
    return [(m.group(1).strip(), m.group(2).strip()) for m in re.finditer(r"^(.*?)#\s*was:\s*(.*)$", text, re.M)]


def test_the_readme_and_the_docs_name_every_line_the_example_changes():
    lines = changed_lines()
    assert [old for _, old in lines] == ["import deepspeed", "from deepspeed import comm as dist"]
    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index("**A DeepSpeed script**"):readme.index("**The engine's own API**")]
    table = next(row for row in (ROOT / "docs" / "integrations.md").read_text().splitlines()
                 if row.startswith("| a DeepSpeed script |"))
    for new, old in lines:
        assert new in block and f"was: {old}" in block
        assert new in table
    assert "two import lines" in block


def test_superoffload_comm_answers_as_deepspeed_comm_without_a_process_group():
    import torch.distributed

    import superoffload as deepspeed
    from superoffload import comm as dist

    if torch.distributed.is_initialized():  # the in-process baselines keep theirs until exit: start from none
        torch.distributed.destroy_process_group()
    assert deepspeed.comm is dist and superoffload.deepspeed.comm is dist
    assert not dist.is_initialized()
    assert (dist.get_rank(), dist.get_world_size(), dist.get_local_rank()) == (0, 1, 0)
    dist.barrier()  # nothing to wait for
    assert dist.all_reduce(None) is None and dist.broadcast(None, 0) is None
    assert dist.ReduceOp.SUM is not None
