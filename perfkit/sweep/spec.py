"""The sweep's settings: one frozen tree built from the command line, validated in one place.

Its parts that other commands share keep their own `validate()` where their code lives: the target
(`perfkit.target.TargetSpec`, with TLS; also tune's and probe's), the measurement windows
(`perfkit.measure.level.WindowSpec`; also tune's) and the Ray workers
(`perfkit.load.cluster.distributed.DistributedSpec`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

from perfkit.analysis.stats import (
    GENERATIVE_PERCENTILE,
    GENERATIVE_REQUESTS_PER_SLOT,
    GENERATIVE_WINDOW_REQUESTS,
    GENERATIVE_WINDOW_S,
    min_requests_for_percentile,
)
from perfkit.errors import PerfkitError
from perfkit.genai.workload import GenerativeSpec
from perfkit.load.cluster.distributed import DistributedSpec
from perfkit.load.cluster.runtime import RAY_MISSING, ray_installed
from perfkit.load.sequences import SequenceSpec
from perfkit.measure.level import WindowSpec
from perfkit.target import TargetSpec
from perfkit.wire.shared_memory import cuda_unsupported


@dataclass(frozen=True, slots=True)
class InputSpec:
    batch_size: int = 1
    shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()
    input_data: str = "random"  # random | zero | path to a JSON file
    seed: int = 0
    string_length: int = 128
    string_data: str | None = None
    request_parameters: tuple[tuple[str, bool | int | str], ...] = ()  # --request-parameter, typed


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
    verbose: int = 0  # -v: every window's line and each level's checks on the console
    verbose_csv: bool = False  # --verbose-csv: perf_analyzer's extra -f columns (and the GPU ones with metrics)


@dataclass(frozen=True, slots=True)
class MetricsSpec:
    collect: bool = False
    metrics_urls: tuple[str, ...] = ()  # --metrics-url, repeatable
    interval_ms: float = 1000.0


@dataclass(frozen=True, slots=True)
class DataPathSpec:
    """How requests travel (perf_analyzer's flags): over gRPC streams, and with tensors in shared memory."""

    streaming: bool = False  # --streaming
    shared_memory: str = "none"  # --shared-memory none | system | cuda
    output_shared_memory_size: int = 102_400  # --output-shared-memory-size BYTES, per output and batch item

    def validate(self, target: TargetSpec, workers: int) -> None:
        if self.streaming and target.protocol != "grpc":
            raise PerfkitError("--streaming is for -i grpc (Triton streams over gRPC's ModelStreamInfer); add -i grpc")
        if self.shared_memory not in ("none", "system", "cuda"):
            raise PerfkitError(f"--shared-memory must be none, system or cuda, got '{self.shared_memory}'")
        if self.shared_memory == "cuda" and (why := cuda_unsupported()) is not None:
            raise PerfkitError(why)
        if self.output_shared_memory_size <= 0:
            raise PerfkitError("--output-shared-memory-size must be a positive number of bytes")
        if workers > 1 and (self.streaming or self.shared_memory != "none"):
            raise PerfkitError("--streaming and --shared-memory send from this process only; drop --workers")


@dataclass(frozen=True, slots=True)
class SweepSpec:
    target: TargetSpec
    load: LoadSpec
    windows: WindowSpec = field(default_factory=WindowSpec)
    inputs: InputSpec = field(default_factory=InputSpec)
    metrics: MetricsSpec = field(default_factory=MetricsSpec)
    output: OutputSpec = field(default_factory=OutputSpec)
    distributed: DistributedSpec = field(default_factory=DistributedSpec)
    data_path: DataPathSpec = field(default_factory=DataPathSpec)
    genai: GenerativeSpec = field(default_factory=GenerativeSpec)
    sequences: SequenceSpec = field(default_factory=SequenceSpec)
    # No window flag was given (-p, --measurement-mode, --measurement-request-count): a generative
    # sweep then sizes count windows per level (`windows_at`).
    auto_windows: bool = False

    def windows_at(self, level: float) -> WindowSpec:
        """The windows that measure `level`: the spec's own, or a generative sweep's default."""
        if not (self.auto_windows and self.genai.enabled) or self.windows.request_limit:
            return self.windows
        return generative_windows(self.windows, self.load.mode, level)

    def validate(self) -> None:
        load = self.load
        self.target.validate()
        if "," in (self.target.url or "") and (
            self.data_path.streaming or self.data_path.shared_memory != "none" or self.sequences.enabled
            or self.genai.enabled
        ):  # fmt: skip
            raise PerfkitError(
                "several -u endpoints take unary tensor requests: give one -u for --streaming, --shared-memory, "
                "the sequence flags or --endpoint-type"
            )
        if self.inputs.batch_size < 1:
            raise PerfkitError("-b/--batch-size must be at least 1")
        self.windows.validate()
        if load.end == 0 and load.latency_threshold_ms <= 0:
            raise PerfkitError("a range END of 0 means 'until the latency threshold': pass -l/--latency-threshold MS")
        if load.binary_search and (load.end == 0 or (load.latency_threshold_ms <= 0 and not self.genai.goodput)):
            raise PerfkitError(
                "--binary-search needs an explicit range START:END and -l/--latency-threshold MS "
                "(or --goodput, for generative endpoints)"
            )
        if self.metrics.interval_ms <= 0:
            raise PerfkitError("--metrics-interval must be a positive number of milliseconds")
        _validate_distributed(self.distributed, self.target)
        if not self.genai.enabled:  # a generative endpoint streams over HTTP (server-sent events)
            self.data_path.validate(self.target, self.distributed.workers)
        _validate_generative(self.genai, self)
        _validate_request_count(self)
        if self.sequences.enabled:
            validate_sequences(self)


def generative_windows(windows: WindowSpec, mode: str, level: float) -> WindowSpec:
    """Count windows sized for a generative level (stats.GENERATIVE_WINDOW_*), large enough too for three
    windows to reach the judged percentile's sample count (stats.token_sample_check)."""
    percentile = windows.percentile or GENERATIVE_PERCENTILE
    needed = math.ceil(min_requests_for_percentile(percentile) / windows.stable_window_count)
    by_load = GENERATIVE_REQUESTS_PER_SLOT * level if mode == "concurrency" else GENERATIVE_WINDOW_S * level
    count = max(GENERATIVE_WINDOW_REQUESTS, needed, math.ceil(by_load))
    return dataclasses.replace(windows, mode="count_windows", request_count=count)


def _validate_generative(g: GenerativeSpec, spec: SweepSpec) -> None:
    g.validate()
    if not g.enabled:
        return
    kind = f"--endpoint-type {g.endpoint_type}"
    if spec.target.protocol != "http":
        raise PerfkitError(f"{kind} speaks HTTP: drop -i grpc")
    if spec.distributed.enabled:
        raise PerfkitError(f"{kind}: --workers sends tensor requests only; drop --workers")
    if spec.inputs.batch_size != 1:
        raise PerfkitError(f"{kind}: one prompt per request; drop -b/--batch-size")
    if spec.data_path.shared_memory != "none":
        raise PerfkitError(f"{kind} sends JSON prompts, not tensors: drop --shared-memory")
    if g.sessions.enabled and spec.sequences.enabled:
        raise PerfkitError("the sequence flags are for sequence models (--endpoint-type kserve-infer); a generative "
                           "session's turns are set by --conversation-turn-*: drop the sequence flags")  # fmt: skip


def _validate_request_count(spec: SweepSpec) -> None:
    """perf_analyzer's rules for --request-count: one level, at least one request per slot."""
    count, load = spec.windows.request_limit, spec.load
    if not count:
        return
    if load.end != load.start or load.binary_search:
        raise PerfkitError("--request-count measures one level: give --concurrency-range or --request-rate-range START")
    if spec.distributed.enabled:
        raise PerfkitError("--request-count is not supported with --workers")
    if load.mode == "concurrency" and count < load.start:
        raise PerfkitError(f"--request-count {count} is less than the concurrency {int(load.start)}")
    if load.mode == "request_rate" and count < int(load.start):
        raise PerfkitError(f"--request-count {count} is less than the request rate {load.start:g}")


def validate_sequences(spec: SweepSpec) -> None:
    """The sequence flags' rules, and how they combine with the rest of the sweep."""
    seq, load = spec.sequences, spec.load
    seq.validate()
    if spec.data_path.streaming or spec.data_path.shared_memory != "none":
        raise PerfkitError("sequences are sent as unary requests: drop --streaming and --shared-memory")
    if spec.inputs.batch_size > 1:
        raise PerfkitError("sequence models do not support batching: drop -b (or pass -b 1) with the sequence flags")
    if spec.distributed.enabled:
        raise PerfkitError("--workers does not run sequences yet: drop --workers, or the sequence flags")
    if load.mode == "concurrency":
        seq.check_slots(int(max(load.start, load.end)), "--concurrency-range")
    else:
        seq.check_slots(seq.num_of_sequences, "--num-of-sequences")


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
