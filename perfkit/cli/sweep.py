"""`perfkit sweep`: its flags, from them a validated SweepSpec (nothing below sees a Namespace), and
the run, whose console ending `perfkit run` shares.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from perfkit.cli.common import Command, add_connection_flags, headers_from_args, tls_from_args, windows_from_args
from perfkit.cli.perf_analyzer_flags import (
    add_perf_analyzer_arguments,
    endpoint_path,
    endpoint_type,
    perf_analyzer_notes,
    resolved,
)
from perfkit.errors import ExitCode, PerfkitError
from perfkit.genai.goodput import parse_goodput
from perfkit.genai.records import unstreamed_note
from perfkit.genai.sessions import is_multi_turn
from perfkit.genai.trace import read_trace, trace_intervals_ns
from perfkit.genai.workload import ENDPOINT_TYPES, GenerativeSpec, SessionSpec, WorkloadSpec
from perfkit.load.cluster.distributed import DistributedSpec
from perfkit.load.inputs import parse_request_parameter, parse_shape_flag
from perfkit.load.schedule import parse_range, read_intervals
from perfkit.load.sequences import DEFAULT_ID_RANGE, SequenceSpec, parse_id_range
from perfkit.measure.level import DEFAULT_LENGTHENINGS, DEFAULT_MAX_TRIALS, MAX_LENGTHENED_WINDOW_S, WindowSpec
from perfkit.report.summary import exit_line, sweep_notes, sweep_table
from perfkit.sweep.run import SweepRun, run_sweep
from perfkit.sweep.spec import DataPathSpec, InputSpec, LoadSpec, MetricsSpec, OutputSpec, SweepSpec
from perfkit.target import TargetSpec, checked_metrics_url, checked_url

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
        help="server endpoint (default: embedded server); a HOST alone means port 8000, 8001 with -i grpc; several "
        "alike servers comma-separated, requests round-robin, each endpoint's figures and the total reported",
    )  # fmt: skip
    target.add_argument("-i", "--protocol", choices=("http", "grpc"), default="http")
    target.add_argument(
        "--bls-composing-models", default="", metavar="MODEL[:VERSION],...",
        help="the models a BLS model calls: their server-side figures are read beside it, as an ensemble's steps",
    )  # fmt: skip
    add_connection_flags(p, target, use_ssl_word=True)
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
    load_group = p.add_argument_group("load")
    load = load_group.add_mutually_exclusive_group()
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
    load_group.add_argument(
        "--request-distribution",
        choices=("constant", "poisson"),
        default="constant",
        help="open loop: gaps between sends, even or exponential (default constant)",
    )
    load_group.add_argument(
        "-l",
        "--latency-threshold",
        type=float,
        default=0.0,
        metavar="MS",
        help="stop once the stabilising latency passes MS (0: no limit)",
    )
    load_group.add_argument("--binary-search", action="store_true", help="find the highest level within -l")
    load_group.add_argument(
        "--max-outstanding",
        type=int,
        default=10_000,
        metavar="N",
        help="open loop: requests in flight beyond N are counted as not sent (default 10000)",
    )
    path = p.add_argument_group("streaming and shared memory (perf_analyzer's flags)")
    path.add_argument(
        "--streaming",
        action="store_true",
        help="-i grpc: send over ModelStreamInfer streams (one per outstanding request) and time every response; "
        "with a generative --endpoint-type: server-sent events",
    )
    path.add_argument(
        "--shared-memory",
        choices=("none", "system", "cuda"),
        default="none",
        help="put inputs and outputs in shared memory registered with the server (default none); cuda: device "
        "memory on GPU 0, needs cuda-python",
    )
    path.add_argument(
        "--output-shared-memory-size",
        type=int,
        default=102_400,
        metavar="BYTES",
        help="bytes of each output's region, per batch item (default 102400)",
    )
    add_generative_arguments(p)
    add_session_arguments(p)
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
    data.add_argument("-b", "--batch-size", type=int, default=1, metavar="N", help="inputs per request (default 1)")
    data.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="NAME:D1,D2,...",
        help="shape of a variable-size input, without the batch dimension (repeatable)",
    )
    data.add_argument("--input-data", default="random", metavar="random|zero|FILE.json|DIR")
    data.add_argument("--seed", type=int, default=0, help="seed for random inputs and Poisson schedules")
    add_request_data_flags(p)
    add_sequence_flags(p)
    m = p.add_argument_group("measurement")
    # The window flags default to None so that a generative sweep can tell that none was given
    # (SweepSpec.auto_windows); `_windows` puts perf_analyzer's defaults in their place.
    m.add_argument(
        "--measurement-mode", choices=("time_windows", "count_windows"), default=None,
        help="default time_windows; with a generative --endpoint-type and no window flag, count windows of "
        "at least 100 requests (10 per request in flight; 5 s of arrivals on a schedule)",
    )  # fmt: skip
    m.add_argument(
        "-p",
        "--measurement-interval",
        type=float,
        default=None,
        metavar="MS",
        help="time window length (default 5000)",
    )
    m.add_argument(
        "--measurement-request-count",
        type=int,
        default=None,
        metavar="N",
        help="count_windows: requests per window (default 50; windows last at least 1 s)",
    )
    m.add_argument(
        "-s",
        "--stability-percentage",
        type=float,
        default=10.0,
        metavar="PCT",
        help="the last 3 windows' throughput and latency within ±PCT %% of their mean make a level stable (default 10)",
    )
    m.add_argument(
        "-r", "--max-trials", type=int, default=None, metavar="N",
        help=f"windows per level at most, at each window length (default {DEFAULT_MAX_TRIALS}); given, it bounds "
        "the level as in perf_analyzer: windows are not lengthened unless --window-lengthenings is given too",
    )  # fmt: skip
    m.add_argument(
        "--window-lengthenings", type=int, default=None, metavar="N",
        help="a level whose last 3 windows still disagree after -r windows goes on with windows twice as long "
        "(-p, or --measurement-request-count), the ones measured joined in pairs, up to N times and never past "
        f"{MAX_LENGTHENED_WINDOW_S:g} s a window: a level lasts at most about -r x -p x 2^N; the report says when "
        f"it happened (default {DEFAULT_LENGTHENINGS}, or 0 when -r is given; 0: perf_analyzer's rule)",
    )  # fmt: skip
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
    out.add_argument("-v", "--verbose", action="count", default=0, help="every window's line, and each level's checks")
    out.add_argument(
        "--verbose-csv",
        action="store_true",
        help="-f CSV: perf_analyzer's extra columns (Avg latency, request/response, response wait; the GPU "
        "columns with --collect-metrics)",
    )
    add_perf_analyzer_arguments(p)


def add_generative_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("generative endpoints (token figures: TTFT, ITL, tokens/s, goodput)")
    g.add_argument("--endpoint-type", choices=ENDPOINT_TYPES, default="kserve-infer",
                   help="kserve-infer: tensors (default); chat, completions, embeddings: OpenAI-compatible; "
                   "kserve-generate: Triton's generate extension")  # fmt: skip
    g.add_argument(
        "--endpoint", default="", metavar="PATH", help="path replacing the type's own ({model} is the model)"
    )
    g.add_argument("--tokenizer", default="bytes", metavar="bytes|usage|FILE",
                   help="count tokens as bytes (default), with the server's usage figures, or a local tokenizer.json")  # fmt: skip
    g.add_argument("--synthetic-input-tokens-mean", type=int, default=128, metavar="N")
    g.add_argument("--synthetic-input-tokens-stddev", type=float, default=0.0, metavar="N")
    g.add_argument("--output-tokens-mean", type=int, default=0, metavar="N", help="sent as max_tokens (0: not sent)")
    g.add_argument("--output-tokens-stddev", type=float, default=0.0, metavar="N")
    g.add_argument("--output-tokens-mean-deterministic", action="store_true", help="also send min_tokens")
    g.add_argument("--ignore-eos", action="store_true", help="also send ignore_eos: true")
    g.add_argument(
        "--input-file", type=Path, metavar="PROMPTS.jsonl",
        help='prompts: {"text": ...} lines, or plain lines; or sessions: AIPerf\'s multi_turn lines '
        '{"session_id": ..., "turns": [{"text": ..., "delay": MS}, ...]}',
    )  # fmt: skip
    g.add_argument("--trace-file", type=Path, metavar="TRACE.jsonl",
                   help="replay a Mooncake trace (timestamp ms, input_length, output_length, hash_ids) open loop")  # fmt: skip
    g.add_argument("--num-prompts", type=int, default=100, metavar="N", help="synthetic prompts to cycle through")
    g.add_argument("--goodput", metavar="SLOS", help="e.g. 'ttft_ms<=200,itl_ms<=20': requests/s that met every bound")
    g.add_argument("--goodput-attainment", type=float, default=90.0, metavar="PCT",
                   help="goodput holds at a level when PCT%% of its requests met every bound; --binary-search "
                   "without -l finds the highest such level (default 90)")  # fmt: skip


def add_session_arguments(p: argparse.ArgumentParser) -> None:
    s = p.add_argument_group(
        "multi-turn sessions (AIPerf's flags)",
        "each turn sends the session's history (prompts and answers received) and an X-Correlation-ID header",
    )
    s.add_argument("--conversation-num", "--num-conversations", "--num-sessions", type=int, metavar="N",
                   help="conversations to draw sessions from (default 100)")  # fmt: skip
    s.add_argument("--conversation-turn-mean", "--session-turns-mean", type=int, metavar="N",
                   help="turns per conversation, normal with --conversation-turn-stddev, at least 1 (default 1)")  # fmt: skip
    s.add_argument("--conversation-turn-stddev", "--session-turns-stddev", type=float, metavar="N")
    s.add_argument("--conversation-turn-delay-mean", "--session-turn-delay-mean", type=float, metavar="MS",
                   help="think time between a turn's answer and the next turn (default 0)")  # fmt: skip
    s.add_argument("--conversation-turn-delay-stddev", "--session-turn-delay-stddev", type=float, metavar="MS")
    s.add_argument("--conversation-turn-delay-ratio", "--session-delay-ratio", type=float, metavar="X",
                   help="every think time times X (default 1)")  # fmt: skip


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


def add_request_data_flags(p: argparse.ArgumentParser) -> None:
    req = p.add_argument_group("request data")
    req.add_argument(
        "--request-parameter",
        action="append",
        default=[],
        metavar="NAME:VALUE:TYPE",
        help="a parameter sent with every request; TYPE bool, int or string (repeatable; HTTP and gRPC)",
    )
    req.add_argument(
        "--string-length", type=int, default=128, metavar="N", help="length of generated strings (default 128)"
    )
    req.add_argument("--string-data", metavar="STRING", help="every string input element is STRING")
    req.add_argument(
        "--request-count",
        type=int,
        default=0,
        metavar="N",
        help="send N requests at one level and measure them as one window (default 0: windows until stable)",
    )


def add_sequence_flags(p: argparse.ArgumentParser) -> None:
    seq = p.add_argument_group(
        "sequences", "for models with sequence_batching: a sequence id and START/END go with every request"
    )
    seq.add_argument("--sequence-length", type=int, metavar="N", help="requests per sequence (default 20)")
    seq.add_argument(
        "--sequence-length-variation",
        type=float,
        metavar="PCT",
        help="lengths vary uniformly within ±PCT %% of --sequence-length (default 20)",
    )
    seq.add_argument(
        "--sequence-id-range",
        metavar="START[:END]",
        help="sequence ids from START up to END, excluded (default 1, and 2^32 - 1 ids as perf_analyzer)",
    )
    seq.add_argument("--start-sequence-id", type=int, metavar="ID", help="first sequence id (default 1)")
    seq.add_argument(
        "--num-of-sequences",
        type=int,
        metavar="N",
        help="request-rate mode: sequences live at once, each send to one drawn at random (default 4)",
    )
    seq.add_argument(
        "--serial-sequences",
        action="store_true",
        help="request-rate mode: a sequence's next request waits for its previous answer",
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
            json_tensors=args.input_tensor_format == "json",
            json_outputs=args.output_tensor_format == "json",
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


#: The window flags, by their argparse names, and perf_analyzer's defaults for them.
_WINDOW_FLAGS = {"measurement_mode": "time_windows", "measurement_interval": 5000.0, "measurement_request_count": 50}


def _windows(args: argparse.Namespace) -> WindowSpec:
    """The measurement flags, perf_analyzer's defaults for the window flags not given."""
    filled = {name: default if getattr(args, name) is None else getattr(args, name)
              for name, default in _WINDOW_FLAGS.items()}  # fmt: skip
    return windows_from_args(argparse.Namespace(**{**vars(args), **filled}))


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
    return run, code


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
