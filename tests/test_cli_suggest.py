"""`superoffload` argparse errors for an invalid choice or sub-command name suggest the closest valid one."""

from __future__ import annotations

import pytest

from superoffload.cli.main import SuggestingParser, build_parser, closest_choice


def _error(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(argv)
    assert e.value.code == 2  # argparse's usage-error status
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_option_choice_suggests_the_closest(capsys):
    err = _error(["bench", "run", "--system", "superofload", "--model", "gpt-tiny", "--out", "x"], capsys)
    assert err.startswith("superoffload bench run: error: argument --system: invalid choice: 'superofload' "
                          "(choose from ")
    assert err.endswith("; did you mean 'superoffload'?")


@pytest.mark.parametrize("argv,prog,typo,close", [
    (["bnech", "run"], "superoffload", "bnech", "bench"),
    (["bench", "rnu"], "superoffload bench", "rnu", "run"),
    (["nightly", "chek"], "superoffload nightly", "chek", "check"),
])
def test_subcommand_name_suggests_the_closest(argv, prog, typo, close, capsys):
    err = _error(argv, capsys)
    assert err.startswith(f"{prog}: error: argument ")
    assert f"invalid choice: {typo!r}" in err and err.endswith(f"; did you mean {close!r}?")


def test_nothing_close_keeps_argparse_message(capsys):
    err = _error(["bench", "run", "--system", "zzz", "--model", "gpt-tiny", "--out", "x"], capsys)
    assert err.endswith("'zero_offload')") and "did you mean" not in err


def test_sub_parsers_inherit_the_class():
    parser = build_parser()
    sub = parser._subparsers._group_actions[0]
    assert all(isinstance(p, SuggestingParser) for p in sub.choices.values())


def test_closest_choice_ignores_non_strings():
    assert closest_choice(3, [1, 2, 4]) is None
    assert closest_choice("fp61", ["fp32", "bf16", "fp16"]) == "fp16"
    assert closest_choice("x", ["fp32"]) is None
