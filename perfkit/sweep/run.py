"""`perfkit sweep` end to end: pick the target (the embedded server or -u), resolve the model, build
and pre-encode its requests, run the sweep, and keep every finished level on disk."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfkit._version import __version__
from perfkit.analysis.server_stats import ensemble_steps
from perfkit.errors import ExitCode, MissingExtension, PerfkitError, TargetError
from perfkit.genai.endpoints import GenerativeClient
from perfkit.genai.sessions import SessionLoad, is_multi_turn, read_multi_turn, synthetic_conversations
from perfkit.genai.tokenizer import load_tokenizer
from perfkit.genai.trace import read_trace, trace_prompts
from perfkit.genai.workload import build_prompts
from perfkit.load.cluster.distributed import distributed_load
from perfkit.load.fleet import FleetClient, FleetPrepared
from perfkit.load.generator import RealClock
from perfkit.load.inputs import build_requests, build_sequence_streams, has_streams
from perfkit.load.samples import SampleArrays
from perfkit.load.sequences import SequenceLoad, SequenceManager
from perfkit.load.validation import batch_expected, read_validation_data
from perfkit.measure.level import LevelMeasurement
from perfkit.measure.metrics_source import with_server_metrics
from perfkit.measure.resources import ResourceSampler
from perfkit.measure.served import config_needed, describe_models, no_config_note, read_model, ready_models
from perfkit.progress import Progress
from perfkit.report import export, tidy
from perfkit.report.tidy import append_history, check_history
from perfkit.results.files import ReportItem, write_text_atomic
from perfkit.results.model import SweepResult, write_sweep
from perfkit.results.provenance import provenance
from perfkit.sweep.engine import Sweep
from perfkit.sweep.spec import SweepSpec, validate_sequences
from perfkit.target import Target, endpoints_of, open_target
from perfkit.wire.client import InferClient, make_client
from perfkit.wire.prepared import Prepared
from perfkit.wire.shared_memory import check_extension, plan_regions, registered_regions
from v2kit import codec as v2
from v2kit.runtime import eventloop

DEFAULT_EMBEDDED_MODEL = "mlp"
#: What a generative endpoint measures on the embedded server: the simulated engine, whose timing
#: its config.pbtxt states.
DEFAULT_EMBEDDED_GENERATIVE_MODEL = "sim_llm"
#: What `--endpoint-type embeddings` measures there: the ONNX embedder.
DEFAULT_EMBEDDED_EMBEDDING_MODEL = "tiny_embedder"


async def resolve_model(client: InferClient | GenerativeClient, spec: SweepSpec, embedded: bool) -> str:
    if spec.target.model:
        return spec.target.model
    try:
        index = await client.repository_index()
    except Exception as exc:
        raise PerfkitError(f"the server does not list its models ({exc}); name the model with -m") from None
    ready = ready_models(index)
    default = DEFAULT_EMBEDDED_GENERATIVE_MODEL if spec.genai.enabled else DEFAULT_EMBEDDED_MODEL
    if spec.genai.endpoint_type == "embeddings":
        default = DEFAULT_EMBEDDED_EMBEDDING_MODEL
    if embedded and default in ready:
        return default
    if len(ready) == 1:
        return ready[0]
    if not ready and index:  # what it has, and why none can be measured
        raise TargetError(
            f"the server has no ready model: it lists {describe_models(index)}; load one, or pick one with -m"
        )
    raise PerfkitError(f"the server has {len(ready)} ready models ({', '.join(ready) or 'none'}); pick one with -m")


def _generates_text(metadata: dict[str, Any]) -> bool:
    """A generative model by the vLLM and TensorRT-LLM backends' convention: a `text_output`."""
    return any(output.get("name") == "text_output" for output in metadata.get("outputs") or ())


