"""`perfkit sweep`, the command: its description, the run from a spec, and the console ending
(summary table, files written, why it stopped) that `perfkit run` shares through `measure`.
"""

from __future__ import annotations

import argparse
import sys

from perfkit.cli.common import Command
from perfkit.cli.sweep.flags import add_arguments
from perfkit.cli.sweep.perf_analyzer import perf_analyzer_notes
from perfkit.cli.sweep.spec import spec_from_args
from perfkit.errors import ExitCode
from perfkit.genai.records import unstreamed_note
from perfkit.report.summary import exit_line, sweep_notes, sweep_table
from perfkit.sweep.run import SweepRun, run_sweep
from perfkit.sweep.spec import SweepSpec

DESCRIPTION = """\
Measure a KServe v2 server over a range of load levels, as perf_analyzer does, with its flag names
and defaults. With no -u, the bundled reference server is started on the demo models and swept.

Where perfkit differs from perf_analyzer, on purpose:
  * request-rate mode is open loop: sends keep to the schedule however slow the server is, and
    latency is reported from the intended send time (coordinated omission corrected, as wrk2 and
    MLPerf LoadGen) beside the service latency from the actual send, with the share of late sends;
  * a level that never stabilises is kept and flagged (exit code 3), not dropped;
  * schedules and random inputs come from --seed, recorded with the results;
  * results are written after every level, so an interrupted sweep keeps what it measured.
"""


def measure(spec: SweepSpec, argv: list[str]) -> tuple[SweepRun, int]:
    """Run the sweep, then print its summary table, the files written and why it stopped early."""
    if missing := unstreamed_note(spec.genai.endpoint_type, spec.genai.streaming):
        print(f"note: {missing}", file=sys.stderr)
    run, code = run_sweep(spec, argv)
    table = [] if spec.output.quiet else sweep_table(run.result)
    if table:
        print("\n".join(table))
    for note in sweep_notes(run.result, run.outputs.paths() if run.outputs is not None else [], code):
        print(note, file=sys.stderr)
    for line in failure_lines(run, code):
        print(line, file=sys.stderr)
    return run, code


def failure_lines(run: SweepRun, code: int) -> list[str]:
    """Why requests failed, in the server's own words, as the last lines of a run they spoilt (exit 4,
    or a sweep stopped by them): said during the run too, but a table and file names came since."""
    if code not in (ExitCode.ERRORS, ExitCode.FAILED) or not run.failures:
        return []
    return [f"error: requests failed: {line}" for line in run.failures]


def interrupt_lines(swept: SweepRun) -> list[str]:
    """What Ctrl-C kept, after the `wrote` lines: the levels finished, or that none had."""
    if swept.result is None or not swept.result.levels:
        return ["interrupted before any level finished: no results written"]
    lines = ["interrupted: the levels finished so far are in the files above"]
    history = swept.outputs.history_path if swept.outputs is not None else None
    if swept.outputs is not None and history is not None and history not in swept.outputs.written:
        lines.append(f"--append {history}: not appended to, as the sweep was interrupted")
    return lines


def run(args: argparse.Namespace, argv: list[str]) -> int:
    spec = spec_from_args(args)
    for note in perf_analyzer_notes(args):
        print(note, file=sys.stderr)
    swept, code = measure(spec, argv)
    if code == ExitCode.INTERRUPTED:
        print("\n".join(interrupt_lines(swept)), file=sys.stderr)
    ending = exit_line(swept.result, code)  # exit 3: which levels, which check, which flag
    if ending is not None:
        print(ending, file=sys.stderr)
    return int(code)


COMMAND = Command(
    "sweep",
    help="measure throughput and latency over concurrency or request-rate levels",
    description=DESCRIPTION,
    add_arguments=add_arguments,
    run=run,
    formatter_class=argparse.RawDescriptionHelpFormatter,
)
