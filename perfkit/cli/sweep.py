"""`perfkit sweep`: its flags, from them a validated SweepSpec (nothing below sees a Namespace), and
the run, whose console ending `perfkit run` shares.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from perfkit.cli.common import Command, add_connection_flags, headers_from_args, tls_from_args, windows_from_args
from perfkit.errors import ExitCode, PerfkitError
from perfkit.load.distributed import DistributedSpec
from perfkit.load.inputs import parse_shape_flag
from perfkit.load.schedule import parse_range, read_intervals
from perfkit.report.summary import sweep_notes, sweep_table
from perfkit.sweep.run import SweepRun, run_sweep
from perfkit.sweep.spec import InputSpec, LoadSpec, MetricsSpec, OutputSpec, SweepSpec
from perfkit.target import TargetSpec

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


def add_arguments(p: argparse.ArgumentParser) -> None:
    target = p.add_argument_group("target")
    target.add_argument("-m", "--model-name", metavar="MODEL", help="model to measure (default: the only one)")
    target.add_argument("-x", "--model-version", default="", metavar="VERSION", help="default: the latest")
    target.add_argument(
        "-u", "--url", metavar="HOST:PORT[,...]",
        help="server endpoint (default: embedded server); several alike servers comma-separated, requests "
        "round-robin, each endpoint's figures and the total reported",
    )  # fmt: skip
    target.add_argument("-i", "--protocol", choices=("http", "grpc"), default="http")
    target.add_argument(
        "--bls-composing-models", default="", metavar="MODEL[:VERSION],...",
        help="the models a BLS model calls: their server-side figures are read beside it, as an ensemble's steps",
    )  # fmt: skip
    add_connection_flags(p, target)
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
    res.add_argument(
        "--metrics-url", action="append", default=[], metavar="URL",
        help="a Prometheus endpoint to scrape (Triton's nv_gpu_*, a DCGM exporter's DCGM_FI_DEV_*); repeatable; "
        "default: port 8002 on the host of each -u endpoint",
    )  # fmt: skip
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


def _load(args: argparse.Namespace) -> LoadSpec:
    common = {
        "latency_threshold_ms": args.latency_threshold,
        "binary_search": args.binary_search,
        "max_outstanding": args.max_outstanding,
    }
    if args.request_intervals is not None:
        if args.binary_search:
            raise PerfkitError("--binary-search does not apply to --request-intervals (one schedule, one level)")
        return LoadSpec("custom_intervals", intervals_ns=read_intervals(args.request_intervals), **common)
    if args.request_rate_range is not None:
        start, end, step = parse_range(args.request_rate_range, "--request-rate-range", integer=False)
        return LoadSpec("request_rate", start, end, step, distribution=args.request_distribution, **common)
    if args.request_distribution != "constant":
        raise PerfkitError("--request-distribution applies to --request-rate-range; add one")
    start, end, step = parse_range(args.concurrency_range or "1", "--concurrency-range", integer=True)
    return LoadSpec("concurrency", start, end, step, **common)


def parse_model_list(text: str, flag: str) -> tuple[tuple[str, str], ...]:
    """perf_analyzer's MODEL[:VERSION],... as (name, version) pairs, version "" where none is given."""
    models = []
    for part in (p.strip() for p in text.split(",")) if text.strip() else ():
        name, _, version = part.partition(":")
        if not name or (version and not version.isdigit()):
            raise PerfkitError(f"{flag} takes MODEL[:VERSION],... (a version is a number); got {text!r}")
        models.append((name, version))
    return tuple(models)


def spec_from_args(args: argparse.Namespace) -> SweepSpec:
    if args.max_connections < 0:
        raise PerfkitError(
            f"--max-connections must be >= 0 (0: one per outstanding request), got {args.max_connections}"
        )
    if args.max_connections and args.protocol == "grpc":
        raise PerfkitError("--max-connections is for -i http; gRPC sends every request over one HTTP/2 connection")

    if (args.metrics_url or args.metrics_interval != 1000.0) and not args.collect_metrics:
        raise PerfkitError("--metrics-url and --metrics-interval need --collect-metrics")
    spec = SweepSpec(
        target=TargetSpec(
            url=args.url,
            protocol=args.protocol,
            model=args.model_name,
            model_version=args.model_version,
            headers=headers_from_args(args),
            request_timeout_s=args.request_timeout,
            json_tensors=args.input_tensor_format == "json",
            tls=tls_from_args(args),
            max_connections=args.max_connections,
            bls_composing_models=parse_model_list(args.bls_composing_models, "--bls-composing-models"),
        ),
        load=_load(args),
        windows=windows_from_args(args),
        inputs=InputSpec(
            batch_size=args.batch_size,
            shapes=tuple((name, tuple(dims)) for name, dims in map(parse_shape_flag, args.shape)),
            input_data=args.input_data,
            seed=args.seed,
        ),
        metrics=MetricsSpec(
            collect=args.collect_metrics, metrics_urls=tuple(args.metrics_url), interval_ms=args.metrics_interval
        ),  # fmt: skip
        output=OutputSpec(
            report_dir=args.report_dir,
            pa_csv=args.latency_report_file,
            profile_export=args.profile_export_file,
            quiet=args.quiet,
            html_report=not args.no_report,
            history_csv=args.append,
        ),
        distributed=DistributedSpec(workers=args.workers, ray_address=args.ray_address),
    )
    spec.validate()
    return spec


def measure(spec: SweepSpec, argv: list[str]) -> tuple[SweepRun, int]:
    """Run the sweep, then print its summary table, the files written and why it stopped early."""
    run, code = run_sweep(spec, argv)
    table = [] if spec.output.quiet else sweep_table(run.result)
    if table:
        print("\n".join(table))
    for note in sweep_notes(run.result, run.outputs.paths() if run.outputs is not None else [], code):
        print(note, file=sys.stderr)
    return run, code


def run(args: argparse.Namespace, argv: list[str]) -> int:
    _, code = measure(spec_from_args(args), argv)
    if code == ExitCode.INTERRUPTED:
        print("interrupted: the levels finished so far are on disk", file=sys.stderr)
    return int(code)


COMMAND = Command(
    "sweep",
    help="measure throughput and latency over concurrency or request-rate levels",
    description=DESCRIPTION,
    add_arguments=add_arguments,
    run=run,
    formatter_class=argparse.RawDescriptionHelpFormatter,
)
