"""`perfkit run`: a scenario file's server, its sweep or tune (through that command's own code), and
its gates (a baseline comparison, an SLO).

The scenario's settings become the command's flags, followed by the flags given after SCENARIO, so
that precedence is defaults < file < command line (`perfkit.cli.scenario`).

Exit codes: the command's own (0, 1, 3, 4, 130), or 1 when a gate fails, or 2.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any

from perfkit.analysis.compare import Comparison, Thresholds, compare_sweeps
from perfkit.analysis.slo import check_slo
from perfkit.cli import sweep, tune
from perfkit.cli.common import Command, add_gate_arguments, load_sweep, say, thresholds_from, write
from perfkit.cli.scenario import (
    Scenario,
    command_argv,
    expand_demo,
    load_scenario,
    merge_argv,
    touched_dests,
)
from perfkit.cli.sweep.perf_analyzer import perf_analyzer_notes
from perfkit.errors import ExitCode, PerfkitError
from perfkit.genai.goodput import check_goodput
from perfkit.report.compare_text import render_comparison_lines
from perfkit.report.junit import JUnitCase, render_gate_junit, slo_case
from perfkit.report.summary import exit_line
from perfkit.results.files import ReportItem
from perfkit.target import reference_server_process

#: The commands a scenario can run.
SCENARIO_COMMANDS = {command.name: command for command in (sweep.COMMAND, tune.COMMAND)}


def _add_flags(p: argparse.ArgumentParser) -> None:
    """`perfkit run`'s own flags, read before SCENARIO and again among the flags after it (where
    they win). Flags not given leave no attribute, so that the scenario's own values stand."""
    p.add_argument("--baseline", type=Path, default=argparse.SUPPRESS, metavar="FILE.json",
                   help="compare with this sweep result instead of the scenario's baseline")  # fmt: skip
    p.add_argument("--update-baseline", action="store_true", default=argparse.SUPPRESS,
                   help="after the run, store its result as the scenario's baseline (and do not gate)")  # fmt: skip
    p.add_argument("--no-gate", action="store_true", default=argparse.SUPPRESS, help="run and report, but do not gate")
    p.add_argument("--dry-run", action="store_true", default=argparse.SUPPRESS,
                   help="print the command the scenario runs, and exit")  # fmt: skip
    add_gate_arguments(p, suppress=True)


def add_arguments(p: argparse.ArgumentParser) -> None:
    _add_flags(p)
    p.add_argument("scenario", type=Path, metavar="SCENARIO.toml")
    p.add_argument("overrides", nargs=argparse.REMAINDER, metavar="FLAG", help="flags that override the file")


