"""The sweep's settings: one frozen tree built from the command line, validated in one place.

Its parts that other commands share keep their own `validate()` where their code lives: the target
(`perfkit.target.TargetSpec`, with TLS; also tune's and probe's), the measurement windows
(`perfkit.measure.level.WindowSpec`; also tune's) and the Ray workers
(`perfkit.load.distributed.DistributedSpec`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from perfkit.errors import PerfkitError
from perfkit.load.distributed import DistributedSpec
from perfkit.load.ray import RAY_MISSING, ray_installed
from perfkit.measure.level import WindowSpec
from perfkit.target import TargetSpec


@dataclass(frozen=True, slots=True)
class InputSpec:
    batch_size: int = 1
    shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()
    input_data: str = "random"  # random | zero | path to a JSON file
    seed: int = 0


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
    metrics_urls: tuple[str, ...] = ()  # --metrics-url, repeatable
    interval_ms: float = 1000.0


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
    if d.enabled and t.url is not None and "," in t.url:
        raise PerfkitError("--workers sends to one -u endpoint; several (-u A,B) are spread by this process alone")
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