def refuse_without_config(spec: SweepSpec, url: str, missing: MissingExtension) -> None:
    """What a sweep cannot do where the server gives no model configuration: tell a sequence model
    (the sequence flags, sequence streams) or read composing models' configs (--bls-composing-models)."""
    if spec.sequences.enabled or has_streams(spec.inputs.input_data):
        raise config_needed(
            "the sequence flags (--sequence-length, --sequence-id-range, --num-of-sequences, ...) and sequence "
            "streams in --input-data", url, missing, "without it perfkit cannot tell how the model takes sequences: "
            "drop them",
        )  # fmt: skip
    if spec.target.bls_composing_models:
        raise config_needed("--bls-composing-models", url, missing, "drop it")


def _with_parameters(requests: list[v2.InferRequest], spec: SweepSpec) -> list[v2.InferRequest]:
    """The requests with the --request-parameter values."""
    extra = dict(spec.inputs.request_parameters)
    if extra:
        for request in requests:
            request.parameters = {**request.parameters, **extra}
    return requests


def _with_expected(prepared: list[Prepared], spec: SweepSpec, metadata: dict[str, Any]) -> list[Prepared]:
    """The requests with the outputs their answers must hold, when the data file has validation_data:
    request s carries the rows of steps s..s+b-1, so it must answer their expected rows."""
    validation = read_validation_data(spec.inputs.input_data, metadata, streams=False)
    if validation is None:
        return prepared
    if any(isinstance(p, FleetPrepared) for p in prepared):  # each endpoint's request would need them
        raise PerfkitError("validation_data in --input-data is checked over one -u endpoint: give one, not several")
    if spec.distributed.enabled:  # the workers encode their own requests, without the expected outputs
        raise PerfkitError("validation_data in --input-data is not checked with --workers: drop one of them")
    batch, count = spec.inputs.batch_size, len(validation)
    return [
        dataclasses.replace(p, expected=batch_expected([validation[(s + i) % count] for i in range(batch)]))
        for s, p in enumerate(prepared)
    ]


async def _sequence_models(client: InferClient, model: str, config: dict[str, Any], depth: int = 0) -> list[str]:
    """The models behind `model` that have a sequence batcher: itself, or an ensemble's steps."""
    if "sequence_batching" in config:
        return [model]
    steps = config.get("ensemble_scheduling", {}).get("step", []) if depth < 4 else []
    found: list[str] = []
    for step in steps:
        name = str(step.get("model_name", ""))
        version = str(step.get("model_version", "-1"))
        try:
            step_config = await client.model_config(name, "" if version in ("-1", "") else version)
        except Exception:  # the ensemble's own load already checked its steps; nothing more to learn
            continue
        found += await _sequence_models(client, name, step_config, depth + 1)
    return found


async def sequence_load(
    client: InferClient, spec: SweepSpec, model: str, metadata: dict[str, Any], config: dict[str, Any]
) -> SequenceLoad | None:
    """The sequence handling of a sequence model (perfkit.load.sequences), None for another model.
    A sequence model without any sequence flag is refused: its requests need ids and START/END."""
    inputs = spec.inputs
    streams_given = has_streams(inputs.input_data)
    batchers = await _sequence_models(client, model, config)
    if not (spec.sequences.enabled or streams_given):
        if batchers:
            via = "" if batchers == [model] else f" (its step '{batchers[0]}' has one)"
            raise PerfkitError(
                f"model '{model}' is a sequence model (sequence_batching){via}: every request needs a sequence "
                "id and START/END flags. Pass --sequence-length N (perf_analyzer's default is 20), add "
                "--num-of-sequences N with --request-rate-range, or give --input-data with sequence streams"
            )
        return None
    if isinstance(client, FleetClient):
        raise PerfkitError(f"model '{model}' is swept as a sequence model: give one -u, not several")
    seq_spec = dataclasses.replace(spec.sequences, enabled=True)
    validate_sequences(dataclasses.replace(spec, sequences=seq_spec))
    streams, from_data = build_sequence_streams(
        metadata, config, model=model, version=spec.target.model_version,
        shapes={name: list(dims) for name, dims in inputs.shapes}, input_data=inputs.input_data, seed=inputs.seed,
        string_length=inputs.string_length, string_data=inputs.string_data,
    )  # fmt: skip
    extra = dict(inputs.request_parameters)
    validation = read_validation_data(inputs.input_data, metadata, streams=True)
    templates, unchecked = [], []
    for k, stream in enumerate(streams):
        row = []
        for s, step in enumerate(stream):
            template = client.prepare_sequence(dataclasses.replace(step, parameters={**step.parameters, **extra}))
            if validation is not None:
                base = dataclasses.replace(template.base, expected=validation[k][s])
                template = dataclasses.replace(template, base=base)
            row.append(template)
        templates.append(row)
        unchecked.append([dataclasses.replace(t, base=dataclasses.replace(t.base, expected=None)) for t in row])

    def prepare(stream: int, step: int, sequence_id: int, start: bool, end: bool) -> Prepared:
        # A sequence ended early at a level's end (END on a step that is not its stream's last) is
        # answered for flags its validation_data was not written for: it is counted, not checked.
        forced_end = end and step != len(templates[stream]) - 1
        return (unchecked if forced_end else templates)[stream][step].make(sequence_id, start, end)

    manager = SequenceManager(seq_spec, [len(s) for s in streams], inputs.seed, from_data=from_data)
    return SequenceLoad(seq_spec, manager, prepare, inputs.seed)


