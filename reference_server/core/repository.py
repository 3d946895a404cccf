"""The model repository: Triton's layout on disk, and the models loaded from it.

`<root>/<model>/config.pbtxt` (optional: completed by the backend; `model_source` reads it and picks
the backend from the model file) and numeric version folders `<root>/<model>/<version>/model.onnx`
(or `model.py`). Loading a model builds every version its version_policy
selects, each with its instances (warmed up), scheduler and statistics; a model that fails to load
is recorded as UNAVAILABLE with the reason and never stops the others.

Reloading without dropping requests: a (re)load builds the new versions completely (sessions and
warmup in a worker thread, schedulers on the loop) while the old ones keep serving, then swaps
`record.versions` in one assignment on the event loop. `get` and the scheduler's admission check
both run on the loop with no await between them (see `DataPlane.infer`), so every request either
enters an old scheduler before it starts closing or sees the new versions: none is told "not
ready". Replaced versions close in the background with a grace period, and requests already queued
on them finish there. A failed load swaps nothing: the old versions and the READY state stay, and
the reason is recorded for the index. Loads of one model serialize on its lock; different models
load in parallel. Each load attempt records the model folder's fingerprint (`model_source.model_fingerprint`),
which poll mode (`poller`) compares with the folder now.

An ensemble (`platform: "ensemble"`) has no model file and no instances: `ensemble.loading` checks
it, loading its composing models first, and it serves through an `ensemble.EnsembleScheduler`. It
is ready while its composing models are. After a model (re)loads, the ensembles that use it load
again, as in Triton: one that no longer fits the model's new config stops serving, with the reason.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from reference_server import errors
from reference_server.backends import close_instances, instance_factory, why_no_gpu
from reference_server.backends.context import BackendContext, ModelCall, ModelControl
from reference_server.backends.custom_metrics import CustomMetrics
from reference_server.backends.placement import gpu_memory_delta, plan_instances
from reference_server.backends.warmup import run_warmup
from reference_server.core import model_config
from reference_server.core.classification import read_labels
from reference_server.core.ensemble.config import is_ensemble
from reference_server.core.ensemble.loading import prepare_ensemble
from reference_server.core.ensemble.scheduler import EnsembleScheduler
from reference_server.core.load_outcome import VersionFailed, index_entries, versions_failed
from reference_server.core.model_source import (
    Fingerprint,
    config_path,
    fill_backend,
    model_fingerprint,
    read_model_config,
)
from reference_server.core.model_version import ModelVersion, PreparedVersion, start_version
from reference_server.core.namespaces import Namespaces, load_each
from reference_server.core.repository_roots import RepositoryRoots
from reference_server.core.response_cache import ResponseCache, cached, check_cache_config
from reference_server.errors import InternalError, InvalidArgument, ModelConfigError, NotFound, ServerError, Unavailable
from reference_server.scheduling.execute import Tensors
from reference_server.scheduling.rate_limiter import RateLimiter
from reference_server.scheduling.stats import ModelStats

log = logging.getLogger(__name__)

READY = "READY"
UNAVAILABLE = "UNAVAILABLE"
LOADING = "LOADING"
UNLOADING = "UNLOADING"

#: Replaced and unloaded versions get this long to finish the requests queued on them.
RETIRE_GRACE_S = 30.0


@dataclass(slots=True)
class ModelRecord:
    name: str
    state: str = UNAVAILABLE
    reason: str = ""
    versions: dict[int, ModelVersion] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: The model folder as the last load attempt read it; None after an unload.
    fingerprint: Fingerprint | None = None
    #: The config the last load was given in place of config.pbtxt (the load API's override), and
    #: the folder of the files it was given (its `file:` overrides), if any.
    override: mc.ModelConfig | None = None
    source: Path | None = None
    #: For an ensemble, the composing models its last load attempt named.
    composing: frozenset[str] = frozenset()
    #: Version -> why it is not served, where the last load failed at a version (`load_outcome`)
    #: or the model was unloaded ("unloaded"); the index lists each, and a request gets Triton's 404.
    failed: dict[int, str] = field(default_factory=dict)
    #: What a request is told while the model serves nothing after a failed load or an unload:
    #: Triton's 404 words. "" while it loads, or was never loaded (our 503).
    not_found: str = ""


class ModelRepository:
    def __init__(
        self,
        root: Path,
        *,
        gpu_count: int = 0,
        default_max_batch_size: int = 4,
        backend_config: Mapping[str, str] | None = None,
        auto_complete_config: bool = True,
        model_config_name: str | None = None,
        more_roots: Sequence[Path] = (),
        namespacing: bool = False,
    ) -> None:
        #: The repositories (--model-repository given more than once: `more_roots`); `root` is the first.
        self.roots = RepositoryRoots([root, *more_roots])
        #: --model-namespacing true: records are keyed as `namespaces` says; None: by model name.
        self.namespaces = Namespaces(self.roots) if namespacing else None
        self.root = self.roots.paths[0]
        self.backend_config = dict(backend_config or {})
        #: Off (--disable-auto-complete-config): a model needs its config file, which backends leave as is.
        self.auto_complete = auto_complete_config
        self.model_config_name = model_config_name  # --model-config-name: <model>/configs/NAME.pbtxt
        #: How a model calls another (python BLS); the data plane fills them in, validating as for a client.
        self.call_model: Callable[[ModelCall], Awaitable[Tensors]] | None = None
        self.stream_model: Callable[[ModelCall], AsyncIterator[tuple[Tensors | None, bool]]] | None = None
        #: The custom metric families and the repository API as models reach them (the data plane's).
        self.custom_metrics: CustomMetrics | None = None
        self.model_control: ModelControl | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.response_cache: ResponseCache | None = None  # --cache-config; None: no cache
        self.rate_limiter: RateLimiter | None = None  # --rate-limit execution_count; None: off
        #: Each version's statistics (summaries.SummarizedStats with --metrics-config summary_latencies=true).
        self.new_stats: Callable[[], ModelStats] = ModelStats
        self.gpu_count = gpu_count
        self.default_max_batch_size = default_max_batch_size
        self._records: dict[str, ModelRecord] = {}
        self._retired: set[asyncio.Task[None]] = set()
        #: Models `load_all` has tried to load in its current call; None outside one.
        self._load_pass: set[str] | None = None

    # --- discovery -------------------------------------------------------------------------------

    def model_names(self) -> list[str]:
        """Models present on disk: every non-hidden folder of the repositories."""
        return self.namespaces.model_names() if self.namespaces else self.roots.model_names()

    def on_disk(self, name: str) -> bool:
        """Whether `name` is a model folder of the repository (names that would leave it are not)."""
        return bool(self.roots.holders(name)) or (self.namespaces is not None and self.namespaces.on_disk(name))

    def model_dir(self, name: str) -> Path:
        """The folder of model `name`; names that would leave the repository are not models."""
        return self.namespaces.folder(name) if self.namespaces else self.roots.model_dir(name)

    def resolve_load_models(self, requested: Iterable[str]) -> list[str]:
        """The models `--load-model` names ('*' means all of them), in order, without repeats.

        A name that is not in the repository is an error, as in tritonserver, which exits when a
        model it was told to load fails.
        """
        requested = list(requested)
        on_disk = self.model_names()
        if "*" in requested:
            return on_disk
        for name in requested:
            if not self.on_disk(name):
                raise NotFound(
                    f"--load-model '{name}': model '{name}' is not in {self.roots} "
                    f"(models there: {', '.join(on_disk) or 'none'})"
                )
        return list(dict.fromkeys(requested))

    def fingerprint(self, name: str) -> Fingerprint | None:
        """The model folder as its last load attempt saw it; None if never loaded or unloaded."""
        record = self._records.get(name)
        return None if record is None else record.fingerprint

    def source(self, name: str) -> Path | None:
        """The folder of the load API's `file:` overrides that `name` was last loaded from; None for its own."""
        record = self._records.get(name)
        return None if record is None else record.source

    def known(self) -> list[str]:
        """Models that were loaded or asked to load and not unloaded since."""
        return sorted(name for name, record in self._records.items() if record.fingerprint is not None)

    # --- loading ---------------------------------------------------------------------------------

    async def load(self, name: str, override: mc.ModelConfig | None = None, *, source: Path | None = None) -> None:
        """Load (or reload) `name`, from its folder in the repository or else from `source` (the load
        API's `file:` overrides). A failed load raises and leaves any serving versions in place."""
        if source is None and not self.on_disk(name):
            # Checked before a record exists, so that a typo never shows up in the index.
            raise NotFound(errors.load_failed(name, f"model '{name}' is not in {self.roots}"))
        if self.namespaces is not None and source is None and (keys := self.namespaces.keys(name)) and keys != [name]:
            return await load_each(keys, functools.partial(self.load, override=override))
        if source is None and self.namespaces is None and not self.roots.unique(name):  # never loaded; Triton's 500
            raise InternalError(errors.load_failed(name, self.roots.not_unique(name)))
        record = self._records.setdefault(name, ModelRecord(name))
        self._loop = asyncio.get_running_loop()
        if self._load_pass is not None:
            self._load_pass.add(name)
        async with record.lock:
            if not record.versions:
                record.state, record.reason = LOADING, ""
            loop, polled = asyncio.get_running_loop(), False  # polled: its config has been read
            try:
                # Before reading anything, so that a change made while we load is seen by the next
                # poll, and before any check, so that a model refused for good is not retried.
                folder = source or (self.model_dir(name) if self.namespaces else self.roots.folder(name))
                record.fingerprint = await loop.run_in_executor(None, model_fingerprint, folder)
                model_dir = source or self.model_dir(name)
                shown = self.namespaces.split(name)[1] if self.namespaces else name  # the config's name
                given, config_name = override, None if source else self.model_config_name
                if given is None:
                    given = read_model_config(model_dir, config_name=config_name, auto_complete=self.auto_complete)
                    if given is not None and given.name and given.name != shown:
                        # Triton's poll refuses it before anything is loaded, in these words.
                        raise ModelConfigError(
                            f"unexpected directory name '{shown}' for model '{given.name}', directory name "
                            f"must equal model name ({config_path(model_dir, config_name)})"
                        )
                raw = fill_backend(given, model_dir)
                if self.namespaces is not None and raw is not None and is_ensemble(raw):
                    raw = self.namespaces.resolve_steps(name, raw)
                polled = True
                record.composing = (
                    frozenset(step.model_name for step in raw.ensemble_scheduling.step) if raw else frozenset()
                )
                if is_ensemble(raw):
                    assert raw is not None
                    versions = await self._load_ensemble(shown, model_dir, raw)
                else:
                    # Sessions and warmup take long: build them off the loop, schedulers on it.
                    prepared = await loop.run_in_executor(None, self._prepare_versions, shown, model_dir, raw)
                    versions = await self._start_versions(prepared)
            except asyncio.CancelledError:
                # The caller gave up (server stopping); the half-built versions are dropped.
                if not record.versions:
                    record.state, record.reason = UNAVAILABLE, "load cancelled"
                raise
            except VersionFailed as exc:
                if not record.versions:
                    record.state = UNAVAILABLE
                record.reason, record.failed = exc.reason, exc.failed
                record.not_found = errors.no_available_versions(name)
                log.info("failed to load '%s'", name)
                raise ModelConfigError(errors.load_failed(name, exc.message, polled=True)) from exc
            except Exception as exc:
                # Whatever served before keeps serving, and keeps its state.
                if not record.versions:
                    record.state = UNAVAILABLE
                record.reason = str(exc) if isinstance(exc, ServerError) else f"{type(exc).__name__}: {exc}"
                record.failed = {}
                record.not_found = errors.no_available_versions(name) if polled else errors.unknown_model(name)
                log.error("failed to load '%s': %s", name, exc, exc_info=not isinstance(exc, ServerError))
                kind = type(exc) if isinstance(exc, ServerError) else ModelConfigError
                raise kind(errors.load_failed(name, record.reason, polled=polled)) from exc
            if self.namespaces is not None:
                self.namespaces.label(name, versions.values())
            old = record.versions
            record.versions = versions
            record.state, record.reason, record.failed, record.not_found = READY, "", {}, ""
            record.override, record.source = override, source
            self._retire(old.values())
            log.info("loaded model '%s' versions %s", name, sorted(versions))
        await self._reload_dependents(name)

    async def _start_versions(self, prepared: list[PreparedVersion]) -> dict[int, ModelVersion]:
        versions: dict[int, ModelVersion] = {}
        try:
            for p in prepared:
                versions[p.version] = start_version(p, self.response_cache, self.rate_limiter, self.new_stats())
        except BaseException:
            # Nothing was served from them: stop their worker threads now.
            await asyncio.gather(*(mv.close(0) for mv in versions.values()))
            for p in prepared:
                if p.version not in versions:
                    close_instances(p.instances)
            raise
        return versions

    async def load_all(self, names: Iterable[str] | None = None) -> None:
        """Load several models; failures are recorded per model and logged, never raised.

        An ensemble loads its composing models first; a model that an ensemble already loaded (or
        failed to) in this call is not loaded again.
        """
        self._load_pass = set()
        try:
            for name in self.model_names() if names is None else names:
                if name in self._load_pass:
                    continue
                try:
                    await self.load(name)
                except ServerError:
                    pass
        finally:
            self._load_pass = None

    # --- ensembles (see `ensemble.loading`) -------------------------------------------------------

    async def _load_ensemble(self, name: str, model_dir: Path, raw: mc.ModelConfig) -> dict[int, ModelVersion]:
        prepared = await prepare_ensemble(self, name, model_dir, raw)
        config = prepared.config
        check_cache_config(config)
        versions = {}
        for version in prepared.versions:
            stats = self.new_stats()
            scheduler = EnsembleScheduler(prepared.plan, config.max_batch_size, stats, self.get, prepared.decoupled)
            versions[version] = ModelVersion(
                name=name,
                version=version,
                config=config,
                instances=(),
                scheduler=cached(scheduler, self.response_cache, config, stats, version),
                stats=stats,
                inputs={i.name: i for i in config.input},
                outputs={o.name: o for o in config.output},
                composing=prepared.composing,
            )
        return versions

    def serving(self, name: str) -> bool:
        record = self._records.get(name)
        return record is not None and bool(record.versions)

    def failed_in_pass(self, name: str) -> str | None:
        record = self._records.get(name)
        if record is None or self._load_pass is None or name not in self._load_pass:
            return None
        return record.reason

    async def _reload_dependents(self, name: str) -> None:
        """Load again the ensembles that use `name`, now that it (re)loaded, as Triton does: one that
        no longer fits stops serving, with the reason; one that fits again serves again. Ensembles
        loading now (`name` may be loading as their dependency) check it themselves."""
        dependents = [
            other
            for other, record in self._records.items()
            if name in record.composing and record.fingerprint is not None and not record.lock.locked()
        ]
        for dependent in dependents:
            record = self._records[dependent]
            if record.lock.locked():
                continue  # another dependent's reload loads it already
            try:
                await self.load(dependent, record.override, source=record.source)
            except ServerError as exc:
                async with record.lock:
                    old = record.versions
                    record.versions = {}
                    record.state = UNAVAILABLE
                    record.reason = f"composing model '{name}' was reloaded and the ensemble no longer fits: {exc}"
                    self._retire(old.values())
                log.error("ensemble '%s' stops serving: %s", dependent, record.reason)

    async def unload(self, name: str, *, unload_dependents: bool = False) -> None:
        """Unload `name`; with `unload_dependents`, also the ensembles that use it (Triton's
        unload parameter). Without it those ensembles stay loaded but not ready."""
        if self.namespaces is not None and (keys := self.namespaces.keys(name)) and keys != [name]:
            for key in keys:  # every repository's copy, as Triton unloads every identifier of the name
                await self.unload(key, unload_dependents=unload_dependents)
            return
        if unload_dependents:
            for dependent in self._dependents(name):
                await self.unload(dependent, unload_dependents=True)
        record = self._records.get(name)
        if record is None:
            return  # Triton 2.51 answers success for a model it has not loaded (on disk or not), and lists it as before
        if not record.versions and record.failed:
            record.fingerprint = None  # nothing to unload: the failure stays in the index, as in Triton
            return
        async with record.lock:
            old = record.versions
            record.versions = {}
            record.state, record.reason = UNAVAILABLE, "unloaded"
            record.failed = dict.fromkeys(old, "unloaded")  # each version listed so, as Triton lists them
            record.not_found = record.not_found or errors.no_available_versions(name)
            record.fingerprint = None
            self._retire(old.values())
        log.info("unloaded model '%s'", name)

    def _dependents(self, name: str) -> list[str]:
        """The loaded ensembles with a step on `name`."""
        return [
            other
            for other, record in self._records.items()
            if any(model == name for mv in record.versions.values() for model, _ in mv.composing)
        ]

    def _prepare_versions(self, name: str, model_dir: Path, raw: mc.ModelConfig | None) -> list[PreparedVersion]:
        config_file = config_path(model_dir, self.model_config_name)
        base = mc.ModelConfig()
        if raw is not None:
            base.CopyFrom(raw)
        if not base.name:
            base.name = name
        available = model_config.available_versions(model_dir)
        selected = model_config.select_versions(base, available)
        if not selected:
            raise ModelConfigError(
                f"at least one version must be available under the version policy of model '{name}' ({model_dir}: "
                f"version folders found: {available or 'none'}; a version is a numeric folder holding the model file)"
            )
        prepared: list[PreparedVersion] = []
        failed: dict[int, Exception] = {}
        try:
            for version in selected:  # each one, as Triton tries each (and tells each failure)
                try:
                    prepared.append(self._prepare_version(name, version, model_dir, config_file, base))
                except Exception as exc:
                    failed[version] = exc
            if failed:
                raise versions_failed(name, failed, [p.version for p in prepared]) from next(iter(failed.values()))
        except BaseException:  # the versions built beside the one that failed hold stubs and sessions
            close_instances(instance for built in prepared for instance in built.instances)
            raise
        return prepared

    def _prepare_version(
        self,
        name: str,
        version: int,
        model_dir: Path,
        config_path: Path,
        base: mc.ModelConfig,
    ) -> PreparedVersion:
        model_path = model_config.model_file(model_dir, version, base)
        labels = read_labels(base, model_dir)
        placements = plan_instances(base, self.gpu_count, config_path, why_no_gpu(base))
        create_instances = instance_factory(base)
        gpus = [p.gpu for p in placements if p.device == "GPU" and p.gpu is not None]
        complete = functools.partial(
            model_config.complete_config,
            model_name=name,
            config_path=config_path,
            model_path=model_path,
            default_max_batch_size=self.default_max_batch_size,
            placements=placements,
        )
        context = BackendContext(
            settings=self.backend_config,
            complete_config=complete,
            call_model=self._call_model,
            stream_model=self._stream_model,
            loop=self._loop,
            auto_complete=self.auto_complete,
            custom_metrics=self.custom_metrics,
            model_control=self.model_control,
        )
        version_config = mc.ModelConfig()
        version_config.CopyFrom(base)  # a backend may complete it in place (python's auto_complete_config)
        model_config.normalize(version_config, placements)  # as Triton gives it to the backend
        with gpu_memory_delta(gpus) as gpu_memory:
            instances, (inputs, outputs) = create_instances(
                version_config, model_path, placements, config_path, context
            )
            try:
                config = complete(version_config, inputs, outputs)
                check_cache_config(config)
                # Inside the measurement: the memory the runtime grows into on the first runs is the model's.
                run_warmup(config, instances, model_dir)
            except BaseException:
                close_instances(instances)
                raise
        return PreparedVersion(name, version, config, instances, gpu_memory, labels)

    async def _call_model(self, call: ModelCall) -> Tensors:
        if self.call_model is None:
            raise Unavailable(f"model '{call.model_name}' cannot be called from a model on this server")
        return await self.call_model(call)

    async def _stream_model(self, call: ModelCall) -> AsyncIterator[tuple[Tensors | None, bool]]:
        if self.stream_model is None:
            raise Unavailable(f"model '{call.model_name}' cannot be called from a model on this server")
        async for item in self.stream_model(call):
            yield item

    def _retire(self, versions: Iterable[ModelVersion], grace_s: float = RETIRE_GRACE_S) -> None:
        """Close replaced versions in the background: requests already queued on them still finish."""
        for model_version in versions:
            task = asyncio.get_running_loop().create_task(model_version.close(grace_s))
            self._retired.add(task)
            task.add_done_callback(self._retired.discard)

    # --- lookup ----------------------------------------------------------------------------------

    def get(self, name: str, version: str = "") -> ModelVersion:
        """The version to serve: `version` when given, else the highest ready one."""
        record = self._records.get(name)  # the errors begin with Triton's wording (errors.py)
        if record is None:
            if self.namespaces is not None:  # a name alone: its one loaded copy, or Triton's error
                return self.get(self.namespaces.key_of(name, self._records), version)
            if self.on_disk(name) and self.roots.unique(name):  # one in two repositories is no model, as on Triton
                raise Unavailable(f"{errors.unknown_model(name)}: it is in the model repository but not loaded")
            raise NotFound(errors.unknown_model(name))
        if not record.versions and record.not_found:
            raise NotFound(record.not_found)  # Triton's answer; the reason is in the index and the log
        if not record.versions:
            why = f": {record.reason}" if record.reason else ""
            raise Unavailable(f"{errors.no_available_versions(name)} (state {record.state}){why}")
        if not version:
            return record.versions[max(record.versions)]
        if not version.isdigit():
            raise InvalidArgument(errors.bad_version(version))
        model_version = record.versions.get(int(version))
        if model_version is None:
            raise NotFound(f"{errors.unknown_model(name, version)}; served versions: {sorted(record.versions)}")
        return model_version

    def is_ready(self, name: str, version: str = "") -> bool:
        """Whether `name` serves; an ensemble serves while each of its composing models does."""
        try:
            served = self.get(name, version)
        except ServerError:
            return False
        # Load-time checks rule out cycles, so this recursion ends.
        return all(self.is_ready(model, model_version) for model, model_version in served.composing)

    def loaded(self) -> list[ModelVersion]:
        return [mv for record in self._records.values() for mv in record.versions.values()]

    def all_ready(self) -> bool:
        """Every model the repository was asked to load is serving."""
        return all(record.state == READY or record.reason == "unloaded" for record in self._records.values())

    def not_ready(self) -> list[tuple[str, str, str]]:
        """(name, state, reason) of each model the repository was asked to load that does not serve:
        what keeps the server not ready under --strict-readiness."""
        return [
            (name, record.state, record.reason)
            for name, record in sorted(self._records.items())
            if record.state != READY and record.reason != "unloaded"
        ]

    def index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Repository index entries as Triton's POST /v2/repository/index returns them (`load_outcome`)."""
        entries = index_entries(self._records, self.model_names(), self.is_ready, ready_only)
        return self.namespaces.index(entries) if self.namespaces else self.roots.mark_duplicates(entries)

    async def close(self, grace_s: float) -> None:
        versions = self.loaded()
        for record in self._records.values():
            record.versions = {}
            record.state, record.reason = UNAVAILABLE, "server shutting down"
        await asyncio.gather(*(mv.close(grace_s) for mv in versions), *self._retired)
