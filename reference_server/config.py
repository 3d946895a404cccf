"""Server configuration: Triton's command-line flags, parsed once into a frozen ServerConfig."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from reference_server import connection_flags, triton_flags
from reference_server._version import __version__
from reference_server.core.dataplane import SERVER_NAME
from reference_server.core.response_cache import cache_size_from_flags
from reference_server.errors import ServerError
from reference_server.frontends.auth import Token, read_token_file
from reference_server.frontends.grpc.server import MAX_STREAMS
from reference_server.frontends.http.limits import DEFAULT_LIMITS, HttpLimits
from reference_server.scheduling.rate_limiter import MODES as RATE_LIMIT_MODES
from reference_server.scheduling.rate_limiter import parse_resource
from reference_server.scheduling.summaries import DEFAULT_QUANTILES
from reference_server.triton_flags import parse_bool
from v2kit import compiled
from v2kit.h2.pings import GRPC_SERVER_PINGS
from v2kit.h2.rules import H2Limits
from v2kit.runtime import cpus as runtime_cpus

CONTROL_MODES = ("none", "explicit", "poll")

#: Safe defaults for the overload limits: a few thousand requests in flight server-wide, and 2**24
#: elements per request (64 MiB of FP32, the body limit's worth).
DEFAULT_MAX_INFLIGHT_REQUESTS = 4096
DEFAULT_HTTP_READ_PAUSE_INFLIGHT = 2048  # half the in-flight limit: the gate acts before the 503s
DEFAULT_MAX_TENSOR_ELEMENTS = 1 << 24
MAX_FRONTEND_WORKERS = 64
#: Below this many usable CPUs, `--frontend-workers auto` keeps one process (bench/README.md, "cores.py").
AUTO_WORKERS_MIN_CPUS = 4
#: The most workers `auto` starts for a model whose instances they run (measured to 8, bench/README.md "cores.py").
AUTO_WORKERS_MAX = 16
#: The most workers `auto` starts when the core runs every model: more did not serve more on 8 cores.
AUTO_CORE_WORKERS_MAX = 4
#: `--frontend-workers auto`: chosen at start, from the usable CPUs and the models loaded then.
AUTO_FRONTEND_WORKERS = 0


@dataclass(frozen=True, slots=True)
class ServerConfig:
    model_repository: Path
    #: The repositories after the first, when --model-repository is given several times: their models
    #: are served beside the first's, each name in one repository only (`core/repository_roots.py`).
    more_model_repositories: tuple[Path, ...] = ()
    #: --model-namespacing true: each repository is a namespace (`core/namespaces.py`).
    model_namespacing: bool = False
    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    allow_http: bool = True
    allow_grpc: bool = True
    allow_metrics: bool = True
    model_control_mode: str = "none"
    load_models: tuple[str, ...] = ()
    repository_poll_secs: float = 15.0
    strict_readiness: bool = True
    http_max_input_size: int = 64 * 1024 * 1024
    http_body_timeout_secs: float = 60.0
    http_max_request_line: int = DEFAULT_LIMITS.max_request_line
    http_max_header_line: int = DEFAULT_LIMITS.max_header_line
    http_max_head_size: int = DEFAULT_LIMITS.max_head_bytes
    http_max_headers: int = DEFAULT_LIMITS.max_headers
    http_head_timeout_secs: float = DEFAULT_LIMITS.head_timeout_s
    http_idle_timeout_secs: float = DEFAULT_LIMITS.idle_timeout_s
    http_max_pipelined_requests: int = DEFAULT_LIMITS.max_pipelined
    http_max_unparsed_bytes: int = DEFAULT_LIMITS.max_unparsed
    #: The gRPC front end's HTTP/2 limits per connection (--grpc-http2-*, `connection_flags.py`).
    grpc_max_concurrent_streams: int = MAX_STREAMS
    grpc_http2_limits: H2Limits = H2Limits(pings=GRPC_SERVER_PINGS)  # keepalive and ping strikes as tritonserver's
    exit_timeout_secs: float = 30.0
    default_max_batch_size: int = 4
    log_verbose: int = 0
    backend_config: dict[str, str] = field(default_factory=dict)
    max_inflight_requests: int = DEFAULT_MAX_INFLIGHT_REQUESTS
    http_read_pause_inflight: int = DEFAULT_HTTP_READ_PAUSE_INFLIGHT
    max_tensor_elements: int = DEFAULT_MAX_TENSOR_ELEMENTS
    #: Bearer token every non-health endpoint wants; never printed (repr=False).
    auth_token: str | None = field(default=None, repr=False)
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    #: The local response cache's size in bytes (--cache-config local,size=BYTES); None: no cache.
    response_cache_bytes: int | None = None
    rate_limit: str = "off"
    #: --rate-limit-resource values as (name, count, device or None for every device).
    rate_limit_resources: tuple[tuple[str, int, int | None], ...] = ()
    server_name: str = SERVER_NAME
    #: Processes running the HTTP and gRPC front ends (`workers/`); 1: they run in this process;
    #: AUTO_FRONTEND_WORKERS: chosen at start (`auto_frontend_workers`).
    frontend_workers: int = 1
    #: Whether the workers run the instances of the models that allow it themselves (`workers/hosting.py`).
    worker_instances: bool = True
    # --- logging (tritonserver's --log-*; changed at run time through the logging extension) ---
    #: Where the server (and its python stubs) log; None: standard error.
    log_file: Path | None = None
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    #: "default" (glog-style `I1129 05:45:55.123456 123 file.py:12] message`) or "ISO8601".
    log_format: str = "default"
    # --- tracing (tritonserver's --trace-config, and the deprecated --trace-file/-level/-rate/-count/-log-frequency) ---
    #: The `--trace-config` entries as given, `[<mode>,]<setting>=<value>` (mode: triton or opentelemetry).
    trace_config: tuple[str, ...] = ()
    # --- model configuration ---
    #: False with --disable-auto-complete-config or --strict-model-config true: no auto-complete.
    auto_complete_config: bool = True
    #: --model-config-name NAME: read `<model>/configs/NAME.pbtxt` where it exists, else config.pbtxt.
    model_config_name: str | None = None
    # --- request headers forwarded to models as request parameters (regular expressions) ---
    http_header_forward_pattern: str | None = None
    grpc_header_forward_pattern: str | None = None
    #: --http-restricted-api / --grpc-restricted-protocol rules, (category, header key, value) each
    #: (`frontends/restricted.py`).
    http_restricted_api: tuple[tuple[str, str, str], ...] = ()
    grpc_restricted_protocol: tuple[tuple[str, str, str], ...] = ()
    # --- the rest of tritonserver's command line (reference_server/triton_flags.py) ---
    #: Bind addresses of the gRPC and metrics listeners; None: `host` (--http-address).
    grpc_address: str | None = None
    metrics_address: str | None = None
    reuse_http_port: bool = False
    reuse_grpc_port: bool = False
    #: TLS on the gRPC listener alone (--grpc-use-ssl[-mutual], --grpc-server-cert/-key, --grpc-root-cert).
    grpc_use_ssl: bool = False
    grpc_use_ssl_mutual: bool = False
    grpc_server_cert: Path | None = None
    grpc_server_key: Path | None = None
    grpc_root_cert: Path | None = None
    #: --grpc-infer-response-compression-level: none, low, medium or high.
    grpc_response_compression: str = "none"
    #: A model that fails to load at start stops the server (Triton's default is true; ours serves the rest).
    exit_on_error: bool = False
    model_load_thread_count: int = 4
    model_load_retry_count: int = 0
    allow_cpu_metrics: bool = True
    allow_gpu_metrics: bool = True
    #: How often the GPU and CPU figures are read; None: at every scrape.
    metrics_interval_ms: float | None = None
    #: --metrics-config counter_latencies: the per-model *_duration_us counters.
    metrics_counter_latencies: bool = True
    #: --metrics-config summary_latencies=true: the *_summary_us summaries (`scheduling/summaries.py`),
    #: over these (quantile, error) pairs (summary_quantiles).
    metrics_summary_latencies: bool = False
    metrics_summary_quantiles: tuple[tuple[float, float], ...] = DEFAULT_QUANTILES
    #: (flag, why) for each tritonserver flag given that has no effect here, logged once at start.
    no_effect_flags: tuple[tuple[str, str], ...] = ()

    @property
    def tls(self) -> bool:
        return self.ssl_certfile is not None

    @property
    def grpc_host(self) -> str:
        return self.host if self.grpc_address is None else self.grpc_address

    @property
    def metrics_host(self) -> str:
        return self.host if self.metrics_address is None else self.metrics_address

    @property
    def grpc_ssl(self) -> bool:
        """TLS on the gRPC listener of its own (--grpc-use-ssl or --grpc-use-ssl-mutual)."""
        return self.grpc_use_ssl or self.grpc_use_ssl_mutual

    @property
    def http_limits(self) -> HttpLimits:
        """The HTTP front end's limits on a request head and its connection's timers."""
        return HttpLimits(
            max_request_line=self.http_max_request_line,
            max_header_line=self.http_max_header_line,
            max_head_bytes=self.http_max_head_size,
            max_headers=self.http_max_headers,
            head_timeout_s=self.http_head_timeout_secs,
            idle_timeout_s=self.http_idle_timeout_secs,
            max_pipelined=self.http_max_pipelined_requests,
            max_unparsed=self.http_max_unparsed_bytes,
        )

    def validate(self) -> None:
        if self.model_control_mode not in CONTROL_MODES:
            raise ServerError(f"--model-control-mode must be one of {', '.join(CONTROL_MODES)}")
        for flag, port in (
            ("--http-port", self.http_port),
            ("--grpc-port", self.grpc_port),
            ("--metrics-port", self.metrics_port),
        ):
            if not 0 <= port <= 65535:
                raise ServerError(f"{flag} must be a port number 0-65535 (0 picks a free port), got {port}")
        if self.load_models and self.model_control_mode != "explicit":
            raise ServerError("--load-model is only valid with --model-control-mode explicit")
        if self.model_control_mode == "poll" and self.repository_poll_secs <= 0:
            raise ServerError("--repository-poll-secs must be a positive number of seconds in poll mode")
        if self.http_max_input_size <= 0:
            raise ServerError("--http-max-input-size must be a positive number of bytes")
        if not self.http_body_timeout_secs > 0:
            raise ServerError("--http-body-timeout-secs must be a positive number of seconds")
        try:
            self.http_limits.validate()
        except ValueError as exc:
            raise ServerError(str(exc)) from None
        if self.max_inflight_requests < 1:
            raise ServerError("--max-inflight-requests must be at least 1")
        if self.http_read_pause_inflight == 1 or self.http_read_pause_inflight < 0:
            raise ServerError("--http-read-pause-inflight must be 0 (never pause) or at least 2")
        if self.max_tensor_elements < 1:
            raise ServerError("--max-tensor-elements must be at least 1")
        if self.auth_token is not None:
            Token(self.auth_token)  # raises on an unusable token, without quoting it
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ServerError("--ssl-certfile and --ssl-keyfile go together: give both for TLS, or neither")
        if self.response_cache_bytes is not None and self.response_cache_bytes <= 0:
            raise ServerError("--cache-config local,size=BYTES needs a positive size")
        if self.rate_limit not in RATE_LIMIT_MODES:
            raise ServerError("invalid argument for --rate-limit: give off or execution_count")
        if self.frontend_workers != AUTO_FRONTEND_WORKERS and not 1 <= self.frontend_workers <= MAX_FRONTEND_WORKERS:
            raise ServerError(f"--frontend-workers must be 1-{MAX_FRONTEND_WORKERS}, got {self.frontend_workers}")
        if not self.server_name.strip():
            raise ServerError("--server-name must not be empty")
        if self.grpc_ssl and (self.grpc_server_cert is None or self.grpc_server_key is None):
            raise ServerError("--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key")
        if self.grpc_use_ssl_mutual and self.grpc_root_cert is None:
            raise ServerError("--grpc-use-ssl-mutual needs --grpc-root-cert, the CA that signs the client certificates")
        if self.model_load_thread_count < 1:
            raise ServerError("--model-load-thread-count must be at least 1")
        for flag, path in (
            ("--ssl-certfile", self.ssl_certfile),
            ("--ssl-keyfile", self.ssl_keyfile),
            *(
                (("--grpc-server-cert", self.grpc_server_cert), ("--grpc-server-key", self.grpc_server_key),
                 ("--grpc-root-cert", self.grpc_root_cert)) if self.grpc_ssl else ()
            ),
        ):  # fmt: skip
            if path is not None and not path.is_file():
                raise ServerError(f"{flag} {path}: no such file")


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got '{text}'") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 0-65535 (0 picks a free port), got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="perfkit-server",
        # Not argparse's listing of every flag, which would bury an error under a hundred lines.
        usage="%(prog)s --model-repository DIR [options]   (--help lists them)",
        description="KServe v2 inference server for ONNX models in a Triton model repository. "
        "Flags follow tritonserver's.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--version", action=compiled.version_action("perfkit-server", __version__, ("v2kit", "reference_server"))
    )
    parser.add_argument(
        "--model-repository",
        "--model-store",
        type=Path,
        action="append",
        required=True,
        metavar="DIR",
        help="Triton model repository: DIR/<model>/config.pbtxt and DIR/<model>/<version>/model.onnx; "
        "repeat it to serve the models of several",
    )
    net = parser.add_argument_group("network")
    net.add_argument(
        "--host",
        "--http-address",
        default="127.0.0.1",
        help="address to bind, and --grpc-address's and --metrics-address's default; pass 0.0.0.0 deliberately "
        "to serve beyond this machine",
    )
    net.add_argument("--http-port", type=_port, default=8000, help="HTTP/REST port (0 = any free port)")
    net.add_argument("--grpc-port", type=_port, default=8001, help="gRPC port (0 = any free port)")
    net.add_argument("--metrics-port", type=_port, default=8002, help="Prometheus metrics port (0 = any free port)")
    net.add_argument(
        "--ssl-certfile",
        type=Path,
        metavar="PEM",
        help="serve HTTP and gRPC over TLS with this certificate (chain) file; needs --ssl-keyfile",
    )
    net.add_argument("--ssl-keyfile", type=Path, metavar="PEM", help="private key of --ssl-certfile")
    secret = net.add_mutually_exclusive_group()
    secret.add_argument(
        "--auth-token",
        metavar="TOKEN",
        help="require 'Authorization: Bearer TOKEN' (gRPC metadata 'authorization') on every endpoint but "
        "the health probes; visible to other local users in the process list, so prefer --auth-token-file",
    )
    secret.add_argument(
        "--auth-token-file", type=Path, metavar="FILE", help="as --auth-token, the token read from FILE"
    )
    net.add_argument("--allow-http", type=parse_bool, default=True, metavar="BOOL")
    net.add_argument("--allow-grpc", type=parse_bool, default=True, metavar="BOOL")
    net.add_argument("--allow-metrics", type=parse_bool, default=True, metavar="BOOL")
    net.add_argument(
        "--http-max-input-size",
        type=int,
        default=64 * 1024 * 1024,
        metavar="BYTES",
        help="largest request accepted, on both front ends: larger HTTP bodies get 413, larger gRPC messages "
        "RESOURCE_EXHAUSTED",
    )
    net.add_argument(
        "--http-body-timeout-secs",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="an HTTP request body not all in within SECONDS of its headers gets 408 and the connection closes",
    )
    limits = parser.add_argument_group("limits")
    limits.add_argument(
        "--max-inflight-requests",
        type=int,
        default=DEFAULT_MAX_INFLIGHT_REQUESTS,
        metavar="N",
        help="inference requests in progress at once, server-wide; more get HTTP 503 / gRPC UNAVAILABLE at once",
    )
    limits.add_argument(
        "--http-read-pause-inflight",
        type=int,
        default=DEFAULT_HTTP_READ_PAUSE_INFLIGHT,
        metavar="N",
        help="stop reading new HTTP requests while N inference requests are in progress, until half are "
        "done, so an overload waits in the sockets instead of being read and refused (0: never)",
    )
    limits.add_argument(
        "--max-tensor-elements",
        type=int,
        default=DEFAULT_MAX_TENSOR_ELEMENTS,
        metavar="N",
        help="elements one inference request's inputs may hold together; more get HTTP 400 / INVALID_ARGUMENT",
    )
    models = parser.add_argument_group("models")
    models.add_argument(
        "--model-control-mode",
        choices=CONTROL_MODES,
        default="none",
        help="none: load every model at start; explicit: load only --load-model and "
        "what the repository API asks; poll: load all and reload on change",
    )
    models.add_argument(
        "--load-model",
        action="append",
        default=[],
        metavar="NAME",
        help="model to load at start in explicit mode; '*' loads all (repeatable)",
    )
    models.add_argument("--repository-poll-secs", type=float, default=15.0, metavar="SECONDS")
    models.add_argument(
        "--strict-readiness",
        type=parse_bool,
        default=True,
        metavar="BOOL",
        help="true: /v2/health/ready needs every model ready; false: server up is ready",
    )
    models.add_argument(
        "--backend-config",
        action="append",
        default=[],
        metavar="[BACKEND,]KEY=VALUE",
        help="backend setting, e.g. onnxruntime,default-max-batch-size=8",
    )
    cache = parser.add_argument_group("response cache and rate limiter")
    cache.add_argument(
        "--cache-config",
        action="append",
        default=[],
        metavar="<cache>,<setting>=<value>",
        help="configure the response cache: local,size=BYTES gives the models whose config enables "
        "response_cache an LRU cache of BYTES in all (only the 'local' cache exists here)",
    )
    cache.add_argument(
        "--cache-directory", metavar="DIR", help="accepted for Triton's command lines; the local cache is built in"
    )
    cache.add_argument(
        "--response-cache-byte-size", type=int, metavar="BYTES", help="DEPRECATED: use --cache-config local,size=BYTES"
    )
    cache.add_argument(
        "--rate-limit",
        type=str.lower,
        choices=RATE_LIMIT_MODES,
        default="off",
        help="execution_count: an instance runs a batch only when the resources of its instance_group's "
        "rate_limiter are free, the least-run (by priority) first; off: ignore rate_limiter configs",
    )
    cache.add_argument(
        "--rate-limit-resource",
        action="append",
        default=[],
        metavar="<name>:<count>[:<device>]",
        help="how many of a resource there are (on one device, or every device); default: the most any "
        "instance asks for (repeatable)",
    )
    parser.add_argument(
        "--exit-timeout-secs",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="on SIGTERM, how long in-flight requests may take to finish",
    )
    parser.add_argument(
        "--frontend-workers",
        type=_frontend_workers,
        default="auto",
        metavar="N|auto",
        help="processes that run the HTTP and gRPC front ends, sharing their ports, while this one runs the "
        f"models; 1: one process does both; auto: 1 below {AUTO_WORKERS_MIN_CPUS} usable CPUs, else as many as "
        f"the most instances a model loaded at start may run in the workers (--worker-instances), at most one per "
        f"CPU and {AUTO_WORKERS_MAX}, and at least half the CPUs up to {AUTO_CORE_WORKERS_MAX}",
    )
    parser.add_argument(
        "--worker-instances",
        type=parse_bool,
        default=True,
        metavar="BOOL",
        help="with front-end workers, divide the instances of each plain onnxruntime model with at least one "
        "instance per worker among the workers, each running the requests it reads; false: the models run "
        "in this process only",
    )
    parser.add_argument(
        "--server-name",
        "--id",
        default=SERVER_NAME,
        metavar="NAME",
        help="the name the server metadata reports; 'triton' for clients that check for Triton by name",
    )
    parser.add_argument(
        "--log-verbose", type=int, default=0, metavar="LEVEL", help="0: info; 1 and above: also every request"
    )
    connection_flags.add_arguments(parser)
    triton_flags.add_arguments(parser)
    return parser


def parse_backend_config(entries: Sequence[str]) -> dict[str, str]:
    settings: dict[str, str] = {}
    for entry in entries:
        setting = entry.split(",", 1)[1] if "," in entry else entry
        key, sep, value = setting.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(
                f"--backend-config '{entry}' must look like onnxruntime,KEY=VALUE or KEY=VALUE"
            )
        settings[key.strip()] = value.strip()
    return settings


def config_from_args(argv: Sequence[str] | None = None) -> ServerConfig:
    parser = build_parser()
    args = parser.parse_args(argv)
    refused = triton_flags.refusal(args)
    if refused is not None:
        parser.error(refused)
    try:
        triton = triton_flags.config_fields(args)
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    try:
        backend = parse_backend_config(args.backend_config)
        default_mbs = int(backend.get("default-max-batch-size", "4"))
    except (argparse.ArgumentTypeError, ValueError) as exc:
        parser.error(str(exc))
    try:
        cache_bytes = cache_size_from_flags(args.cache_config, args.response_cache_byte_size)
        resources = tuple(parse_resource(text) for text in args.rate_limit_resource)
    except ValueError as exc:
        parser.error(str(exc))
    if args.response_cache_byte_size is not None:
        print(
            "Warning: '--response-cache-byte-size' has been deprecated! Please use '--cache-config' instead. The "
            f"equivalent --cache-config CLI args would be: '--cache-config=local,size={args.response_cache_byte_size}'",
            file=sys.stderr,
        )
    token = args.auth_token
    if args.auth_token_file is not None:
        try:
            token = read_token_file(args.auth_token_file)
        except ServerError as exc:
            parser.error(str(exc))
    config = ServerConfig(
        model_repository=args.model_repository[0],
        more_model_repositories=tuple(args.model_repository[1:]),
        host=args.host,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        allow_http=args.allow_http,
        allow_grpc=args.allow_grpc,
        allow_metrics=args.allow_metrics,
        model_control_mode=args.model_control_mode,
        load_models=tuple(args.load_model),
        repository_poll_secs=args.repository_poll_secs,
        strict_readiness=args.strict_readiness,
        http_max_input_size=args.http_max_input_size,
        http_body_timeout_secs=args.http_body_timeout_secs,
        exit_timeout_secs=args.exit_timeout_secs,
        frontend_workers=AUTO_FRONTEND_WORKERS if args.frontend_workers == "auto" else args.frontend_workers,
        worker_instances=args.worker_instances,
        default_max_batch_size=default_mbs,
        log_verbose=args.log_verbose,
        backend_config=backend,
        max_inflight_requests=args.max_inflight_requests,
        http_read_pause_inflight=args.http_read_pause_inflight,
        max_tensor_elements=args.max_tensor_elements,
        auth_token=token,
        ssl_certfile=args.ssl_certfile,
        ssl_keyfile=args.ssl_keyfile,
        response_cache_bytes=cache_bytes,
        rate_limit=args.rate_limit,
        rate_limit_resources=resources,
        server_name=args.server_name,
        no_effect_flags=triton_flags.no_effect_given(args),
        **connection_flags.config_fields(args),
        **triton,
    )
    try:
        config.validate()
    except Exception as exc:
        parser.error(str(exc))
    return config


def _frontend_workers(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        workers = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"give a number of processes or auto, not {text!r}") from None
    if not 1 <= workers <= MAX_FRONTEND_WORKERS:
        raise argparse.ArgumentTypeError(f"give 1-{MAX_FRONTEND_WORKERS} processes or auto, not {text}")
    return workers


def auto_frontend_workers(usable_cpus: int | None = None, instance_counts: Iterable[int] = ()) -> int:
    """The front-end workers that serve best with `usable_cpus` (default: the CPUs this process may
    use, its cgroup's CPU quota included), given the `instance_counts` of the models loaded at start
    that the workers could run themselves (`workers/hosting.py`).

    One process below AUTO_WORKERS_MIN_CPUS: there a worker's hand-offs per request cost more than a
    second process gains (with the client on the same two cores, one process served up to 2x what
    two workers did). From 4 CPUs, as many workers as the largest of `instance_counts`, at most one
    per CPU and AUTO_WORKERS_MAX, so that such a model has an instance in every worker and its
    requests never cross to the core (on 8 pinned cores 8 workers served 1.2-1.6x what 4 did); but
    at least half the CPUs, at most AUTO_CORE_WORKERS_MAX, which served best when the core runs every
    request (1.2-2.2x one process on 4 and 8 cores; 8 workers no more than 4). One process off Linux.
    """
    if usable_cpus is None:
        if not sys.platform.startswith("linux"):
            return 1  # elsewhere SO_REUSEPORT does not spread connections over the workers' sockets
        usable_cpus = runtime_cpus.usable_cpus()  # a container's CPU limit counts, not the host's CPUs
    if usable_cpus < AUTO_WORKERS_MIN_CPUS:
        return 1
    in_workers = min(AUTO_WORKERS_MAX, usable_cpus, max(instance_counts, default=0))
    return max(min(AUTO_CORE_WORKERS_MAX, usable_cpus // 2), in_workers)