def _gate_values(args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
    """Gate flags given before and after the scenario (after wins), and the command's flags."""
    after = argparse.ArgumentParser(prog="perfkit run", add_help=False, allow_abbrev=False)
    _add_flags(after)
    parsed, rest = after.parse_known_args(args.overrides)
    return {**vars(args), **vars(parsed)}, rest


def run(args: argparse.Namespace, argv: list[str]) -> int:
    values, overrides = _gate_values(args)
    scenario = load_scenario(args.scenario)
    command = SCENARIO_COMMANDS.get(scenario.command)
    if command is None:
        raise PerfkitError(f"{scenario.path} runs `perfkit {scenario.command}`, which this perfkit does not have")
    parser = command.parser()
    file_argv = command_argv(parser, scenario.settings, f"{scenario.path} [{scenario.command}]")
    if scenario.server.url:
        file_argv = ["--url", scenario.server.url, *file_argv]
    argv = expand_demo(merge_argv(parser, file_argv, overrides))
    gates = scenario.gates
    thresholds = thresholds_from(values, gates.thresholds)
    thresholds.validate()
    baseline = values.get("baseline", gates.baseline)
    start_server = scenario.server.needs_start and "url" not in touched_dests(parser, overrides)
    if values.get("update_baseline") and baseline is None:
        raise PerfkitError("--update-baseline: the scenario names no baseline; add --baseline FILE.json")
    if values.get("dry_run"):
        start = f"   # start the reference server on {scenario.server.model_repository}" if start_server else ""
        print(f"perfkit {scenario.command} {shlex.join(argv)}{start}")
        if baseline and scenario.command == "sweep":
            print(f"gate: compare with {baseline} ({', '.join(thresholds.metrics)}; throughput -"
                  f"{thresholds.max_throughput_drop_pct:g}%, latency +{thresholds.max_latency_increase_pct:g}%)")  # fmt: skip
        if gates.slo_p99_ms:
            print(f"gate: p99 <= {gates.slo_p99_ms:g} ms" + (
                f" at {gates.min_throughput_at_slo:g} infer/s or more" if gates.min_throughput_at_slo else ""))  # fmt: skip
        if gates.min_goodput_per_s:
            print(f"gate: goodput >= {gates.min_goodput_per_s:g} req/s at some level")
        return ExitCode.OK
    if command is not sweep.COMMAND:
        if baseline or gates.slo_p99_ms or gates.min_goodput_per_s:
            raise PerfkitError(f"{scenario.path}: [gates] apply to sweep scenarios; drop them for a {scenario.command}")
        if start_server:
            raise PerfkitError(f"{scenario.path}: perfkit {scenario.command} starts its own server; drop [server]")
        return command.run(parser.parse_args(argv), [scenario.command, *argv])
    if start_server:
        repository = Path(scenario.server.model_repository)
        say(f"starting the reference server on {repository}...")
        with reference_server_process(repository, scenario.server.args) as server:
            protocol = parser.parse_args(argv).protocol
            url = server.grpc_url if protocol == "grpc" else server.http_url
            collect = [] if "--collect-metrics" in argv else ["--collect-metrics"]  # each flag once in the echo
            argv = [*argv, "--url", url, *collect, "--metrics-url", server.metrics_url]
            return _run_sweep(parser, argv, values, scenario, thresholds, baseline)
    return _run_sweep(parser, argv, values, scenario, thresholds, baseline)


def _run_sweep(
    parser: argparse.ArgumentParser,
    argv: list[str],
    values: dict[str, Any],
    scenario: Scenario,
    thresholds: Thresholds,
    baseline_path: Path | None,
) -> int:
    from perfkit.report.html import render_html  # it loads matplotlib: only when a report is drawn

    gates = scenario.gates
    args = parser.parse_args([*argv, "--no-report"])
    spec = sweep.spec_from_args(args)
    for note in perf_analyzer_notes(args):
        say(note)
    baseline = None
    if baseline_path is not None and not values.get("update_baseline") and not values.get("no_gate"):
        baseline = load_sweep(baseline_path, "the baseline")  # read before measuring: fail fast
    say(f"scenario {scenario.name}: perfkit sweep {shlex.join(argv)}")
    swept, code = sweep.measure(spec, ["sweep", *argv])
    result, outputs = swept.result, swept.outputs
    if result is None or outputs is None or code in (ExitCode.FAILED, ExitCode.INTERRUPTED):
        if code == ExitCode.INTERRUPTED and result is not None and not result.completed:
            say(f"error: the sweep stopped early: {result.stop_reason}")
        return int(code)

    gate_failed = False
    comparison: Comparison | None = None
    mismatch: PerfkitError | None = None
    cases: list[JUnitCase] = []
    if baseline is not None:
        try:
            comparison = compare_sweeps(baseline, result, thresholds, names=("baseline", outputs.json_path.stem))
        except PerfkitError as exc:  # reported after the run's own report is written
            mismatch = exc
        else:
            print("\n".join(render_comparison_lines(comparison)))
            gate_failed |= bool(comparison.regressions)
    if gates.slo_p99_ms:
        verdict = check_slo(result, gates.slo_p99_ms, gates.min_throughput_at_slo)
        print("\n".join(verdict.lines()))
        cases.append(slo_case(verdict))
        gate_failed |= not verdict.passed and not values.get("no_gate")
    if gates.min_goodput_per_s:
        goodput = check_goodput(result, gates.min_goodput_per_s, spec.genai.attainment_pct)
        print("\n".join(goodput.lines()))
        name = f"goodput>={gates.min_goodput_per_s:g}/s"
        cases.append(JUnitCase("perfkit.goodput", name, goodput.lines()[0], failure=not goodput.passed))
        gate_failed |= not goodput.passed and not values.get("no_gate")
    junit = values.get("junit", gates.junit)
    if junit is not None and (comparison is not None or cases):
        write(Path(junit), render_gate_junit(comparison, cases))
    items = [ReportItem(outputs.json_path.stem, "sweep", result, str(outputs.json_path))]
    if comparison is not None and baseline is not None:
        items.insert(0, ReportItem("baseline", "sweep", baseline, str(baseline_path)))
    html_path = outputs.pa_csv_path.with_suffix(".html")
    write(html_path, render_html(items, slo_ms=gates.slo_p99_ms, thresholds=thresholds,
                                 title=f"perfkit scenario {scenario.name}"))  # fmt: skip
    if mismatch is not None:
        raise mismatch
    if values.get("update_baseline") and baseline_path is not None:
        write(Path(baseline_path), outputs.json_path.read_text())
    if gate_failed:
        return ExitCode.FAILED
    if code == ExitCode.UNSTABLE and gates.allow_unstable:
        return ExitCode.OK
    ending = exit_line(result, code)  # exit 3 ends with which levels, which check, which flag
    if ending is not None:
        say(ending)
    return int(code)


COMMAND = Command(
    "run",
    help="run a scenario file: start or target the server, sweep (or tune), then gate",
    description="Run a scenario (TOML; see scenarios/README.md): the server it names, the sweep or tune "
    "it describes, and its gates (a baseline comparison, an SLO). Flags after SCENARIO override the "
    "file: any flag of the scenario's command (e.g. --concurrency-range 1:2 -p 500) and the gate flags "
    "below.",
    add_arguments=add_arguments,
    run=run,
    epilog="Exit codes: the command's own (0, 1, 3, 4, 130); 1 when a gate fails; 2 usage or input error.",
)
