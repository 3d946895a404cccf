"""From parsed `perfkit sweep` flags to a validated SweepSpec; nothing below sees a Namespace."""

from __future__ import annotations

import argparse

from perfkit.config import (
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
from perfkit.errors import PerfkitError
from perfkit.inputs import parse_shape_flag
from perfkit.schedule import parse_range, read_intervals


def _headers(values: list[str]) -> tuple[tuple[str, str], ...]:
    headers = []
    for value in values:
        name, sep, content = value.partition(":")
        if not sep or not name.strip():
            raise PerfkitError(f"-H '{value}' must look like 'Name: value'")
        headers.append((name.strip(), content.strip()))
    return tuple(headers)


def _tls(args: argparse.Namespace) -> TlsSpec:
    return TlsSpec(
        grpc_use_ssl=args.ssl_grpc_use_ssl,
        grpc_root_certs=args.ssl_grpc_root_certifications_file,
        https_ca_certs=args.ssl_https_ca_certificates_file,
        https_verify_peer=bool(args.ssl_https_verify_peer),
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


def spec_from_args(args: argparse.Namespace) -> SweepSpec:
    if (args.metrics_url or args.metrics_interval != 1000.0) and not args.collect_metrics:
        raise PerfkitError("--metrics-url and --metrics-interval need --collect-metrics")
    spec = SweepSpec(
        target=TargetSpec(
            url=args.url,
            protocol=args.protocol,
            model=args.model_name,
            model_version=args.model_version,
            headers=_headers(args.header),
            request_timeout_s=args.request_timeout,
            json_tensors=args.input_tensor_format == "json",
            tls=_tls(args),
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