def session_load(client: GenerativeClient, spec: SweepSpec, model: str) -> SessionLoad:
    """Multi-turn sessions (perfkit.genai.sessions): a multi_turn --input-file's conversations, or
    synthetic ones on the run's prompts; each turn prepared when it is sent, with its history."""
    w = spec.genai.workload
    if w.input_file is not None and is_multi_turn(w.input_file):
        conversations = read_multi_turn(w.input_file, client.tokenizer, w)
    else:
        conversations = synthetic_conversations(spec.genai.sessions, build_prompts(w, client.tokenizer), w.seed)
    return SessionLoad(
        conversations,
        lambda prompt, history, correlation: client.prepare_turn(prompt, model, history, correlation),
        w.seed,
    )


async def composing_models(
    client: InferClient, model: str, config: dict[str, Any], bls: Sequence[tuple[str, str]]
) -> dict[str, tuple[tuple[str, str], ...]]:
    """perf_analyzer's composing-model map (`DetermineComposingModelMap`): --bls-composing-models
    under the measured model, and each ensemble's steps under it, through their configs recursively."""
    found: dict[str, list[tuple[str, str]]] = {}
    visited: set[str] = set()

    async def add_steps(name: str, model_config: dict[str, Any]) -> None:
        visited.add(name)
        for step in ensemble_steps(model_config):
            if step not in found.setdefault(name, []):
                found[name].append(step)
            if step[0] not in visited:
                await add_steps(step[0], await client.model_config(*step))

    for name, version in bls:
        try:
            bls_config = await client.model_config(name, version)
        except Exception as exc:
            raise PerfkitError(f"--bls-composing-models {name}: the server does not give its config ({exc}); "
                               "name models it serves") from None  # fmt: skip
        found.setdefault(model, []).append((name, version))
        await add_steps(name, bls_config)
    await add_steps(model, config)
    return {name: tuple(steps) for name, steps in found.items() if steps}


