"""`perfkit report`, `perfkit compare` and `perfkit run`: the sub-commands that look at results.

`add_parsers(commands)` registers them on perfkit's sub-command parser; each sets its handler with
`set_defaults(handler=...)`, which `cli.main` calls. Handlers read files, call the pure renderers
(`report`, `compare`) and decide where the text goes; `PerfkitError` is a usage error (exit 2).

Exit codes: `report` 0 or 2; `compare` 0 no regression, 1 a regression beyond the thresholds and
beyond the runs' noise, 2 usage or input error (e.g. the runs did not measure the same levels);
`run` the sweep's own code (0, 1, 3, 4, 130), or 1 when a gate fails, or 2.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from perfkit.analysis.compare import (
    GATE_METRICS,
    Comparison,
    JUnitCase,
    Thresholds,
    compare_sweeps,
    comparison_cases,
    comparison_properties,
    parse_percent,
    render_comparison_lines,
    render_junit,
)
from perfkit.cli.scenario import (
    Scenario,
    check_slo,
    command_argv,
    expand_demo,
    load_scenario,
    merge_argv,
    touched_dests,
)
from perfkit.errors import ExitCode, PerfkitError
from perfkit.results.files import ReportItem, append_history, load_result, render_tidy_schema
from perfkit.results.model import SweepResult

__all__ = ["add_parsers", "command_parser"]

REPORT_METRICS = ("throughput", "p50", "p99")
_DEFAULT_THRESHOLDS = Thresholds()


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `report`, `compare` and `run` on perfkit's sub-commands."""
    _add_report(commands)
    _add_compare(commands)
    _add_run(commands)


def _say(text: str) -> None:
    print(text, file=sys.stderr)


def _write(path: Path, text: str) -> None:
    from perfkit.results.files import write_text_atomic

    if not path.parent.is_dir():
        path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, text)
    _say(f"wrote {path}")


# --------------------------------------------------------------------------------------------------
# perfkit report


