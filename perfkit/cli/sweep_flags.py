"""From parsed `perfkit sweep` flags to a validated SweepSpec; nothing below sees a Namespace.

The connection flags (-H and the TLS options) are defined here once for sweep, tune and probe. The
parsers are built on every start, so this module imports no numpy until a spec is built.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from perfkit.errors import PerfkitError
from perfkit.sweep.spec import (
    DistributedSpec,
    InputSpec,
    LoadSpec,
    MetricsSpec,
    OutputSpec,
    SweepSpec,
    TargetSpec,
    TlsSpec,
    WindowSpec,
)


def add_connection_flags(parser: argparse.ArgumentParser, target: argparse._ArgumentGroup) -> None:
    """-H into the `target` group, and a TLS group with perf_analyzer's client TLS options (a
    subset: no client certificates). Read them back with `headers_from_args` and `tls_from_args`;
    `TargetSpec` validation checks them together with -u and -i."""
    target.add_argument(
        "-H", "--header", action="append", default=[], metavar="'NAME: VALUE'", help="extra HTTP header (repeatable)"
    )
    tls = parser.add_argument_group("TLS", "HTTPS: give -u https://HOST:PORT. gRPC: add --ssl-grpc-use-ssl.")
    tls.add_argument("--ssl-grpc-use-ssl", action="store_true", help="connect to the gRPC server over TLS")
    tls.add_argument(
        "--ssl-grpc-root-certifications-file",
        type=Path,
        metavar="PEM",
        help="CA certificates to verify the gRPC server with (default: the system's)",
    )
    tls.add_argument(
        "--ssl-https-ca-certificates-file",
        type=Path,
        metavar="PEM",
        help="CA certificates to verify the HTTPS server with (default: the system's)",
    )
    tls.add_argument(
        "--ssl-https-verify-peer",
        type=int,
        choices=(0, 1),
        default=1,
        metavar="0|1",
        help="0: do not verify the HTTPS server's certificate (default 1)",
    )


def headers_from_args(args: argparse.Namespace) -> tuple[tuple[str, str], ...]:
    headers = []
    for value in args.header:
        name, sep, content = value.partition(":")
        if not sep or not name.strip():
            raise PerfkitError(f"-H '{value}' must look like 'Name: value'")
        headers.append((name.strip(), content.strip()))
    return tuple(headers)


def tls_from_args(args: argparse.Namespace) -> TlsSpec:
    return TlsSpec(
        grpc_use_ssl=args.ssl_grpc_use_ssl,
        grpc_root_certs=args.ssl_grpc_root_certifications_file,
        https_ca_certs=args.ssl_https_ca_certificates_file,
        https_verify_peer=bool(args.ssl_https_verify_peer),
    )


def _load(args: argparse.Namespace) -> LoadSpec:
    from perfkit.load.schedule import parse_range, read_intervals

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


def spec_from_args(args: argparse.Namespace) -> SweepSpec:
    from perfkit.load.inputs import parse_shape_flag

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
        ),
        load=_load(args),
        windows=WindowSpec(
            mode=args.measurement_mode,
            interval_ms=args.measurement_interval,
            request_count=args.measurement_request_count,
            stability_pct=args.stability_percentage,
            max_trials=args.max_trials,
            percentile=args.percentile,
            warmup_request_count=args.warmup_request_count,
        ),
        inputs=InputSpec(
            batch_size=args.batch_size,
            shapes=tuple((name, tuple(dims)) for name, dims in map(parse_shape_flag, args.shape)),
            input_data=args.input_data,
            seed=args.seed,
        ),
        metrics=MetricsSpec(
            collect=args.collect_metrics, metrics_url=args.metrics_url, interval_ms=args.metrics_interval
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