class SweepFiles:
    """Where a sweep's files go, named by model, load mode, protocol and start time
    (`sweep-mlp-concurrency-grpc-20260101-120000.json`); each finished level rewrites them
    atomically, and `paths()` names only the files actually written."""

    def __init__(self, spec: SweepSpec, model: str) -> None:
        stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        out = spec.output
        try:
            out.report_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise PerfkitError(f"--report-dir {out.report_dir}: cannot create it ({exc.strerror or exc})") from None
        for flag, path in (("-f/--latency-report-file", out.pa_csv), ("--profile-export-file", out.profile_export)):
            if path is not None and not path.parent.is_dir():
                raise PerfkitError(f"{flag} {path}: the folder {path.parent} does not exist")
        name = f"sweep-{model}-{spec.load.mode}-{spec.target.protocol}-{stamp}"
        base = out.report_dir / name
        for suffix in range(2, 1000):  # two sweeps started in the same second keep both results
            if not base.with_suffix(".json").exists():
                break
            base = out.report_dir / f"{name}-{suffix}"
        self.json_path = base.with_suffix(".json")
        self.pa_csv_path = out.pa_csv or base.with_suffix(".csv")
        self.tidy_csv_path = self.pa_csv_path.with_name(self.pa_csv_path.stem + "_long.csv")
        self.html_path = self.pa_csv_path.with_suffix(".html") if out.html_report else None
        self.history_path = out.history_csv
        if self.history_path is not None:
            check_history(self.history_path)
        self.profile_path = out.profile_export
        self.composing_paths: dict[Path, None] = {}  # the composing models' CSVs, in the order written
        self.collect_metrics = spec.metrics.collect
        self.verbose_csv = spec.output.verbose_csv
        self.experiments: list[tuple[str, float, SampleArrays, list[int]]] = []
        self.epoch_offset_ns = time.time_ns() - time.perf_counter_ns()
        self.written: set[Path] = set()

    def _write(self, path: Path, text: str) -> None:
        write_text_atomic(path, text)
        self.written.add(path)

    def save(self, result: SweepResult, measurement: LevelMeasurement | None) -> None:
        write_sweep(result, self.json_path)
        self.written.add(self.json_path)
        pa_csv = export.render_pa_csv(result.levels, collect_metrics=self.collect_metrics, verbose_csv=self.verbose_csv)
        self._write(self.pa_csv_path, pa_csv)
        for model, version, text in export.render_composing_csvs(result.levels):
            path = self.pa_csv_path.with_name(export.composing_csv_name(model, version, self.pa_csv_path.name))
            self._write(path, text)
            self.composing_paths[path] = None
        self._write(self.tidy_csv_path, tidy.render_tidy_csv(result))
        if self.profile_path is not None and measurement is not None:
            level = measurement.result
            if not self.experiments or self.experiments[-1][1] != level.level:
                self.experiments.append(
                    (level.mode, level.level, measurement.samples, list(measurement.window_boundaries_ns))
                )
            self._write(
                self.profile_path,
                export.render_profile_export(
                    self.experiments, version=__version__, epoch_offset_ns=self.epoch_offset_ns
                ),
            )

    def finish(self, result: SweepResult) -> None:
        """Once, when the sweep ends: the HTML report and the history CSV's new rows."""
        self.write_report(result)
        if self.history_path is not None:
            append_history(self.history_path, result, self.json_path.stem)
            self.written.add(self.history_path)

    def write_report(self, result: SweepResult, title: str | None = None) -> None:
        """The HTML report of `result` (unless --no-report)."""
        if self.html_path is not None:
            from perfkit.report.html import render_html  # it loads matplotlib: only when a report is drawn

            item = ReportItem(self.json_path.stem, "sweep", result, str(self.json_path))
            self._write(self.html_path, render_html([item], title=title))

    def paths(self) -> list[Path]:
        """The files written, in the order a person looks for them."""
        paths = [self.pa_csv_path, *self.composing_paths, self.tidy_csv_path, self.json_path]
        paths += [p for p in (self.html_path, self.history_path, self.profile_path) if p is not None]
        return [p for p in paths if p in self.written]


def exit_code(result: SweepResult) -> int:
    """0: done; 1: the sweep could not finish, or a load worker died; 4: requests failed; 3: a level
    is not valid (it never stabilised, or failed another check: too few samples, late sends, a
    saturated client, ...), whatever the endpoint type."""
    if not result.completed:
        return ExitCode.FAILED
    if any(not check.passed for level in result.levels for check in level.checks if check.name == "workers"):
        return ExitCode.FAILED
    if any(level.error_count or level.early_error_count for level in result.levels):
        return ExitCode.ERRORS
    if any(not level.stable or not level.valid for level in result.levels):
        return ExitCode.UNSTABLE
    return ExitCode.OK


@dataclass(slots=True)
class SweepRun:
    """What a sweep produced so far; filled as it goes so an interrupted run can still say."""

    result: SweepResult | None = None
    outputs: SweepFiles | None = None
    failures: tuple[str, ...] = ()  # each distinct failed request's line (engine.Sweep.failures)


