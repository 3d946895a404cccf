"""The sweep's settings: one frozen tree built from the command line, validated in one place.

Its target (`TargetSpec`, with TLS) and measurement windows (`WindowSpec`) are also tune's and
probe's settings, each with its own `validate()`, so the three commands check those flags alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from perfkit.errors import PerfkitError
from perfkit.load.ray import RAY_MISSING, ray_installed


@dataclass(frozen=True, slots=True)
class TlsSpec:
    """Client TLS, with perf_analyzer's options: HTTPS is `-u https://...`; gRPC needs grpc_use_ssl."""

    grpc_use_ssl: bool = False
    grpc_root_certs: Path | None = None  # PEM CA bundle; None: the system's roots
    https_ca_certs: Path | None = None  # PEM CA bundle; None: the system's roots
    https_verify_peer: bool = True


@dataclass(frozen=True, slots=True)
class TargetSpec:
    url: str | None  # None: start the embedded reference server
    protocol: str = "http"  # http | grpc
    model: str | None = None
    model_version: str = ""
    headers: tuple[tuple[str, str], ...] = ()
    request_timeout_s: float = 30.0
    json_tensors: bool = False
    tls: TlsSpec = field(default_factory=TlsSpec)
    max_connections: int = 0  # HTTP connections per load process; 0: one per outstanding request

    def validate(self) -> None:
        """The rules of the target flags, shared by sweep, tune and probe: -i, the tensor format,
        --request-timeout, and the TLS options against -u."""
        if self.protocol not in ("http", "grpc"):
            raise PerfkitError(f"-i must be http or grpc, got '{self.protocol}'")
        if self.json_tensors and self.protocol != "http":
            raise PerfkitError("--input-tensor-format json applies to HTTP only; drop it or use -i http")
        if self.request_timeout_s <= 0:
            raise PerfkitError("--request-timeout must be a positive number of seconds")
        tls = self.tls
        https = (tls.https_ca_certs is not None or not tls.https_verify_peer) and self.protocol == "http"
        if https and not (self.url or "").startswith("https://"):
            raise PerfkitError("--ssl-https-* options apply to an HTTPS server: give -u https://HOST:PORT")
        if tls.grpc_root_certs is not None and not tls.grpc_use_ssl:
            raise PerfkitError("--ssl-grpc-root-certifications-file needs --ssl-grpc-use-ssl")
        if tls.grpc_use_ssl and self.url is None:
            raise PerfkitError("--ssl-grpc-use-ssl needs -u: the embedded server listens in the clear on loopback")
        for flag, path in (
            ("--ssl-grpc-root-certifications-file", tls.grpc_root_certs),
            ("--ssl-https-ca-certificates-file", tls.https_ca_certs),
        ):
            if path is not None and not path.is_file():
                raise PerfkitError(f"{flag} {path}: no such file")


@dataclass(frozen=True, slots=True)
class InputSpec:
    batch_size: int = 1
    shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()
    input_data: str = "random"  # random | zero | path to a JSON file
    seed: int = 0


@dataclass(frozen=True, slots=True)
class WindowSpec:
    """perf_analyzer's measurement settings, with its defaults."""

    mode: str = "time_windows"  # time_windows | count_windows
    interval_ms: float = 5000.0
    request_count: int = 50
    stability_pct: float = 10.0
    max_trials: int = 10
    stable_window_count: int = 3
    percentile: float | None = None  # None: stabilise on (and report) the average latency
    warmup_request_count: int = 0
    delay_tolerance_ms: float = 1.0

    def validate(self) -> None:
        """The measurement flags' rules, shared by sweep and tune."""
        if self.mode not in ("time_windows", "count_windows"):
            raise PerfkitError("--measurement-mode must be time_windows or count_windows")
        if self.interval_ms <= 0:
            raise PerfkitError("-p/--measurement-interval must be a positive number of milliseconds")
        if self.request_count < 1:
            raise PerfkitError("--measurement-request-count must be at least 1")
        if not 0 < self.stability_pct:
            raise PerfkitError("-s/--stability-percentage must be positive")
        if self.max_trials < self.stable_window_count:
            raise PerfkitError(
                f"-r/--max-trials must be at least {self.stable_window_count}: stability compares the last "
                f"{self.stable_window_count} windows"
            )
        if self.percentile is not None and not 0 < self.percentile < 100:
            raise PerfkitError("--percentile must be between 0 and 100 (e.g. 99 or 99.9)")
        if self.warmup_request_count < 0:
            raise PerfkitError("--warmup-request-count must not be negative")


