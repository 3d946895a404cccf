"""tritonserver 2.51's command line on perfkit-server: every flag of `tritonserver --help`, with what
it does here (implemented), why it does nothing here (accepted without effect, said once in the
log), or why a value is refused (exit 2, naming the flag).

`CATALOGUE` is the one table: `config.build_parser` adds the flags it defines here (`add_arguments`),
`config.config_from_args` reads them back (`config_fields`, `refusal`, `no_effect_given`), and
docs/server.md's table is generated from it (`markdown_table`, `python -m reference_server --flags-markdown`),
so the three cannot drift. The flags perfkit-server had before (ports, TLS, control mode, caches,
rate limiter) stay defined in config.py; their rows here carry `arg=None`.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reference_server.frontends.forwarding import compile_forward_pattern
from reference_server.frontends.restricted import CATEGORIES as RESTRICTED_CATEGORIES
from reference_server.frontends.restricted import parse_restrictions
from reference_server.scheduling.summaries import parse_quantiles

__all__ = [
    "CATALOGUE",
    "IMPLEMENTED",
    "NO_EFFECT",
    "PARTIAL",
    "REFUSED",
    "TritonFlag",
    "add_arguments",
    "config_fields",
    "markdown_table",
    "no_effect_given",
    "refusal",
]

IMPLEMENTED = "implemented"
PARTIAL = "implemented, some values refused"
NO_EFFECT = "accepted, no effect"
REFUSED = "refused"
COMPRESSION_LEVELS = ("none", "low", "medium", "high")
#: The --metrics-config settings that change something here.
_METRICS_SETTINGS = ("counter_latencies", "summary_latencies", "summary_quantiles")
LOG_FORMATS = ("default", "ISO8601")


def parse_bool(text: str) -> bool:
    """tritonserver's boolean values (and yes/no)."""
    lowered = text.lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got '{text}'")


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number of `minimum` or more."""

    def whole_number(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got '{text}'") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {minimum} or more, got {value}")
        return value

    return whole_number


_non_negative = at_least(0)


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got '{text}'") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def _forward_pattern(text: str) -> str:
    try:
        compile_forward_pattern(text)  # a bad expression is refused here, naming the flag
    except re.error as exc:
        raise argparse.ArgumentTypeError(f"'{text}' is not a regular expression: {exc}") from None
    return text


@dataclass(frozen=True, slots=True)
class TritonFlag:
    """One tritonserver flag. `arg`: argparse keywords where this module defines the flag (None:
    config.py does); `refuse`: given one parsed value, why it cannot be served here, or None."""

    name: str
    status: str
    note: str
    arg: dict[str, Any] | None = None
    refuse: Callable[[Any], str | None] | None = None
    #: Said once in the log when the flag is given (and not refused): why it changes nothing here.
    idle: str | None = None

    @property
    def dest(self) -> str:
        assert self.arg is not None
        return str(self.arg.get("dest", "triton_" + self.name[2:].replace("-", "_")))


def _when_true(reason: str) -> Callable[[Any], str | None]:
    return lambda value: reason if value else None


def _no_effect(name: str, why: str, kind: Callable[[str], Any] = str, metavar: str = "VALUE") -> TritonFlag:
    return TritonFlag(name, NO_EFFECT, why, {"type": kind, "metavar": metavar, "action": "append"}, idle=why)


_BOOL = {"type": parse_bool, "metavar": "BOOL"}
_NO_HTTP_THREADS = "one event loop serves each front end; --frontend-workers N runs them in N processes"
_NO_AGEING = (
    "connections are not aged out: a connection stays open until the client closes it, its keepalive "
    "PING goes unanswered (--grpc-keepalive-timeout) or the server stops"
)
_NO_GPU_POOLS = "the built-in backends allocate their own memory (onnxruntime's and the python stub's)"
_BUILT_IN = "the backends are built in, nothing is loaded from a directory"
_NO_SAGEMAKER = "no SageMaker endpoint is served here"
_NO_VERTEX = "no Vertex AI endpoint is served here"

#: Every flag of `tritonserver --help` (2.51), in its help's order.
# fmt: off
CATALOGUE: tuple[TritonFlag, ...] = (
    # Server
    TritonFlag("--id", IMPLEMENTED, "the server metadata's name, as in Triton (alias of --server-name)"),
    TritonFlag("--exit-timeout-secs", IMPLEMENTED, "on SIGTERM, how long in-flight requests may take to finish"),
    # Logging
    TritonFlag("--log-verbose", IMPLEMENTED, "verbose logging level"),
    TritonFlag("--log-info", IMPLEMENTED, "info-level logging on or off", {**_BOOL, "dest": "log_info"}),
    TritonFlag("--log-warning", IMPLEMENTED, "warning-level logging on or off", {**_BOOL, "dest": "log_warning"}),
    TritonFlag("--log-error", IMPLEMENTED, "error-level logging on or off", {**_BOOL, "dest": "log_error"}),
    TritonFlag("--log-format", IMPLEMENTED, "default (glog-style) or ISO8601",
               {"choices": LOG_FORMATS, "dest": "log_format"}),
    TritonFlag("--log-file", IMPLEMENTED, "log to this file instead of standard error",
               {"type": Path, "metavar": "FILE", "dest": "log_file"}),
    # Model repository
    TritonFlag("--model-store", IMPLEMENTED, "alias of --model-repository"),
    TritonFlag("--model-repository", IMPLEMENTED, "a model repository; given several times, the models of all are "
               "served (a name in two of them is not loaded: not unique across all model repositories, "
               "unless --model-namespacing true)"),
    TritonFlag("--exit-on-error", IMPLEMENTED,
               "true: a model that fails to load at start stops the server (exit 1); default false here, Triton's "
               "true: the server logs the failure and serves the rest", {**_BOOL, "dest": "exit_on_error"}),
    TritonFlag("--disable-auto-complete-config", IMPLEMENTED, "model configs are not auto-completed",
               {"action": "store_true", "dest": "disable_auto_complete_config"}),
    TritonFlag("--strict-readiness", IMPLEMENTED, "whether /v2/health/ready needs every model ready"),
    TritonFlag("--model-control-mode", IMPLEMENTED, "none, explicit or poll"),
    TritonFlag("--repository-poll-secs", IMPLEMENTED, "poll interval in poll mode"),
    TritonFlag("--load-model", IMPLEMENTED, "models to load at start in explicit mode ('*': all)"),
    TritonFlag("--model-config-name", IMPLEMENTED, "read <model>/configs/NAME.pbtxt where it exists",
               {"metavar": "NAME", "dest": "model_config_name"}),
    TritonFlag("--model-load-thread-count", IMPLEMENTED, "models loaded at once at start (default 4)",
               {"type": _non_negative, "metavar": "N", "dest": "model_load_thread_count"}),
    TritonFlag("--model-load-retry-count", IMPLEMENTED, "times a model that failed to load at start is tried again",
               {"type": _non_negative, "metavar": "N", "dest": "model_load_retry_count"}),
    TritonFlag("--model-namespacing", IMPLEMENTED,
               "true: each --model-repository is a namespace, and models of one name in several repositories "
               "all load (a request naming such a name gets Triton's ambiguity error; an ensemble's step "
               "takes its own repository's model; metrics carry a `namespace` label)",
               {**_BOOL, "dest": "model_namespacing"}),
    _no_effect("--enable-peer-access", "no CUDA peer access is set up: models run on onnxruntime's or the stub's "
               "devices", parse_bool, "BOOL"),
    # HTTP
    TritonFlag("--allow-http", IMPLEMENTED, "serve the HTTP/REST front end"),
    TritonFlag("--http-address", IMPLEMENTED, "HTTP bind address (alias: --host); default 127.0.0.1 here, not 0.0.0.0"),
    TritonFlag("--http-port", IMPLEMENTED, "HTTP port (0: a free one)"),
    TritonFlag("--reuse-http-port", IMPLEMENTED, "SO_REUSEPORT on the HTTP listener",
               {**_BOOL, "dest": "reuse_http_port"}),
    TritonFlag("--http-header-forward-pattern", IMPLEMENTED,
               "matching HTTP request headers reach the model as string request parameters",
               {"type": _forward_pattern, "metavar": "REGEX", "dest": "http_header_forward_pattern"}),
    _no_effect("--http-thread-count", _NO_HTTP_THREADS, _non_negative, "N"),
    TritonFlag("--http-restricted-api", IMPLEMENTED,
               "`<category>[,<category>...]:<key>=<value>`: requests to those endpoints want header `<key>: <value>` "
               "(else 403); categories: " + ", ".join(RESTRICTED_CATEGORIES),
               {"metavar": "<apis>:<key>=<value>", "action": "append", "dest": "http_restricted_api"}),
    # GRPC
    TritonFlag("--allow-grpc", IMPLEMENTED, "serve the gRPC front end"),
    TritonFlag("--grpc-address", IMPLEMENTED, "gRPC bind address; default: --http-address",
               {"metavar": "ADDRESS", "dest": "grpc_address"}),
    TritonFlag("--grpc-port", IMPLEMENTED, "gRPC port (0: a free one)"),
    TritonFlag("--reuse-grpc-port", IMPLEMENTED, "SO_REUSEPORT on the gRPC listener",
               {**_BOOL, "dest": "reuse_grpc_port"}),
    TritonFlag("--grpc-header-forward-pattern", IMPLEMENTED,
               "matching gRPC metadata reaches the model as string request parameters",
               {"type": _forward_pattern, "metavar": "REGEX", "dest": "grpc_header_forward_pattern"}),
    _no_effect("--grpc-infer-allocation-pool-size", "requests are Python objects, not pooled", _non_negative, "N"),
    TritonFlag("--grpc-use-ssl", IMPLEMENTED, "TLS on the gRPC listener with --grpc-server-cert/--grpc-server-key",
               {**_BOOL, "dest": "grpc_use_ssl"}),
    TritonFlag("--grpc-use-ssl-mutual", IMPLEMENTED, "as --grpc-use-ssl, and clients must present a certificate "
               "signed by --grpc-root-cert", {**_BOOL, "dest": "grpc_use_ssl_mutual"}),
    TritonFlag("--grpc-server-cert", IMPLEMENTED, "the gRPC listener's certificate (chain) file",
               {"type": Path, "metavar": "PEM", "dest": "grpc_server_cert"}),
    TritonFlag("--grpc-server-key", IMPLEMENTED, "its private key",
               {"type": Path, "metavar": "PEM", "dest": "grpc_server_key"}),
    TritonFlag("--grpc-root-cert", IMPLEMENTED, "the CA that signs client certificates (--grpc-use-ssl-mutual)",
               {"type": Path, "metavar": "PEM", "dest": "grpc_root_cert"}),
    TritonFlag("--grpc-infer-response-compression-level", IMPLEMENTED,
               "low/medium/high: ModelInfer answers are compressed with a coding the client accepts "
               "(gzip, deflate), as grpc core picks by level",
               {"choices": COMPRESSION_LEVELS, "type": str.lower, "dest": "grpc_response_compression"}),
    TritonFlag("--grpc-keepalive-time", IMPLEMENTED,
               "ms between the server's keepalive PINGs on a connection (default 7200000, 2 h), "
               "as grpc core's (connection_flags.py)"),
    TritonFlag("--grpc-keepalive-timeout", IMPLEMENTED,
               "ms a keepalive PING's ACK may take; later, the connection ends (GOAWAY) (default 20000)"),
    TritonFlag("--grpc-keepalive-permit-without-calls", IMPLEMENTED,
               "keepalive PINGs also while no call is open, and a client may ping that often too (default false)"),
    TritonFlag("--grpc-http2-max-pings-without-data", IMPLEMENTED,
               "keepalive PINGs sent with no HEADERS or DATA between them; 0: no cap (default 2)"),
    TritonFlag("--grpc-http2-min-recv-ping-interval-without-data", IMPLEMENTED,
               "ms a client's PINGs must be apart while the server sends no data, else a strike (default 300000)"),
    TritonFlag("--grpc-http2-max-ping-strikes", IMPLEMENTED,
               "strikes tolerated; one more ends the connection with GOAWAY ENHANCE_YOUR_CALM "
               "'too_many_pings'; 0: any number (default 2)"),
    _no_effect("--grpc-max-connection-age", _NO_AGEING, _non_negative, "MS"),
    _no_effect("--grpc-max-connection-age-grace", _NO_AGEING, _non_negative, "MS"),
    TritonFlag("--grpc-restricted-protocol", IMPLEMENTED,
               "`<category>[,<category>...]:<key>=<value>`: calls to those methods want metadata "
               "`triton-grpc-protocol-<key>: <value>` (else UNAVAILABLE); categories as --http-restricted-api",
               {"metavar": "<protocols>:<key>=<value>", "action": "append", "dest": "grpc_restricted_protocol"}),
    # SageMaker
    TritonFlag("--allow-sagemaker", PARTIAL, "false accepted; true refused: " + _NO_SAGEMAKER,
               {**_BOOL, "action": "append"}, _when_true(_NO_SAGEMAKER + "; drop the flag or give false"),
               _NO_SAGEMAKER),
    _no_effect("--sagemaker-port", _NO_SAGEMAKER, _non_negative, "PORT"),
    _no_effect("--sagemaker-safe-port-range", _NO_SAGEMAKER, str, "<low>-<high>"),
    _no_effect("--sagemaker-thread-count", _NO_SAGEMAKER, _non_negative, "N"),
    # Vertex AI
    TritonFlag("--allow-vertex-ai", PARTIAL, "false accepted; true refused: " + _NO_VERTEX,
               {**_BOOL, "action": "append"}, _when_true(_NO_VERTEX + "; drop the flag or give false"),
               _NO_VERTEX),
    _no_effect("--vertex-ai-port", _NO_VERTEX, _non_negative, "PORT"),
    _no_effect("--vertex-ai-thread-count", _NO_VERTEX, _non_negative, "N"),
    _no_effect("--vertex-ai-default-model", _NO_VERTEX, str, "MODEL"),
    # Metrics
    TritonFlag("--allow-metrics", IMPLEMENTED, "serve Prometheus metrics"),
    TritonFlag("--allow-gpu-metrics", IMPLEMENTED, "the nv_gpu_* families (from NVML)",
               {**_BOOL, "dest": "allow_gpu_metrics"}),
    TritonFlag("--allow-cpu-metrics", IMPLEMENTED, "the nv_cpu_* families",
               {**_BOOL, "dest": "allow_cpu_metrics"}),
    TritonFlag("--metrics-address", IMPLEMENTED, "metrics bind address; default: --http-address",
               {"metavar": "ADDRESS", "dest": "metrics_address"}),
    TritonFlag("--metrics-port", IMPLEMENTED, "metrics port (0: a free one)"),
    TritonFlag("--metrics-interval-ms", IMPLEMENTED,
               "the GPU and CPU figures are read at most this often (default here: at every scrape)",
               {"type": positive_float, "metavar": "MS", "dest": "metrics_interval_ms"}),
    TritonFlag("--metrics-config", IMPLEMENTED,
               "`counter_latencies=false` drops the `*_duration_us` counters; `summary_latencies=true` adds the "
               "`*_summary_us` summaries, over `summary_quantiles=<q>:<error>,...`; other settings accepted "
               "without effect",
               {"metavar": "<setting>=<value>", "action": "append", "dest": "metrics_config"}),
    # Tracing
    TritonFlag("--trace-config", IMPLEMENTED, "[<mode>,]<setting>=<value>, for the trace extension",
               {"metavar": "[<mode>,]<setting>=<value>", "action": "append", "dest": "trace_config"}),
    # Backend, repository agents, cache, rate limiter
    _no_effect("--backend-directory", _BUILT_IN, str, "DIR"),
    TritonFlag("--backend-config", IMPLEMENTED, "backend settings, e.g. onnxruntime,default-max-batch-size=8"),
    _no_effect("--repoagent-directory", "no repository agents run here", str, "DIR"),
    TritonFlag("--cache-config", IMPLEMENTED, "local,size=BYTES: the response cache"),
    TritonFlag("--cache-directory", NO_EFFECT, "the local cache is built in", idle="the local cache is built in"),
    TritonFlag("--rate-limit", IMPLEMENTED, "off or execution_count"),
    TritonFlag("--rate-limit-resource", IMPLEMENTED, "<name>:<count>[:<device>]"),
    # Memory and devices
    _no_effect("--pinned-memory-pool-byte-size", _NO_GPU_POOLS, _non_negative, "BYTES"),
    _no_effect("--cuda-memory-pool-byte-size", _NO_GPU_POOLS, str, "<device>:<bytes>"),
    _no_effect("--cuda-virtual-address-size", "implicit state is held in host memory here", str, "<device>:<bytes>"),
    _no_effect("--min-supported-compute-capability", "every GPU NVML lists may be used", str, "FLOAT"),
    _no_effect("--buffer-manager-thread-count", "tensors are copied on the thread that runs the request",
               _non_negative, "N"),
    _no_effect("--host-policy", "no NUMA or CPU-core pinning of instances", str, "<policy>,<setting>=<value>"),
    _no_effect("--model-load-gpu-limit", "loads are not refused by GPU memory use", str, "<device>:<fraction>"),
    # Deprecated
    TritonFlag("--strict-model-config", IMPLEMENTED, "true: model configs are not auto-completed",
               {**_BOOL, "dest": "strict_model_config"}),
    TritonFlag("--response-cache-byte-size", IMPLEMENTED, "deprecated: --cache-config local,size=BYTES"),
    TritonFlag("--trace-file", IMPLEMENTED, "deprecated: --trace-config triton,file=FILE",
               {"metavar": "FILE", "dest": "trace_file"}),
    TritonFlag("--trace-level", IMPLEMENTED, "deprecated: --trace-config level=LEVEL (repeatable)",
               {"metavar": "LEVEL", "action": "append", "dest": "trace_level"}),
    TritonFlag("--trace-rate", IMPLEMENTED, "deprecated: --trace-config rate=N", {"metavar": "N", "dest": "trace_rate"}),
    TritonFlag("--trace-count", IMPLEMENTED, "deprecated: --trace-config count=N",
               {"metavar": "N", "dest": "trace_count"}),
    TritonFlag("--trace-log-frequency", IMPLEMENTED, "deprecated: --trace-config triton,log-frequency=N",
               {"metavar": "N", "dest": "trace_log_frequency"}),
    TritonFlag("--help", IMPLEMENTED, "usage"),
)
# fmt: on

#: The deprecated trace flags and the --trace-config entry each stands for, in Triton's wording.
_TRACE_ENTRIES = (
    ("trace_file", "triton,file="),
    ("trace_level", "level="),
    ("trace_rate", "rate="),
    ("trace_count", "count="),
    ("trace_log_frequency", "triton,log-frequency="),
)


#: The dests `config_fields` turns into other fields rather than copy.
_READ_BELOW = frozenset(
    (
        "disable_auto_complete_config",
        "strict_model_config",
        "trace_config",
        "metrics_config",
        "http_restricted_api",
        "grpc_restricted_protocol",
        *(d for d, _ in _TRACE_ENTRIES),
    )
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The tritonserver flags config.py does not define itself, in one group."""
    group = parser.add_argument_group("tritonserver compatibility (docs/server.md: 'tritonserver flags')")
    for flag in CATALOGUE:
        if flag.arg is not None:
            kwargs = {k: v for k, v in flag.arg.items() if k != "dest"}
            group.add_argument(flag.name, dest=flag.dest, default=None, help=f"{flag.status}: {flag.note}", **kwargs)


