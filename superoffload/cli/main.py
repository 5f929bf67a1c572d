"""The `superoffload` console script."""

from __future__ import annotations

import argparse
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
TOP_COMMANDS = [
    "superoffload.calibrate.machine",  # calibrate
    "superoffload.planner.explain",  # explain
    "superoffload.calibrate.accuracy",  # validate
    "superoffload.cli.finetune",  # finetune
    "superoffload.nightly.cli",  # nightly
]


def _register(sub: argparse._SubParsersAction, modules: list[str]) -> None:
    for name in modules:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name and name.startswith(e.name):
                continue  # that part is not in this install
            raise
        mod.add_cli(sub)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="superoffload", description=__doc__.strip() + " "
                                     "SuperOffload training engine tools and benchmark harness.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    top = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    bench = top.add_parser("bench", help="benchmarks: run, compare, adam, cast, memory",
                           description="Benchmarks that write JSON records.")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True, metavar="BENCH")
    _register(bench_sub, BENCH_COMMANDS)
    _register(top, TOP_COMMANDS)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s")
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