@dataclass(frozen=True, slots=True)
class LoadSpec:
    mode: str  # concurrency | request_rate | custom_intervals
    start: float = 1.0
    end: float = 1.0  # 0: increase until latency_threshold_ms
    step: float = 1.0
    distribution: str = "constant"
    intervals_ns: tuple[int, ...] = ()
    latency_threshold_ms: float = 0.0  # 0: no limit
    binary_search: bool = False
    max_outstanding: int = 10_000


@dataclass(frozen=True, slots=True)
class OutputSpec:
    report_dir: Path = Path("reports")
    pa_csv: Path | None = None
    profile_export: Path | None = None
    quiet: bool = False
    html_report: bool = True  # write the HTML report beside the CSV when the sweep ends
    history_csv: Path | None = None  # --append: add the tidy rows, with run id and time, to this file


@dataclass(frozen=True, slots=True)
class MetricsSpec:
    collect: bool = False
    metrics_url: str | None = None
    interval_ms: float = 1000.0


@dataclass(frozen=True, slots=True)
class DistributedSpec:
    """`--workers N [--ray-address ADDR]`: the load from N Ray actors instead of this process."""

    workers: int = 1
    ray_address: str | None = None  # None: a local Ray runtime for the run's duration

    @property
    def enabled(self) -> bool:
        """One worker with no cluster is today's in-process load generator."""
        return self.workers > 1 or self.ray_address is not None


@dataclass(frozen=True, slots=True)
class SweepSpec:
    target: TargetSpec
    load: LoadSpec
    windows: WindowSpec = field(default_factory=WindowSpec)
    inputs: InputSpec = field(default_factory=InputSpec)
    metrics: MetricsSpec = field(default_factory=MetricsSpec)
    output: OutputSpec = field(default_factory=OutputSpec)
    distributed: DistributedSpec = field(default_factory=DistributedSpec)

    def validate(self) -> None:
        load = self.load
        self.target.validate()
        if self.inputs.batch_size < 1:
            raise PerfkitError("-b/--batch-size must be at least 1")
        self.windows.validate()
        if load.end == 0 and load.latency_threshold_ms <= 0:
            raise PerfkitError("a range END of 0 means 'until the latency threshold': pass -l/--latency-threshold MS")
        if load.binary_search and (load.end == 0 or load.latency_threshold_ms <= 0):
            raise PerfkitError("--binary-search needs an explicit range START:END and -l/--latency-threshold MS")
        if self.metrics.interval_ms <= 0:
            raise PerfkitError("--metrics-interval must be a positive number of milliseconds")
        _validate_distributed(self.distributed, self.target)


def _validate_distributed(d: DistributedSpec, t: TargetSpec) -> None:
    if d.enabled and not ray_installed():
        raise PerfkitError(RAY_MISSING)
    if d.workers < 1:
        raise PerfkitError(f"--workers must be at least 1, got {d.workers}")
    if d.ray_address is not None and not d.ray_address.strip():
        raise PerfkitError("--ray-address is empty: give the cluster's HOST:PORT, or drop it for a local runtime")
    if d.ray_address is not None and t.url is None:
        raise PerfkitError(
            "--ray-address: workers on other machines cannot reach the embedded server (it listens on "
            "this machine's loopback); give the server with -u HOST:PORT"
        )