def _add_report(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser(
        "report",
        help="write one self-contained HTML report from sweep and tune results",
        description="Write one self-contained HTML file (images inline, no network) from perfkit result "
        "files. Several results are overlaid and compared.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("results", nargs="*", type=Path, metavar="RESULT.json", help="sweep or tune result files")
    p.add_argument(
        "-o", "--output", type=Path, metavar="OUT.html", help="default: RESULT.html, or report.html for several"
    )
    p.add_argument("--label", action="append", default=[], metavar="NAME", help="a name per result, in order")
    p.add_argument("--title", help="the page's title")
    p.add_argument("--slo-p99", type=float, metavar="MS", help="draw a p99 bound on the latency figures")
    p.add_argument("--append", type=Path, metavar="HISTORY.csv", help="also add the sweeps' tidy rows to HISTORY.csv")
    p.add_argument("--tidy-schema", action="store_true", help="print the tidy CSV's schema as Markdown and exit")
    p.set_defaults(handler=_report)


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


def _report(args: argparse.Namespace) -> int:
    from perfkit.report.html import render_html

    if args.tidy_schema:
        print(render_tidy_schema(), end="")
        return ExitCode.OK
    if not args.results:
        raise PerfkitError("perfkit report needs one or more result files (RESULT.json ...)")
    items = _labelled(args.results, args.label)
    out = args.output or (args.results[0].with_suffix(".html") if len(items) == 1 else Path("report.html"))
    html = render_html(items, title=args.title, slo_ms=args.slo_p99, thresholds=Thresholds(metrics=REPORT_METRICS))
    _write(out, html)
    if args.append is not None:
        for item in items:
            if isinstance(item.result, SweepResult):
                append_history(args.append, item.result, Path(item.source).stem)
        _say(f"appended to {args.append}")
    return ExitCode.OK


# --------------------------------------------------------------------------------------------------
# perfkit compare


def _add_gate_arguments(parser: argparse.ArgumentParser, suppress: bool) -> None:
    """The thresholds of a comparison. With `suppress`, flags not given leave no attribute, so
    that a scenario's own values stand (STYLE practice 12: the SUPPRESS trick)."""

    def default(value: Any) -> Any:
        return argparse.SUPPRESS if suppress else value

    g = parser.add_argument_group("regression gate")
    g.add_argument(
        "--max-throughput-drop",
        metavar="PCT",
        default=default("5%"),
        help="a throughput drop beyond PCT (and beyond noise) is a regression (default 5%%)",
    )
    g.add_argument(
        "--max-latency-increase",
        metavar="PCT",
        default=default("10%"),
        help="a latency increase beyond PCT (and beyond noise) is a regression (default 10%%)",
    )
    g.add_argument(
        "--metric",
        action="extend",
        nargs="+",
        choices=list(GATE_METRICS),
        default=default(None),
        metavar="METRIC",
        help=f"metrics to gate on (default: throughput p99); any of {', '.join(GATE_METRICS)}",
    )
    g.add_argument(
        "--alpha",
        type=float,
        default=default(0.05),
        metavar="P",
        help="significance level of the noise tests (default 0.05)",
    )
    g.add_argument(
        "--junit", type=Path, default=default(None), metavar="OUT.xml", help="also write the verdicts as JUnit XML"
    )


def _add_compare(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser(
        "compare",
        help="gate on performance: compare two sweeps level by level",
        description="Compare a candidate sweep with a baseline, level by level. A metric regresses when "
        "its change is worse than the threshold AND beyond the runs' own variability (Mann-Whitney U or "
        "Welch t on the per-window throughputs; non-overlapping p99 confidence intervals).",
        epilog="Exit codes: 0 no regression, 1 regression, 2 usage or input error (e.g. different levels).",
    )
    p.add_argument("baseline", type=Path, metavar="BASELINE.json")
    p.add_argument("candidate", type=Path, metavar="CANDIDATE.json")
    _add_gate_arguments(p, suppress=False)
    p.add_argument("--html", type=Path, metavar="OUT.html", help="also write the two runs' comparison report")
    p.set_defaults(handler=_compare)


def _sweep(path: Path, role: str) -> SweepResult:
    item = load_result(path)
    if not isinstance(item.result, SweepResult):
        raise PerfkitError(f"{role} {path} is a {item.kind} result; compare takes two sweep results")
    return item.result


def _thresholds(values: dict[str, Any], base: Thresholds = _DEFAULT_THRESHOLDS) -> Thresholds:
    """Thresholds from parsed flags (only those present override `base`)."""
    return Thresholds(
        parse_percent(values["max_throughput_drop"], "--max-throughput-drop")
        if "max_throughput_drop" in values
        else base.max_throughput_drop_pct,
        parse_percent(values["max_latency_increase"], "--max-latency-increase")
        if "max_latency_increase" in values
        else base.max_latency_increase_pct,
        tuple(values["metric"]) if values.get("metric") else base.metrics,
        float(values["alpha"]) if "alpha" in values else base.alpha,
    )


def _names(baseline: Path, candidate: Path) -> tuple[str, str]:
    return (baseline.stem, candidate.stem) if baseline.stem != candidate.stem else ("baseline", "candidate")


def _compare(args: argparse.Namespace) -> int:
    thresholds = _thresholds(vars(args))
    thresholds.validate()
    baseline, candidate = _sweep(args.baseline, "the baseline"), _sweep(args.candidate, "the candidate")
    names = _names(args.baseline, args.candidate)
    comparison = compare_sweeps(baseline, candidate, thresholds, names=names)
    print("\n".join(render_comparison_lines(comparison)))
    if args.junit is not None:
        _write(args.junit, _junit(comparison, []))
    if args.html is not None:
        from perfkit.report.html import render_html

        items = [ReportItem(names[0], "sweep", baseline, str(args.baseline)),
                 ReportItem(names[1], "sweep", candidate, str(args.candidate))]  # fmt: skip
        _write(args.html, render_html(items, thresholds=thresholds))
    return ExitCode.FAILED if comparison.regressions else ExitCode.OK


def _junit(comparison: Comparison | None, extra: list[JUnitCase]) -> str:
    cases = (comparison_cases(comparison) if comparison else []) + extra
    properties = comparison_properties(comparison) if comparison else []
    output = "\n".join(render_comparison_lines(comparison)) if comparison else ""
    return render_junit("perfkit performance gate", cases, properties, output)


# --------------------------------------------------------------------------------------------------
# perfkit run


def _add_run(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser(
        "run",
        help="run a scenario file: start or target the server, sweep (or tune), then gate",
        description="Run a scenario (TOML; see scenarios/README.md): the server it names, the sweep or tune "
        "it describes, and its gates (a baseline comparison, an SLO). Flags after SCENARIO override the "
        "file: any flag of the scenario's command (e.g. --concurrency-range 1:2 -p 500) and the gate flags "
        "below.",
        epilog="Exit codes: the command's own (0, 1, 3, 4, 130); 1 when a gate fails; 2 usage or input error.",
    )
    p.add_argument("--baseline", type=Path, default=argparse.SUPPRESS, metavar="FILE.json",
                   help="compare with this sweep result instead of the scenario's baseline")  # fmt: skip
    p.add_argument("--update-baseline", action="store_true",
                   help="after the run, store its result as the scenario's baseline (and do not gate)")  # fmt: skip
    p.add_argument("--no-gate", action="store_true", help="run and report, but do not gate")
    p.add_argument("--dry-run", action="store_true", help="print the command the scenario runs, and exit")
    _add_gate_arguments(p, suppress=True)
    p.add_argument("scenario", type=Path, metavar="SCENARIO.toml")
    p.add_argument("overrides", nargs=argparse.REMAINDER, metavar="FLAG", help="flags that override the file")
    p.set_defaults(handler=_run)


def command_parser(name: str) -> argparse.ArgumentParser | None:
    """perfkit's parser for sub-command `name` (None when this perfkit has no such command)."""
    from perfkit.cli import build_parser

    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            found: argparse.ArgumentParser | None = action.choices.get(name)
            return found
    return None


def _gate_values(args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
    """Gate flags given before and after the scenario (after wins), and the command's flags."""
    after = argparse.ArgumentParser(prog="perfkit run", add_help=False, allow_abbrev=False)
    after.add_argument("--baseline", type=Path, default=argparse.SUPPRESS)
    after.add_argument("--update-baseline", action="store_true", default=argparse.SUPPRESS)
    after.add_argument("--no-gate", action="store_true", default=argparse.SUPPRESS)
    after.add_argument("--dry-run", action="store_true", default=argparse.SUPPRESS)
    _add_gate_arguments(after, suppress=True)
    parsed, rest = after.parse_known_args(args.overrides)
    return {**vars(args), **vars(parsed)}, rest


def _run(args: argparse.Namespace) -> int:
    values, overrides = _gate_values(args)
    scenario = load_scenario(args.scenario)
    parser = command_parser(scenario.command)
    if parser is None:
        raise PerfkitError(f"{scenario.path} runs `perfkit {scenario.command}`, which this perfkit does not have")
    file_argv = command_argv(parser, scenario.settings, f"{scenario.path} [{scenario.command}]")
    if scenario.server.url:
        file_argv = ["--url", scenario.server.url, *file_argv]
    argv = expand_demo(merge_argv(parser, file_argv, overrides))
    gates = scenario.gates
    thresholds = _thresholds(values, gates.thresholds)
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
        return ExitCode.OK
    if scenario.command != "sweep":
        if baseline or gates.slo_p99_ms:
            raise PerfkitError(f"{scenario.path}: [gates] apply to sweep scenarios; drop them for a {scenario.command}")
        if start_server:
            raise PerfkitError(f"{scenario.path}: perfkit {scenario.command} starts its own server; drop [server]")
        from perfkit.cli import main

        return main([scenario.command, *argv])
    if start_server:
        from perfkit.target import reference_server_process

        repository = Path(scenario.server.model_repository)
        _say(f"starting the reference server on {repository}...")
        with reference_server_process(repository, scenario.server.args) as server:
            protocol = parser.parse_args(argv).protocol
            url = server.grpc_url if protocol == "grpc" else server.http_url
            argv = [*argv, "--url", url, "--collect-metrics", "--metrics-url", server.metrics_url]
            return _run_sweep_scenario(parser, argv, values, scenario, thresholds, baseline)
    return _run_sweep_scenario(parser, argv, values, scenario, thresholds, baseline)


def _run_sweep_scenario(
    parser: argparse.ArgumentParser,
    argv: list[str],
    values: dict[str, Any],
    scenario: Scenario,
    thresholds: Thresholds,
    baseline_path: Path | None,
) -> int:
    from perfkit.cli.sweep_flags import spec_from_args
    from perfkit.report.export import render_summary_table
    from perfkit.report.html import render_html
    from perfkit.sweep.run import run_sweep

    gates = scenario.gates
    spec = spec_from_args(parser.parse_args([*argv, "--no-report"]))
    baseline = None
    if baseline_path is not None and not values.get("update_baseline") and not values.get("no_gate"):
        baseline = _sweep(baseline_path, "the baseline")  # read before measuring: fail fast
    _say(f"scenario {scenario.name}: perfkit sweep {shlex.join(argv)}")
    run, code = run_sweep(spec, ["sweep", *argv])
    result = run.result
    if result is not None and result.levels and not spec.output.quiet:
        print("\n".join(render_summary_table(result.levels)))
    if run.outputs is not None:
        for path in run.outputs.paths():
            _say(f"wrote {path}")
    if result is None or run.outputs is None or code in (ExitCode.FAILED, ExitCode.INTERRUPTED):
        if result is not None and not result.completed:
            _say(f"error: the sweep stopped early: {result.stop_reason}")
        return int(code)

    gate_failed = False
    comparison, mismatch = None, None
    cases: list[JUnitCase] = []
    if baseline is not None:
        try:
            comparison = compare_sweeps(baseline, result, thresholds, names=("baseline", run.outputs.json_path.stem))
        except PerfkitError as exc:  # reported after the run's own report is written
            mismatch = exc
        else:
            print("\n".join(render_comparison_lines(comparison)))
            gate_failed |= bool(comparison.regressions)
    if gates.slo_p99_ms:
        verdict = check_slo(result, gates.slo_p99_ms, gates.min_throughput_at_slo)
        print("\n".join(verdict.lines()))
        cases.append(verdict.junit_case())
        gate_failed |= not verdict.passed and not values.get("no_gate")
    junit = values.get("junit", gates.junit)
    if junit is not None and (comparison is not None or cases):
        _write(Path(junit), _junit(comparison, cases))
    items = [ReportItem(run.outputs.json_path.stem, "sweep", result, str(run.outputs.json_path))]
    if comparison is not None and baseline is not None:
        items.insert(0, ReportItem("baseline", "sweep", baseline, str(baseline_path)))
    html_path = run.outputs.pa_csv_path.with_suffix(".html")
    _write(html_path, render_html(items, slo_ms=gates.slo_p99_ms, thresholds=thresholds,
                                  title=f"perfkit scenario {scenario.name}"))  # fmt: skip
    if mismatch is not None:
        raise mismatch
    if values.get("update_baseline") and baseline_path is not None:
        _write(Path(baseline_path), run.outputs.json_path.read_text())
    if gate_failed:
        return ExitCode.FAILED
    if code == ExitCode.UNSTABLE and gates.allow_unstable:
        return ExitCode.OK
    return int(code)
