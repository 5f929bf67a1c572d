"""`superoffload COMMAND` imports only that command's module: the commands that need no torch start without it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from superoffload.cli.main import TOP_COMMANDS, build_parser

# print which heavy modules the parse pulled in; --help exits through argparse after the parser is built
PROBE = ("import sys\nfrom superoffload.cli.main import main\ntry:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
         "print(sorted(m for m in ('torch', 'superoffload.cli.bench_run', 'superoffload.nightly.cli') "
         "if m in sys.modules))")


def _imported(argv: list[str]) -> list[str]:
    out = subprocess.run([sys.executable, "-c", PROBE.format(argv=argv)], capture_output=True, text=True,
                         check=True).stdout
    return eval(out.strip().splitlines()[-1])  # a list literal this test printed


@pytest.mark.parametrize("command", ["nightly", "explain", "validate"])
def test_a_command_without_torch_starts_without_it(command):
    assert "torch" not in _imported([command, "--help"])


def test_one_command_named_imports_only_its_module_and_none_named_imports_all():
    assert _imported(["-v", "nightly", "--help"]) == ["superoffload.nightly.cli"]
    assert set(_imported(["--help"])) >= {"torch", "superoffload.cli.bench_run", "superoffload.nightly.cli"}


def test_the_parser_for_one_command_parses_as_the_whole_one_does():
    argv = ["nightly", "check", "--store", "h.sqlite"]
    assert vars(build_parser(argv).parse_args(argv)).keys() == vars(build_parser().parse_args(argv)).keys()
    assert set(TOP_COMMANDS) <= set(build_parser()._subparsers._group_actions[0].choices)


def test_the_command_returns_mains_status_and_exits_with_what_is_alive_frozen():
    """console() (the console script, `python -m superoffload`): main()'s status, then everything alive frozen so
    the interpreter's exit does not walk torch's objects again (~1.4 s of a 2-core machine per command)."""
    code = ("import gc, sys\nfrom superoffload.cli.main import console\n"
            "sys.argv = ['superoffload', 'explain', '--model', 'gpt-tiny', '--seq', '16', '--json']\n"
            "rc = console()\nprint(rc, gc.get_freeze_count() > 0, file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stderr.strip().splitlines()[-1] == "0 True"
    assert out.stdout.strip().startswith("{")
