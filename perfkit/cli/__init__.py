"""perfkit's command line. `main()` returns the exit code; PerfkitError prints as one line.

Exit codes: 0 done; 1 the run could not finish (server unreachable or gone); 2 usage or input
error; 3 a level never stabilised; 4 some requests failed; 130 interrupted (results so far kept).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from perfkit._version import __version__
from perfkit.cli import report as report_cli
from perfkit.cli import sweep_flags as sweep_args
from perfkit.cli import tune as tune_cli
from perfkit.errors import ExitCode, PerfkitError
from v2kit.runtime import eventloop

SWEEP_DESCRIPTION = """\
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


def _add_sweep(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser(
        "sweep",
        help="measure throughput and latency over concurrency or request-rate levels",
        description=SWEEP_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    target = p.add_argument_group("target")
    target.add_argument("-m", "--model-name", metavar="MODEL", help="model to measure (default: the only one)")
    target.add_argument("-x", "--model-version", default="", metavar="VERSION", help="default: the latest")
    target.add_argument("-u", "--url", metavar="HOST:PORT", help="server endpoint (default: embedded server)")
    target.add_argument("-i", "--protocol", choices=("http", "grpc"), default="http")
    sweep_args.add_connection_flags(p, target)
    target.add_argument(
        "--request-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="a request taking longer counts as a 'timeout' error (default 30)",
    )
    target.add_argument(
        "--max-connections",
        type=int,
        default=0,
        metavar="N",
        help="HTTP: at most N connections, like a pooled client; a request that finds none free waits for "
        "one, and the wait counts in its latency (default 0: one per outstanding request)",
    )
    target.add_argument(
        "--input-tensor-format",
        choices=("binary", "json"),
        default="binary",
        help="HTTP tensor encoding (default binary)",
    )
    load = p.add_argument_group("load").add_mutually_exclusive_group()
    load.add_argument(
        "--concurrency-range",
        metavar="START[:END[:STEP]]",
        help="closed loop: N requests outstanding (default 1); END 0 = until -l",
    )
    load.add_argument(
        "--request-rate-range", metavar="START[:END[:STEP]]", help="open loop: requests per second; END 0 = until -l"
    )
    load.add_argument(
        "--request-intervals",
        type=Path,
        metavar="FILE",
        help="open loop: send intervals in microseconds, one per line, cycled",
    )
    p.add_argument("--request-distribution", choices=("constant", "poisson"), default="constant")
    p.add_argument(
        "-l",
        "--latency-threshold",
        type=float,
        default=0.0,
        metavar="MS",
        help="stop once the stabilising latency passes MS (0: no limit)",
    )
    p.add_argument("--binary-search", action="store_true", help="find the highest level within -l")
    p.add_argument(
        "--max-outstanding",
        type=int,
        default=10_000,
        metavar="N",
        help="open loop: requests in flight beyond N are counted as not sent (default 10000)",
    )
    dist = p.add_argument_group("distributed load (pip install 'perfkit[distributed]')")
    dist.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="send from N Ray actors, each with its share of the concurrency or rate (default 1: this process)",
    )
    dist.add_argument("--ray-address", metavar="HOST:PORT", help="Ray cluster to run them on (default: local Ray)")
    data = p.add_argument_group("input data")
    data.add_argument("-b", "--batch-size", type=int, default=1)
    data.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="NAME:D1,D2,...",
        help="shape of a variable-size input, without the batch dimension (repeatable)",
    )
    data.add_argument("--input-data", default="random", metavar="random|zero|FILE.json")
    data.add_argument("--seed", type=int, default=0, help="seed for random inputs and Poisson schedules")
    m = p.add_argument_group("measurement")
    m.add_argument("--measurement-mode", choices=("time_windows", "count_windows"), default="time_windows")
    m.add_argument(
        "-p",
        "--measurement-interval",
        type=float,
        default=5000.0,
        metavar="MS",
        help="time window length (default 5000)",
    )
    m.add_argument(
        "--measurement-request-count",
        type=int,
        default=50,
        metavar="N",
        help="count_windows: requests per window (default 50; windows last at least 1 s)",
    )
    m.add_argument("-s", "--stability-percentage", type=float, default=10.0, metavar="PCT")
    m.add_argument("-r", "--max-trials", type=int, default=10, metavar="N", help="windows per level at most")
    m.add_argument(
        "--percentile",
        type=float,
        default=None,
        metavar="P",
        help="stabilise on (and compare -l with) this latency percentile instead of the average",
    )
    m.add_argument("--warmup-request-count", type=int, default=0, metavar="N")
    res = p.add_argument_group("resources")
    res.add_argument(
        "--collect-metrics",
        action="store_true",
        help="scrape the server's Prometheus metrics (GPU, CPU) during each window",
    )
    res.add_argument("--metrics-url", metavar="URL", help="default: port 8002 on the host of -u")
    res.add_argument("--metrics-interval", type=float, default=1000.0, metavar="MS")
    out = p.add_argument_group("output")
    out.add_argument(
        "-f",
        "--latency-report-file",
        type=Path,
        metavar="OUT.csv",
        help="perf_analyzer-format CSV (a tidy OUT_long.csv is written beside it)",
    )
    out.add_argument("--profile-export-file", type=Path, metavar="OUT.json", help="per-request records")
    out.add_argument("--report-dir", type=Path, default=Path("reports"), metavar="DIR")
    out.add_argument("--quiet", action="store_true", help="no progress display")
    out.add_argument("--no-report", action="store_true", help="do not write the HTML report (OUT.html)")
    out.add_argument(
        "--append",
        type=Path,
        metavar="HISTORY.csv",
        help="also add the tidy rows, with run id and time, to HISTORY.csv",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="perfkit",
        description="Load testing and performance analysis for KServe v2 / Triton inference servers.",
        epilog="Exit codes: 0 done, 1 could not finish (or a load worker died), 2 usage error, 3 unstable level, 4 request errors, "
        "130 interrupted.",
    )
    parser.add_argument("--version", action="version", version=f"perfkit {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_sweep(commands)
    report_cli.add_parsers(commands)  # report, compare, run
    tune_cli.add_parser(commands)
    probe = commands.add_parser(
        "probe",
        help="check a server: health, metadata, and a few inferences per model",
        description="Check a KServe v2 server. With no -u, starts the bundled reference server on the "
        "demo model repository and probes that.",
    )
    target = probe.add_argument_group("target")
    target.add_argument("-u", "--url", metavar="HOST:PORT", help="server endpoint (default: embedded server)")
    target.add_argument("-i", "--protocol", choices=("http", "grpc"), default="http")
    sweep_args.add_connection_flags(probe, target)
    probe.add_argument(
        "-m",
        "--model-name",
        action="append",
        default=[],
        metavar="MODEL",
        help="model to probe (repeatable; default: every ready model)",
    )
    probe.add_argument("-n", "--requests", type=int, default=20, metavar="N", help="requests per model (default 20)")
    probe.add_argument("--seed", type=int, default=0, help="seed of the random input data (default 0)")
    return parser


def _run_sweep(args: argparse.Namespace, argv: list[str]) -> int:
    from perfkit.cli.sweep_flags import spec_from_args
    from perfkit.report.export import render_summary_table
    from perfkit.sweep.run import run_sweep

    spec = spec_from_args(args)
    run, code = run_sweep(spec, argv)
    if run.result is not None and run.result.levels and not spec.output.quiet:
        print("\n".join(render_summary_table(run.result.levels)))
    if run.outputs is not None:
        for path in run.outputs.paths():
            print(f"wrote {path}", file=sys.stderr)
    if run.result is not None and not run.result.completed and code != ExitCode.INTERRUPTED:
        print(f"error: the sweep stopped early: {run.result.stop_reason}", file=sys.stderr)
    if code == ExitCode.INTERRUPTED:
        print("interrupted: the levels finished so far are on disk", file=sys.stderr)
    return int(code)


def _run_probe(args: argparse.Namespace) -> int:
    from perfkit.cli.probe import probe, render_probe
    from perfkit.sweep.spec import TargetSpec
    from perfkit.target import open_target

    if args.requests < 1:
        raise PerfkitError("-n/--requests must be at least 1")
    target = TargetSpec(
        args.url, args.protocol, headers=sweep_args.headers_from_args(args), tls=sweep_args.tls_from_args(args)
    )
    target.validate()  # -u, -i, -H and TLS by the sweep's rules

    if not args.url:
        print("starting the embedded reference server on the demo models...", file=sys.stderr, flush=True)
    with open_target(args.url, args.protocol) as opened:
        result = eventloop.run(
            probe(opened.url, args.model_name, args.requests, args.seed, args.protocol, headers=target.headers,
                  tls=target.tls)
        )  # fmt: skip
    print("\n".join(render_probe(result)))
    return ExitCode.OK if result.ok else ExitCode.FAILED


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(arguments)
    try:
        if args.command == "sweep":
            return _run_sweep(args, arguments)
        if args.command == "probe":
            return _run_probe(args)
        if args.command == "tune":
            return tune_cli.run(args, arguments)
        if hasattr(args, "handler"):
            return int(args.handler(args))
    except PerfkitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return int(exc.exit_code)
    return ExitCode.USAGE