def _infer_client(spec: SweepSpec, url: str, protocol: str) -> InferClient:
    """The client of a KServe v2 sweep: one endpoint's, or a fleet over `-u A,B,...`; its HTTP tensor
    formats as `spec.target` has them (binary until settled from the server's extensions)."""
    t = spec.target
    clients = [
        make_client(
            endpoint,
            protocol,
            request_timeout_s=t.request_timeout_s,
            headers=dict(t.headers),
            json_tensors=bool(t.json_tensors),
            binary_outputs=not t.json_outputs,
            connections=t.max_connections,
            tls=t.tls,
            streaming=spec.data_path.streaming,
            compression=t.grpc_compression,
        )
        for endpoint in endpoints_of(url)
    ]
    return clients[0] if len(clients) == 1 else FleetClient(clients)


async def _sweep(spec: SweepSpec, target: Target, progress: Progress, argv: list[str], run: SweepRun) -> None:
    t = spec.target
    client: InferClient | GenerativeClient
    if spec.genai.enabled:
        client = GenerativeClient(
            target.url, spec.genai, load_tokenizer(spec.genai.tokenizer), request_timeout_s=t.request_timeout_s,
            headers=dict(t.headers), connections=t.max_connections,
        )  # fmt: skip
    else:
        client = _infer_client(spec, target.url, target.protocol)
    try:
        try:
            live = await client.live()
        except TargetError:
            raise  # the client's message already says what could not be reached and names -u
        except Exception as exc:
            raise TargetError(f"cannot reach {target.url} over {target.protocol} ({exc}); check -u and -i") from None
        if not live:
            raise TargetError(f"{target.url} answers but is not live")
        model = await resolve_model(client, spec, target.embedded)
        if isinstance(client, GenerativeClient):
            if not spec.target.model and not target.embedded:
                progress.note(f"no -m: measuring '{model}', the only model the server lists (GET /v1/models)")
            await client.check_model(model)
        server = {"url": target.url, "embedded": target.embedded, **await client.server_metadata()}
        target, metrics_note = with_server_metrics(target, server, spec.metrics.collect)
        if metrics_note:
            progress.note(metrics_note)
        if not isinstance(client, GenerativeClient):
            settled, note = t.with_tensor_format(server)
            if note:
                progress.note(note)
            if settled != t:  # the recorded spec, the workers and the client's encoding follow it
                spec, t = dataclasses.replace(spec, target=settled), settled
                if settled.json_tensors or settled.json_outputs:
                    await client.close()
                    client = _infer_client(spec, target.url, target.protocol)
        requests: list[v2.InferRequest] = []
        metadata: dict[str, Any] = {}
        sequences: SequenceLoad | None = None
        composing: dict[str, tuple[tuple[str, str], ...]] = {}
        if not isinstance(client, GenerativeClient):
            served = await read_model(client, model, t.model_version, target.url)
            metadata, config = served.metadata, served.config
            if served.missing is not None:
                refuse_without_config(spec, target.url, served.missing)
                progress.note(no_config_note(target.url, served.missing))
                server["model_config"] = False  # the result says what was unknown
            else:
                assert config is not None
                composing = await composing_models(client, model, config, t.bls_composing_models)
                sequences = await sequence_load(client, spec, model, metadata, config)
            if sequences is None:
                requests = _with_parameters(build_requests(
                    metadata, config, model=model, version=t.model_version, batch_size=spec.inputs.batch_size,
                    shapes={name: list(dims) for name, dims in spec.inputs.shapes}, input_data=spec.inputs.input_data,
                    seed=spec.inputs.seed, string_length=spec.inputs.string_length, string_data=spec.inputs.string_data,
                ), spec)  # fmt: skip
        async with contextlib.AsyncExitStack() as stack:
            prepared: list[Any]
            if isinstance(client, GenerativeClient) and spec.genai.sessions.enabled:
                sequences, prepared = session_load(client, spec, model), []
            elif isinstance(client, GenerativeClient):
                w = spec.genai.workload
                prompts = (
                    trace_prompts(read_trace(w.trace_file), client.tokenizer, w.seed)
                    if w.trace_file is not None
                    else build_prompts(w, client.tokenizer)
                )
                prepared = [client.prepare(prompt, model) for prompt in prompts]
            else:
                if (shm_kind := spec.data_path.shared_memory) != "none":
                    check_extension(server, target.url, shm_kind)
                    outputs_of_model = [str(o.get("name")) for o in metadata.get("outputs") or ()]
                    plan = plan_regions(
                        requests, outputs_of_model, output_size=spec.data_path.output_shared_memory_size,
                        batch_size=spec.inputs.batch_size, prefix=f"perfkit_{os.getpid()}",
                    )  # fmt: skip
                    requests = list(await stack.enter_async_context(registered_regions(client, plan, shm_kind)))
                prepared = [client.prepare(r) for r in requests]
                if sequences is None:
                    prepared = _with_expected(prepared, spec, metadata)
            outputs = run.outputs = SweepFiles(spec, model)
            resources = ResourceSampler(
                interval_s=spec.metrics.interval_ms / 1000,
                metrics_urls=target.metrics_urls if (spec.metrics.collect or target.embedded) else (),
                server_pid=target.server_pid,
            )
            workers = None
            if spec.distributed.enabled:
                workers = await stack.enter_async_context(distributed_load(
                    spec.distributed, url=target.url, target=t, requests=requests,
                    max_outstanding=spec.load.max_outstanding, clock=RealClock(),
                ))  # fmt: skip
                progress.note(workers.describe())
            sweep = Sweep(
                spec, client=client, prepared=prepared, model=model, model_version=t.model_version,
                provenance=provenance(spec, seed=spec.inputs.seed, server=server, argv=argv), clock=RealClock(),
                progress=progress,
                on_level=outputs.save, resources=resources, workers=workers, sequences=sequences,
                composing=composing,
                responses_as_tokens=spec.data_path.streaming and _generates_text(metadata),
            )  # fmt: skip
            keep = True
            try:
                await sweep.run()
            except (asyncio.CancelledError, KeyboardInterrupt):
                keep = bool(sweep.result.levels)  # interrupted before any level ended: no empty files
                raise
            finally:
                run.result, run.failures = sweep.result, tuple(sweep.failures)
                if keep:
                    outputs.save(sweep.result, None)
        outputs.finish(sweep.result)
    finally:
        await client.close()


