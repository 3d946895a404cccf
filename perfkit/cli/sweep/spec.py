"""From `perfkit sweep`'s flags a validated SweepSpec: nothing below the CLI sees a Namespace.
perf_analyzer's mapped flags are first read as the sweep's own (`perf_analyzer.resolved`).
"""

from __future__ import annotations

import argparse

from perfkit.cli.common import headers_from_args, json_format, tls_from_args, windows_from_args
from perfkit.cli.sweep.perf_analyzer import endpoint_path, endpoint_type, resolved
from perfkit.errors import PerfkitError
from perfkit.genai.goodput import parse_goodput
from perfkit.genai.sessions import is_multi_turn
from perfkit.genai.trace import read_trace, trace_intervals_ns
from perfkit.genai.workload import GenerativeSpec, SessionSpec, WorkloadSpec
from perfkit.load.cluster.distributed import DistributedSpec
from perfkit.load.inputs import parse_request_parameter, parse_shape_flag
from perfkit.load.schedule import parse_range, read_intervals
from perfkit.load.sequences import DEFAULT_ID_RANGE, SequenceSpec, parse_id_range
from perfkit.measure.level import WindowSpec
from perfkit.sweep.spec import DataPathSpec, InputSpec, LoadSpec, MetricsSpec, OutputSpec, SweepSpec
from perfkit.target import TargetSpec, checked_metrics_url, checked_url


def sessions_from_args(args: argparse.Namespace) -> SessionSpec:
    """The session flags; `enabled` when any is given or --input-file is multi_turn."""
    given = [
        args.conversation_num, args.conversation_turn_mean, args.conversation_turn_stddev,
        args.conversation_turn_delay_mean, args.conversation_turn_delay_stddev, args.conversation_turn_delay_ratio,
    ]  # fmt: skip
    from_file = args.input_file is not None and args.input_file.is_file() and is_multi_turn(args.input_file)

    def value(v: float | None, default: float) -> float:
        return default if v is None else v

    return SessionSpec(
        enabled=from_file or any(v is not None for v in given),
        count=int(value(args.conversation_num, 100)),
        turns_mean=int(value(args.conversation_turn_mean, 1)),
        turns_stddev=value(args.conversation_turn_stddev, 0.0),
        delay_mean_ms=value(args.conversation_turn_delay_mean, 0.0),
        delay_stddev_ms=value(args.conversation_turn_delay_stddev, 0.0),
        delay_ratio=value(args.conversation_turn_delay_ratio, 1.0),
    )


def _generative(args: argparse.Namespace) -> GenerativeSpec:
    return GenerativeSpec(
        endpoint_type=endpoint_type(args),
        endpoint=endpoint_path(args),
        streaming=args.streaming,
        tokenizer=args.tokenizer,
        workload=WorkloadSpec(
            input_tokens_mean=args.synthetic_input_tokens_mean,
            input_tokens_stddev=args.synthetic_input_tokens_stddev,
            output_tokens_mean=args.output_tokens_mean,
            output_tokens_stddev=args.output_tokens_stddev,
            deterministic_output=args.output_tokens_mean_deterministic,
            ignore_eos=args.ignore_eos,
            input_file=args.input_file,
            trace_file=args.trace_file,
            prompt_count=args.num_prompts,
            seed=args.seed,
        ),
        goodput=parse_goodput(args.goodput) if args.goodput is not None else (),
        attainment_pct=args.goodput_attainment,
        sessions=sessions_from_args(args),
    )


