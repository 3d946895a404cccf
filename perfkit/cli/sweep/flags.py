"""`perfkit sweep`'s flags: the sweep's own by group (target, load, streaming and shared memory,
generative endpoints, sessions, distributed load, input data, request data, sequences,
measurement, resources, output), then perf_analyzer's that the sweep's own do not cover
(`perf_analyzer.py`). `spec.py` reads them into a SweepSpec.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from perfkit.cli.common import add_connection_flags
from perfkit.cli.sweep.perf_analyzer import add_perf_analyzer_arguments
from perfkit.genai.workload import ENDPOINT_TYPES
from perfkit.measure.level import DEFAULT_LENGTHENINGS, DEFAULT_MAX_TRIALS, MAX_LENGTHENED_WINDOW_S


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
        default=None,
        help="HTTP tensor encoding (default binary where the server lists the binary_tensor_data extension, else json)",
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
    # (SweepSpec.auto_windows); `spec._windows` puts perf_analyzer's defaults in their place.
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
        "default: where the server's metadata name says (triton: port 8002 on the host of each -u endpoint; "
        "mlserver: 8082; kserve: /metrics on its HTTP port), else none",
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
