"""A perf_analyzer-style sweep: measure load levels one after another, linearly or by binary
search, and hand every finished level to the caller at once (so it is on disk before the next)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from perfkit.analysis.server_stats import ComposingMap
from perfkit.analysis.stats import endpoint_figures, reported_windows, token_sample_check
from perfkit.genai.endpoints import OPENAI_ENDPOINT_TYPES, GenerativeClient
from perfkit.genai.goodput import goodput_holds
from perfkit.genai.records import output_length_check, response_tokens, session_figures, token_figures, usage_notes
from perfkit.load.cluster.distributed import DistributedLoadGenerator
from perfkit.load.fleet import FleetClient
from perfkit.load.generator import Clock, LoadGenerator
from perfkit.load.samples import SampleBuffer
from perfkit.load.schedule import ClosedLoop, Load, OpenLoop, linear_levels
from perfkit.load.sequences import SequenceLoad
from perfkit.measure.level import LevelMeasurement, LevelObserver, ServerStatsProbe, observe_level, server_gone
from perfkit.measure.metrics_source import server_label
from perfkit.measure.resources import ResourceSampler
from perfkit.results.model import LevelResult, SweepResult
from perfkit.sweep.spec import SweepSpec
from perfkit.target import BINARY_TENSOR_EXTENSION, lists_extension
from perfkit.wire.replies import FailureLog, failure_line

log = logging.getLogger(__name__)

# An END of 0 means "until the latency threshold"; these bound such a sweep so it stops by itself.
MAX_CONCURRENCY = 4096
MAX_RATE = 1_000_000.0


class SweepObserver(LevelObserver, Protocol):
    """The sweep's progress: its levels, and notes between them."""

    def note(self, text: str) -> None: ...


def stabilizing_latency_us(result: LevelResult) -> float:
    """The latency the threshold (-l) is compared with: --percentile's, else the average."""
    if result.latency.custom_us is not None:
        return result.latency.custom_us
    return result.latency.mean_us


def make_load(spec: SweepSpec, value: float) -> Load:
    load = spec.load
    if load.mode == "concurrency":
        return ClosedLoop(int(value))
    if load.mode == "custom_intervals":
        return OpenLoop(intervals_ns=load.intervals_ns, seed=spec.inputs.seed)
    return OpenLoop(rate=value, distribution=load.distribution, seed=spec.inputs.seed)


def linear_plan(spec: SweepSpec) -> Iterator[float]:
    load = spec.load
    if load.mode == "custom_intervals":
        yield 0.0
        return
    if load.end != 0:
        yield from linear_levels(load.start, load.end, load.step)
        return
    value, cap = load.start, MAX_CONCURRENCY if load.mode == "concurrency" else MAX_RATE
    while value <= cap:
        yield value
        value += load.step


def failure_logs(client: Any) -> list[FailureLog]:
    """The failure logs of a sweep's client, or of each endpoint's in a fleet (none for a generative one)."""
    clients = client.clients if isinstance(client, FleetClient) else [client]
    return [log for c in clients if isinstance(log := getattr(c, "failures", None), FailureLog)]