def refusal(args: argparse.Namespace) -> str | None:
    """The first flag given with a value this server cannot serve, as an error naming it."""
    for flag in CATALOGUE:
        if flag.refuse is None or flag.arg is None:
            continue
        given = getattr(args, flag.dest)
        if given is None:
            continue
        for value in _listed(given):
            reason = flag.refuse(value)
            if reason is not None:
                return f"{flag.name} {str(value).lower() if isinstance(value, bool) else value}: {reason}"
    return None


def no_effect_given(args: argparse.Namespace) -> tuple[tuple[str, str], ...]:
    """(flag, why it has no effect here) for each flag given that does nothing here."""
    given = []
    for flag in CATALOGUE:
        dest = flag.dest if flag.arg is not None else flag.name[2:].replace("-", "_")
        if flag.idle is not None and getattr(args, dest, None) is not None:
            given.append((flag.name, flag.idle))
    for entry in args.metrics_config or ():
        setting = entry.partition("=")[0].strip()
        if setting not in _METRICS_SETTINGS:
            given.append((f"--metrics-config {setting}", "only " + ", ".join(_METRICS_SETTINGS) + " apply here"))
    return tuple(given)


def metrics_settings(entries: Sequence[str]) -> dict[str, str]:
    settings = {}
    for entry in entries:
        key, sep, value = entry.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"--metrics-config '{entry}' must look like <setting>=<value>")
        settings[key.strip()] = value.strip()
    return settings