def _report_interrupted(run: SweepRun, progress: Progress) -> None:
    """Ctrl-C: the HTML report of the levels finished so far, its title and verdict saying the sweep
    was interrupted. A second Ctrl-C skips it; then it is neither written nor named as written."""
    outputs, result = run.outputs, run.result
    if outputs is None or result is None or not result.levels or outputs.html_path is None:
        return
    if outputs.html_path in outputs.written:  # the sweep had ended: its report is the whole one
        return
    finished = f"{len(result.levels)} level{'s' if len(result.levels) > 1 else ''}"
    progress.note(f"interrupted: writing the report of the {finished} finished (Ctrl-C again to skip it)")
    with contextlib.suppress(KeyboardInterrupt):
        outputs.write_report(result, title=f"perfkit report: {result.model} (interrupted after {finished})")


def run_sweep(spec: SweepSpec, argv: list[str]) -> tuple[SweepRun, int]:
    """Run the sweep: what it produced (also when interrupted) and the exit code."""
    spec.validate()
    progress = Progress(quiet=spec.output.quiet, verbose=spec.output.verbose,
                        unit="req/s" if spec.genai.enabled else "infer/s")  # fmt: skip
    run = SweepRun()
    try:
        t, metrics = spec.target, spec.metrics
        with open_target(t.url, t.protocol, metrics_urls=metrics.metrics_urls, genai=spec.genai.enabled) as target:
            if target.embedded:
                progress.note(f"measuring the embedded reference server at {target.url}")
            eventloop.run(_sweep(spec, target, progress, argv, run))
    except KeyboardInterrupt:
        _report_interrupted(run, progress)
        return run, ExitCode.INTERRUPTED
    finally:
        progress.close()
    assert run.result is not None
    return run, exit_code(run.result)
