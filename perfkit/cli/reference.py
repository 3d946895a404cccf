"""The reference pages generated from the code, so that they cannot drift from it: docs/cli.md, every
flag of every command read from the parsers `COMMANDS` builds, and the table of figures in
docs/figures.md, read from the metric catalogue (`perfkit.analysis.metrics.METRICS`).

    python -m perfkit.cli.reference            # print docs/cli.md
    python -m perfkit.cli.reference --write    # rewrite docs/cli.md and the table in docs/figures.md

tests/unit/test_docs.py fails when a checked-in page differs from what this renders. Usage lines are
left out: argparse wraps them to the terminal's width, and a page must not depend on who made it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from perfkit.analysis.metrics import METRICS, SESSION_METRICS, TOKEN_METRICS, Metric
from perfkit.cli import COMMANDS, build_parser
from perfkit.cli.common import Command

#: Where the pages live in a checkout: the repository root's docs/.
DOCS = Path(__file__).resolve().parents[2] / "docs"
FIGURES_START = "<!-- figures-table:start -->\n"
FIGURES_END = "<!-- figures-table:end -->"

_HEAD = """# perfkit's command line

<!-- Generated from the parsers of perfkit.cli.COMMANDS by `python -m perfkit.cli.reference --write`; do not edit. -->

Every flag of every `perfkit` command, as its parser defines it (`perfkit COMMAND --help` prints the
same). The reference server's flags are in [server.md](server.md); what each figure means is in
[figures.md](figures.md).
"""


def _cell(text: str) -> str:
    """One Markdown table cell: on one line, its pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def _default(action: argparse.Action) -> str:
    value = action.default
    if value in (None, False, "", []) or value is argparse.SUPPRESS or action.nargs == 0:
        return ""
    return f"`{value}`"


def _value(action: argparse.Action) -> str:
    if action.nargs == 0:
        return ""
    if action.metavar is not None:
        metavar = action.metavar if isinstance(action.metavar, str) else " ".join(action.metavar)
    elif action.choices is not None:
        metavar = "|".join(str(c) for c in action.choices)
    else:
        metavar = action.dest.upper()
    return f"`{metavar}`"


def _meaning(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if action.help is None:
        return ""
    if action.help == argparse.SUPPRESS:
        return "accepted; not listed by --help"
    # argparse's own expansion of %(default)s, %(choices)s ...; the formatter's width plays no part.
    return str(parser._get_formatter()._expand_help(action))


def _flags_table(parser: argparse.ArgumentParser, actions: Iterable[argparse.Action]) -> list[str]:
    rows = ["| flag | value | default | meaning |", "| --- | --- | --- | --- |"]
    for action in actions:
        if isinstance(action, argparse._HelpAction):
            continue
        names = ", ".join(f"`{name}`" for name in action.option_strings) or f"`{action.metavar or action.dest}`"
        cells = (names, _value(action) if action.option_strings else "", _default(action), _meaning(parser, action))
        rows.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return rows if len(rows) > 2 else []


def _command_section(command: Command) -> list[str]:
    parser = command.parser()
    lines = [f"## perfkit {command.name}", "", command.help[:1].upper() + command.help[1:] + ".", ""]
    if command.formatter_class is argparse.RawDescriptionHelpFormatter:
        lines += ["```text", command.description.rstrip(), "```", ""]
    else:
        lines += [command.description, ""]
    if command.epilog:
        lines += [command.epilog, ""]
    for group in parser._action_groups:
        table = _flags_table(parser, group._group_actions)
        if not table:
            continue
        title = "arguments" if group.title == "positional arguments" else group.title or "options"
        lines += [f"### {command.name}: {title}", ""]
        if group.description:
            lines += [group.description, ""]
        lines += [*table, ""]
    return lines


def render_cli_reference() -> str:
    """docs/cli.md: the top-level flags and exit codes, then each command's flags, group by group."""
    top = build_parser()
    lines = [_HEAD, "## perfkit", "", str(top.description), "", str(top.epilog), ""]
    lines += [f"- [`perfkit {name}`](#perfkit-{name}): {command.help}" for name, command in COMMANDS.items()]
    lines.append("")
    for command in COMMANDS.values():
        lines += _command_section(command)
    return "\n".join(lines).rstrip("\n") + "\n"


def _spellings(metric: Metric) -> str:
    return ", ".join(f"`{s}`" for s in metric.spellings[1:])


def _metrics_table(metrics: Sequence[Metric]) -> list[str]:
    rows = [
        "| figure | unit | better | also named | `compare` gate | meaning |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for m in metrics:
        cells = (f"`{m.name}`", m.unit, m.better, _spellings(m), f"`{m.gate}`" if m.gate else "", m.description)
        rows.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return rows


def render_figures_table() -> str:
    """The block between docs/figures.md's markers: every metric of the catalogue, in three tables."""
    special = {m.name for m in (*TOKEN_METRICS, *SESSION_METRICS)}
    lines = ["### Every request", "", *_metrics_table([m for m in METRICS if m.name not in special]), ""]
    lines += ["### Generative endpoints (`--endpoint-type`)", "", *_metrics_table(TOKEN_METRICS), ""]
    lines += ["### Multi-turn sessions", "", *_metrics_table(SESSION_METRICS), ""]
    return "\n".join(lines)


def with_figures_table(page: str) -> str:
    """docs/figures.md's text with the generated block replaced by the catalogue's current one."""
    head, start, rest = page.partition(FIGURES_START)
    _, end, tail = rest.partition(FIGURES_END)
    if not start or not end:
        raise ValueError(f"docs/figures.md lost its markers {FIGURES_START.strip()} ... {FIGURES_END}")
    return head + start + render_figures_table() + end + tail


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perfkit.cli.reference", description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite docs/cli.md and docs/figures.md's table")
    parser.add_argument("--docs", type=Path, default=DOCS, metavar="DIR", help="the docs folder (default: %(default)s)")
    args = parser.parse_args(argv)
    if not args.write:
        print(render_cli_reference(), end="")
        return 0
    (args.docs / "cli.md").write_text(render_cli_reference())
    figures = args.docs / "figures.md"
    figures.write_text(with_figures_table(figures.read_text()))
    print(f"wrote {args.docs / 'cli.md'} and {figures}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
