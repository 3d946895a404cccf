"""`perfkit report`: one self-contained HTML file from sweep and tune result files.

Exit codes: 0, or 2 for a usage or input error.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from perfkit.analysis.compare import Thresholds
from perfkit.cli.common import Command, say, write
from perfkit.errors import ExitCode, PerfkitError
from perfkit.report.tidy import append_history, render_tidy_schema
from perfkit.results.files import ReportItem, load_result
from perfkit.results.model import SweepResult

REPORT_METRICS = ("throughput_infer_per_s", "p50_ms", "p99_ms")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", nargs="*", type=Path, metavar="RESULT.json", help="sweep or tune result files")
    p.add_argument(
        "-o", "--output", type=Path, metavar="OUT.html", help="default: RESULT.html, or report.html for several"
    )
    p.add_argument("--label", action="append", default=[], metavar="NAME", help="a name per result, in order")
    p.add_argument("--title", help="the page's title")
    p.add_argument("--slo-p99", type=float, metavar="MS", help="draw a p99 bound on the latency figures")
    p.add_argument("--append", type=Path, metavar="HISTORY.csv", help="also add the sweeps' tidy rows to HISTORY.csv")
    p.add_argument("--tidy-schema", action="store_true", help="print the tidy CSV's schema as Markdown and exit")


def _labelled(paths: Sequence[Path], labels: Sequence[str]) -> list[ReportItem]:
    if len(labels) > len(paths):
        raise PerfkitError(f"--label given {len(labels)} times for {len(paths)} result files")
    items = [load_result(path, labels[i] if i < len(labels) else None) for i, path in enumerate(paths)]
    seen: dict[str, int] = {}
    unique = []
    for item in items:
        n = seen[item.label] = seen.get(item.label, 0) + 1
        unique.append(item if n == 1 else ReportItem(f"{item.label} ({n})", item.kind, item.result, item.source))
    return unique


def run(args: argparse.Namespace, argv: list[str]) -> int:
    from perfkit.report.html import render_html  # it loads matplotlib: only when a report is drawn

    if args.tidy_schema:
        print(render_tidy_schema(), end="")
        return ExitCode.OK
    if not args.results:
        raise PerfkitError("perfkit report needs one or more result files (RESULT.json ...)")
    items = _labelled(args.results, args.label)
    out = args.output or (args.results[0].with_suffix(".html") if len(items) == 1 else Path("report.html"))
    html = render_html(items, title=args.title, slo_ms=args.slo_p99, thresholds=Thresholds(metrics=REPORT_METRICS))
    write(out, html)
    if args.append is not None:
        for item in items:
            if isinstance(item.result, SweepResult):
                append_history(args.append, item.result, Path(item.source).stem)
        say(f"appended to {args.append}")
    return ExitCode.OK


COMMAND = Command(
    "report",
    help="write one self-contained HTML report from sweep and tune results",
    description="Write one self-contained HTML file (images inline, no network) from perfkit result "
    "files. Several results are overlaid and compared.",
    add_arguments=add_arguments,
    run=run,
)
