"""The `superoffload` console script."""

from __future__ import annotations

import argparse
import difflib
import gc
import importlib
import logging
import sys

# (module, attribute) of each sub-command's `add_cli(subparsers)`; optional parts are skipped when
# their module is absent from this install.
BENCH_COMMANDS = [
    "superoffload.cli.bench_run",
    "superoffload.cli.bench_compare",
    "superoffload.harness.microbench.adam",
    "superoffload.harness.microbench.cast",
    "superoffload.harness.microbench.memory",
]
# command -> the module whose add_cli registers it. Only the command a call names is imported (every
# one when it names none, or one not here: --help, a misspelling to suggest for): `nightly`, `explain` and
# `validate` do not import torch, so they start in a fifth of a second instead of three (a nightly's check
# calls the CLI five times).
TOP_COMMANDS = {
    "calibrate": "superoffload.calibrate.machine",
    "explain": "superoffload.planner.explain",
    "validate": "superoffload.calibrate.accuracy",
    "finetune": "superoffload.cli.finetune",
    "nightly": "superoffload.nightly.cli",
}


class SuggestingParser(argparse.ArgumentParser):
    """An ArgumentParser whose "invalid choice" errors (an option's choices, a sub-command's name) end with
    the closest valid choice: "...; did you mean 'superoffload'?". Python 3.11 has no such option (3.14's
    `suggest_on_error`). Every sub-parser is one too: add_subparsers' parser_class defaults to type(self)."""

    def _check_value(self, action: argparse.Action, value: object) -> None:
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as e:
            close = closest_choice(value, action.choices or ())
            if close is None or "maybe you meant" in e.message:  # nothing close, or argparse said it itself
                raise
            raise argparse.ArgumentError(action, f"{e.message}; did you mean {close!r}?") from None


def closest_choice(value: object, choices: object) -> str | None:
    """The valid string choice nearest to ``value`` (difflib's ratio >= 0.6), or None."""
    if not isinstance(value, str):
        return None  # converted values (ints, paths): a spelling suggestion means nothing there
    hits = difflib.get_close_matches(value, [c for c in choices if isinstance(c, str)], n=1)
    return hits[0] if hits else None


def _register(sub: argparse._SubParsersAction, modules: list[str]) -> None:
    for name in modules:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name and name.startswith(e.name):
                continue  # that part is not in this install
            raise
        mod.add_cli(sub)


def _named_command(argv: list[str]) -> str | None:
    """The top-level command ``argv`` names, when it is one of TOP_COMMANDS (the first word not an option;
    the only option before a command is -v)."""
    words = [a for a in argv if not a.startswith("-")]
    return words[0] if words and words[0] in TOP_COMMANDS else None


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The whole parser; given the ``argv`` it will parse, only the parts that argv's command needs."""
    parser = SuggestingParser(prog="superoffload", description=__doc__.strip() + " "
                              "SuperOffload training engine tools and benchmark harness.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    top = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    named = None if argv is None else _named_command(argv)
    if named is not None:
        _register(top, [TOP_COMMANDS[named]])
        return parser
    bench = top.add_parser("bench", help="benchmarks: run, compare, adam, cast, memory",
                           description="Benchmarks that write JSON records.")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True, metavar="BENCH")
    _register(bench_sub, BENCH_COMMANDS)
    _register(top, list(TOP_COMMANDS.values()))
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s")
    return int(args.func(args) or 0)


def console() -> int:
    """The `superoffload` command (console script and `python -m superoffload`): main(), then an exit that
    does not walk torch's objects."""
    rc = main()
    # At exit Python runs full garbage collections over every live object: with torch, dynamo and sympy
    # imported that is ~1.4 s of a 2-core machine per command, and a sweep runs hundreds of commands. One
    # collection here finalizes what is garbage now; the survivors, alive until the exit anyway, are frozen so
    # the exit's collections skip them (Python does not promise to finalize objects alive at exit either).
    gc.collect()
    gc.freeze()
    return rc


if __name__ == "__main__":
    sys.exit(console())