def config_fields(args: argparse.Namespace) -> dict[str, Any]:
    """ServerConfig's fields from the flags this module defines (argparse's None: not given)."""
    fields: dict[str, Any] = {}
    for flag in CATALOGUE:
        if flag.arg is None or flag.dest.startswith("triton_") or flag.dest in _READ_BELOW:
            continue
        value = getattr(args, flag.dest)
        if value is not None:
            fields[flag.dest] = value  # named as ServerConfig's field
    if args.disable_auto_complete_config or args.strict_model_config:
        fields["auto_complete_config"] = False
    trace = [prefix + str(value) for dest, prefix in _TRACE_ENTRIES for value in _listed(getattr(args, dest))]
    fields["trace_config"] = tuple(trace + list(args.trace_config or ()))
    fields["http_restricted_api"] = parse_restrictions(args.http_restricted_api or (), "--http-restricted-api", "api")
    fields["grpc_restricted_protocol"] = parse_restrictions(
        args.grpc_restricted_protocol or (), "--grpc-restricted-protocol", "protocol"
    )
    metrics = metrics_settings(args.metrics_config or ())
    # Triton turns summaries on with exactly "true" (core src/metric_model_reporter.cc).
    fields["metrics_summary_latencies"] = metrics.get("summary_latencies") == "true"
    if "summary_quantiles" in metrics:
        try:
            fields["metrics_summary_quantiles"] = parse_quantiles(metrics["summary_quantiles"])
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    counters = metrics.get("counter_latencies")
    if counters is not None:
        fields["metrics_counter_latencies"] = parse_bool(counters)
    return fields


def _listed(value: Any) -> list[Any]:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def markdown_table() -> str:
    """docs/server.md's table of tritonserver flags, from CATALOGUE."""
    lines = ["| tritonserver flag | here | what it does here, or why not |", "| --- | --- | --- |"]
    for flag in sorted(CATALOGUE, key=lambda f: f.name):
        lines.append(f"| `{flag.name}` | {flag.status} | {flag.note} |")
    return "\n".join(lines) + "\n"
