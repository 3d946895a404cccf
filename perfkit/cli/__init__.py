"""perfkit's command line: one module per sub-command, each declaring its `Command` (arguments and
run), listed once in `COMMANDS`. `main()` parses, dispatches and returns the exit code; a
PerfkitError prints as one line.

Exit codes: 0 done; 1 the run could not finish (server unreachable or gone); 2 usage or input
error; 3 a level never stabilised; 4 some requests failed; 130 interrupted (results so far kept).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from perfkit._version import __version__
from perfkit.cli import compare, probe, report, run, sweep, tune
from perfkit.cli.common import Command
from perfkit.errors import PerfkitError
from v2kit import compiled

#: The sub-commands, in the order `perfkit --help` lists them.
COMMANDS: dict[str, Command] = {
    command.name: command
    for command in (sweep.COMMAND, report.COMMAND, compare.COMMAND, run.COMMAND, tune.COMMAND, probe.COMMAND)
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="perfkit",
        description="Load testing and performance analysis for KServe v2 / Triton inference servers.",
        epilog="Exit codes: 0 done, 1 could not finish (or a load worker died), 2 usage error, 3 unstable level, 4 request errors, "
        "130 interrupted.",
    )
    parser.add_argument("--version", action=compiled.version_action("perfkit", __version__, ("v2kit", "perfkit")))
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS.values():
        command.add_to(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args, unknown = parser.parse_known_args(arguments)
    if unknown:  # refused with the command's own usage, which lists its flags, not perfkit's
        subcommands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        subcommands.choices[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return int(COMMANDS[args.command].run(args, arguments))
    except PerfkitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return int(exc.exit_code)
