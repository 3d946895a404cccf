"""`perfkit compare`: gate on performance, a candidate sweep against a baseline, level by level.

Either run may be a perfkit JSON result or a perf_analyzer `-f` CSV (perf_analyzer's own or
perfkit's). A CSV has no per-window samples, so with one the gate is on thresholds alone, and the
verdict and the JUnit say so.

Runs set up differently (protocol, server, endpoint type, batch size, model, machine) and runs with
levels that failed their checks are compared all the same; each difference is a WARNING line just
above the verdict, a `warning` property of the JUnit suite, and a box in the HTML comparison.

Exit codes: 0 no regression; 1 a regression beyond the thresholds and beyond the runs' noise (beyond
the thresholds alone with a CSV); 2 usage or input error (e.g. the runs did not measure the same
levels, a file that is neither a perfkit result nor a perf_analyzer CSV).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from perfkit.analysis.compare import compare_sweeps
from perfkit.cli.common import Command, add_gate_arguments, load_sweep, thresholds_from, write
from perfkit.errors import ExitCode
from perfkit.report.compare_text import render_comparison_lines
from perfkit.report.junit import render_gate_junit
from perfkit.results.files import ReportItem


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("baseline", type=Path, metavar="BASELINE.json|.csv")
    p.add_argument("candidate", type=Path, metavar="CANDIDATE.json|.csv")
    add_gate_arguments(p, suppress=False)
    p.add_argument("--html", type=Path, metavar="OUT.html", help="also write the two runs' comparison report")


def _names(baseline: Path, candidate: Path) -> tuple[str, str]:
    return (baseline.stem, candidate.stem) if baseline.stem != candidate.stem else ("baseline", "candidate")


def run(args: argparse.Namespace, argv: list[str]) -> int:
    thresholds = thresholds_from(vars(args))
    thresholds.validate()
    baseline, candidate = load_sweep(args.baseline, "the baseline"), load_sweep(args.candidate, "the candidate")
    names = _names(args.baseline, args.candidate)
    comparison = compare_sweeps(baseline, candidate, thresholds, names=names)
    print("\n".join(render_comparison_lines(comparison)))
    if args.junit is not None:
        write(args.junit, render_gate_junit(comparison))
    if args.html is not None:
        from perfkit.report.html import render_html  # it loads matplotlib: only when a report is drawn

        items = [ReportItem(names[0], "sweep", baseline, str(args.baseline)),
                 ReportItem(names[1], "sweep", candidate, str(args.candidate))]  # fmt: skip
        write(args.html, render_html(items, thresholds=thresholds))
    return ExitCode.FAILED if comparison.regressions else ExitCode.OK


COMMAND = Command(
    "compare",
    help="gate on performance: compare two sweeps level by level",
    description="Compare a candidate sweep with a baseline, level by level. A metric regresses when "
    "its change is worse than the threshold AND beyond the runs' own variability (Mann-Whitney U or "
    "Welch t on the per-window throughputs; non-overlapping p99 confidence intervals). Either run may "
    "also be a perf_analyzer -f CSV; it has no per-window samples, so the gate is then on the thresholds alone. "
    "Runs set up differently (protocol, server, endpoint type, batch size, model, machine) or with levels that "
    "are not valid are compared all the same, with a WARNING line for each above the verdict.",
    add_arguments=add_arguments,
    run=run,
    epilog="Exit codes: 0 no regression, 1 regression, 2 usage or input error (e.g. different levels).",
)