def sequences_from_args(args: argparse.Namespace) -> SequenceSpec:
    """The sequence flags; `enabled` when any is given (a data file with streams enables it later)."""
    given = [
        args.sequence_length, args.sequence_length_variation, args.sequence_id_range, args.start_sequence_id,
        args.num_of_sequences,
    ]  # fmt: skip
    start, id_range = 1, DEFAULT_ID_RANGE
    if args.sequence_id_range is not None:
        start, id_range = parse_id_range(args.sequence_id_range)
    if args.start_sequence_id is not None:
        if args.sequence_id_range is not None and args.start_sequence_id != start:
            raise PerfkitError(
                f"--start-sequence-id {args.start_sequence_id} and --sequence-id-range {args.sequence_id_range} "
                "disagree on the first id; give one of them"
            )
        start = args.start_sequence_id
    return SequenceSpec(
        enabled=args.serial_sequences or any(v is not None for v in given),
        length=20 if args.sequence_length is None else args.sequence_length,
        length_specified=args.sequence_length is not None,
        length_variation_pct=20.0 if args.sequence_length_variation is None else args.sequence_length_variation,
        start_id=start,
        id_range=id_range,
        num_of_sequences=4 if args.num_of_sequences is None else args.num_of_sequences,
        serial=args.serial_sequences,
    )


def _load(args: argparse.Namespace) -> LoadSpec:
    common = {
        "latency_threshold_ms": args.latency_threshold,
        "binary_search": args.binary_search,
        "max_outstanding": args.max_outstanding,
    }
    if args.trace_file is not None:
        chosen = [flag for flag, value in (("--concurrency-range", args.concurrency_range),
                  ("--request-rate-range", args.request_rate_range), ("--request-intervals", args.request_intervals))
                  if value is not None]  # fmt: skip
        if chosen or args.binary_search:
            raise PerfkitError(
                f"--trace-file sends at the trace's own times: drop {', '.join(chosen) or '--binary-search'}"
            )
        if endpoint_type(args) == "kserve-infer":
            raise PerfkitError("--trace-file needs a generative --endpoint-type (chat, completions, ...)")
        return LoadSpec("custom_intervals", intervals_ns=trace_intervals_ns(read_trace(args.trace_file)), **common)
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
    args = resolved(args)  # perf_analyzer's deprecated flags as the sweep's own
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
            url=checked_url(args.url, args.protocol),
            protocol=args.protocol,
            model=args.model_name,
            model_version=args.model_version,
            headers=headers_from_args(args),
            request_timeout_s=args.request_timeout,
            json_tensors=json_format(args.input_tensor_format),
            json_outputs=json_format(args.output_tensor_format),
            grpc_compression=args.grpc_compression_algorithm,
            tls=tls_from_args(args),
            max_connections=args.max_connections,
            bls_composing_models=parse_model_list(args.bls_composing_models, "--bls-composing-models"),
        ),
        load=_load(args),
        windows=_windows(args),
        inputs=InputSpec(
            batch_size=args.batch_size,
            shapes=tuple((name, tuple(dims)) for name, dims in map(parse_shape_flag, args.shape)),
            input_data=args.input_data,
            seed=args.seed,
            string_length=args.string_length,
            string_data=args.string_data,
            request_parameters=tuple(map(parse_request_parameter, args.request_parameter)),
        ),
        metrics=MetricsSpec(
            collect=args.collect_metrics,
            metrics_urls=tuple(map(checked_metrics_url, args.metrics_url)),
            interval_ms=args.metrics_interval,
        ),
        output=OutputSpec(
            report_dir=args.report_dir,
            pa_csv=args.latency_report_file,
            profile_export=args.profile_export_file,
            quiet=args.quiet,
            html_report=not args.no_report,
            history_csv=args.append,
            verbose=args.verbose,
            verbose_csv=args.verbose_csv,
        ),
        distributed=DistributedSpec(workers=args.workers, ray_address=args.ray_address),
        data_path=DataPathSpec(args.streaming, args.shared_memory, args.output_shared_memory_size),
        genai=_generative(args),
        sequences=sequences_from_args(args),
        auto_windows=not any(getattr(args, name) is not None for name in _WINDOW_FLAGS),
    )
    spec.validate()
    return spec


_WINDOW_FLAGS = {"measurement_mode": "time_windows", "measurement_interval": 5000.0, "measurement_request_count": 50}


def _windows(args: argparse.Namespace) -> WindowSpec:
    """The measurement flags, perf_analyzer's defaults for the window flags not given."""
    filled = {name: default if getattr(args, name) is None else getattr(args, name)
              for name, default in _WINDOW_FLAGS.items()}  # fmt: skip
    return windows_from_args(argparse.Namespace(**{**vars(args), **filled}))