class Sweep:
    """Runs the levels of one sweep against a prepared client."""

    def __init__(
        self,
        spec: SweepSpec,
        *,
        client: Any,
        prepared: list[Any],
        model: str,
        model_version: str,
        provenance: dict[str, Any],
        clock: Clock,
        progress: SweepObserver,
        on_level: Callable[[SweepResult, LevelMeasurement], None],
        resources: ResourceSampler | None = None,
        workers: DistributedLoadGenerator | None = None,
        sequences: SequenceLoad | None = None,
        composing: ComposingMap | None = None,
        responses_as_tokens: bool = False,
    ) -> None:
        self.spec = spec
        # a generative model streamed over gRPC: its responses give the token figures
        self.responses_as_tokens = responses_as_tokens
        self.client = client
        self.clock = clock
        self.progress = progress
        self.failures: list[str] = []  # each distinct failure's line, the server's words in it, as said
        self._token_notes_said: set[str] = set()  # each kind of records.usage_notes said once
        self.on_level = on_level
        self.resources = resources
        self.workers = workers
        self.sequences = sequences
        self.loadgen: LoadGenerator | DistributedLoadGenerator
        if workers is not None:  # --workers: the load comes from Ray actors, the samples to us
            self.buffer = workers.buffer
            self.loadgen = workers
        else:
            self.buffer = SampleBuffer()
            self.loadgen = LoadGenerator(
                client, prepared, self.buffer, clock, max_outstanding=spec.load.max_outstanding, sequences=sequences
            )
        # With composing models every model's statistics are read, in one response as perf_analyzer does.
        named = () if composing else (model, model_version)
        about = provenance.get("server") or {}  # the server's metadata: its name, and does it list statistics
        # An OpenAI-compatible endpoint has no statistics extension by design: nothing to ask or to say.
        openai = spec.genai.enabled and spec.genai.endpoint_type in OPENAI_ENDPOINT_TYPES
        self.binary_listed = bool(lists_extension(about, BINARY_TENSOR_EXTENSION))
        self.server = None if openai else ServerStatsProbe(
            lambda: client.model_statistics(*named), model, model_version, composing,
            server=server_label(about), offered=lists_extension(about, "statistics"),
        )  # fmt: skip
        self.result = SweepResult(
            model=model,
            model_version=model_version,
            url=client.url,
            protocol=client.protocol,
            mode=spec.load.mode,
            levels=(),
            provenance=provenance,
        )

    async def run(self) -> SweepResult:
        if self.resources is not None:
            await self.resources.start()
        try:
            if self.spec.load.binary_search:
                await self._binary_search()
            else:
                await self._linear()
        except BaseException as exc:
            # asyncio.run turns Ctrl-C into a cancellation of this task (KeyboardInterrupt comes after).
            interrupted = isinstance(exc, (KeyboardInterrupt, asyncio.CancelledError))
            reason = "interrupted" if interrupted else f"{type(exc).__name__}: {exc}"
            self.result = dataclasses.replace(self.result, completed=False, stop_reason=reason)
            raise
        finally:
            if self.resources is not None:
                await self.resources.stop()
        return self.result

    async def _measure(self, value: float) -> LevelResult | None:
        """Measure one level; None when the sweep must stop (the server is gone)."""
        spec = self.spec
        measurement = await observe_level(
            self.progress, self.loadgen, make_load(spec, value), spec.windows_at(value), batch_size=spec.inputs.batch_size,
            server=self.server, resources=self.resources, drain_timeout_s=spec.target.request_timeout_s + 5,
            finish=self._keep,
        )  # fmt: skip
        level = measurement.result
        self._say_failures()
        if server_gone(level.errors, level.ok_count + level.late_ok_count):
            kinds = ", ".join(f"{k} ×{n}" for k, n in level.errors.items())
            self.result = dataclasses.replace(
                self.result, completed=False, stop_reason=f"the server stopped answering ({kinds})"
            )
            self.on_level(self.result, measurement)
            return None
        if self.workers is not None:
            return self._after_worker_deaths(level, measurement)
        return level

    def _say_failures(self) -> None:
        """Each failure not said yet, once: its kind, the server's own text, the flag that may help."""
        t = self.spec.target
        for log in failure_logs(self.client):
            for kind, text in log.unsaid():
                line = failure_line(kind, text, protocol=t.protocol, binary_inputs=not t.json_tensors,
                                    binary_outputs=not t.json_outputs, binary_listed=self.binary_listed)  # fmt: skip
                if line not in self.failures:
                    self.failures.append(line)
                    self.progress.note(f"requests failed: {line}")

    def _keep(self, measurement: LevelMeasurement) -> LevelMeasurement:
        """The level with its load workers' or endpoints' figures, in the result and on disk before
        it is reported."""
        if self.workers is not None:
            stable = self.spec.windows.stable_window_count
            annotated = self.workers.annotate(measurement.result, measurement.samples, stable)
            measurement = dataclasses.replace(measurement, result=annotated)
        if self.spec.genai.enabled or self.responses_as_tokens:
            measurement = dataclasses.replace(measurement, result=self._with_tokens(measurement))
        if isinstance(self.client, FleetClient):
            measurement = dataclasses.replace(measurement, result=self._with_endpoints(measurement.result))
        self.result = self.result.with_level(measurement.result)
        self.on_level(self.result, measurement)
        return measurement

    def _with_tokens(self, measurement: LevelMeasurement) -> LevelResult:
        """The level with its token figures (over its reported windows) and the output-length check."""
        level, genai, samples = measurement.result, self.spec.genai, measurement.samples
        if self.responses_as_tokens:
            genai, samples = dataclasses.replace(genai, streaming=True, tokenizer="responses"), response_tokens(samples)
        reported = level.windows[-self.spec.windows.stable_window_count :]
        figures = token_figures(samples, reported, genai)
        if isinstance(self.client, GenerativeClient):
            source, notes = usage_notes(self.client.take_tally(), genai)
            figures = dataclasses.replace(figures, token_source=source, token_notes=tuple(notes.values()))
            for kind in notes.keys() - self._token_notes_said:
                self.progress.note(notes[kind])
            self._token_notes_said |= notes.keys()
        check = output_length_check(figures, genai.exact_output)
        checks = level.checks if check is None else (*level.checks, check)
        sessions = (
            session_figures(self.buffer.sessions(), reported)
            if self.sequences is not None and self.sequences.chained
            else None
        )
        level = dataclasses.replace(level, tokens=figures, sessions=sessions)
        # judged on its per-request token figures, not on a request p99 (stats.token_sample_check)
        samples_check = token_sample_check(level)
        checks = tuple(samples_check if c.name == "sample_count" else c for c in checks)
        return dataclasses.replace(level, checks=checks)

    def _with_endpoints(self, level: LevelResult) -> LevelResult:
        """Each endpoint's share of the reported windows; a note for one that answered nothing."""
        assert isinstance(self.client, FleetClient)
        reported = reported_windows(level.windows, self.spec.windows.stable_window_count)
        if not reported:
            return level
        start, end = reported[0].start_ns, reported[-1].end_ns
        figures = tuple(
            endpoint_figures(url, buffer.arrays(), start, end, level.batch_size, self.spec.windows.percentile)
            for url, buffer in zip(self.client.urls, self.client.buffers)
        )
        for e in figures:
            if e.request_count and not e.ok_count:
                kinds = ", ".join(f"{kind} ×{count}" for kind, count in sorted(e.errors.items()))
                self.progress.note(f"endpoint {e.url} answered none of its {e.request_count} requests ({kinds})")
        return dataclasses.replace(level, endpoints=figures)

    def _after_worker_deaths(self, level: LevelResult, measurement: LevelMeasurement) -> LevelResult | None:
        """Say which workers died in the level; None (the sweep ends) when none is left."""
        assert self.workers is not None
        failed = [check for check in level.checks if check.name == "workers" and not check.passed]
        if not failed:
            return level
        left = len(self.workers.alive)
        self.progress.note(failed[0].detail)
        if left == 0:
            self.result = dataclasses.replace(self.result, completed=False, stop_reason="every load worker died")
            self.on_level(self.result, measurement)
            return None
        self.progress.note(f"going on with {left} load worker(s)")
        return level

    def _within_bound(self, level: LevelResult) -> bool:
        """What the binary search bisects on: -l, or without it --goodput's attainment."""
        genai = self.spec.genai
        if genai.goodput and self.spec.load.latency_threshold_ms <= 0:
            return goodput_holds(level, genai.attainment_pct)
        return self._meets_threshold(level)

    def _meets_threshold(self, level: LevelResult) -> bool:
        threshold_ms = self.spec.load.latency_threshold_ms
        return threshold_ms <= 0 or stabilizing_latency_us(level) <= threshold_ms * 1000

    async def _linear(self) -> None:
        for value in linear_plan(self.spec):
            level = await self._measure(value)
            if level is None:
                return
            if not self._meets_threshold(level):
                self.progress.note(
                    f"latency {stabilizing_latency_us(level) / 1000:.2f} ms passed -l "
                    f"{self.spec.load.latency_threshold_ms:g} ms at level {level.level:g}: stopping"
                )
                return

    async def _binary_search(self) -> None:
        """perf_analyzer's binary search: the highest level within -l (or at which --goodput holds),
        to a precision of STEP."""
        load = self.spec.load
        integer = load.mode == "concurrency"
        low, high = load.start, load.end
        first = await self._measure(low)
        if first is None or not self._within_bound(first):
            return
        last = await self._measure(high)
        if last is None or self._within_bound(last):
            return
        while high - low > load.step:
            mid = (low + high) / 2
            if integer:
                mid = float(int(mid))
                if mid in (low, high):
                    break
            level = await self._measure(mid)
            if level is None:
                return
            if self._within_bound(level):
                low = mid
            else:
                high = mid
