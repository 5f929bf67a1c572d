"""`superoffload finetune` is a sub-command of the console script."""

from __future__ import annotations

import pytest


def test_registered_in_the_superoffload_command(capsys):
    from superoffload.cli.main import main

    with pytest.raises(SystemExit) as e:
        main(["finetune", "--help"])
    assert e.value.code == 0
    assert "--max-length" in capsys.readouterr().out
