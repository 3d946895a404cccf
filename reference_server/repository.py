"""The model repository: Triton's layout on disk, and the models loaded from it.

`<root>/<model>/config.pbtxt` (optional: completed from the ONNX graph) and numeric version folders
`<root>/<model>/<version>/model.onnx`. Loading a model builds every version its version_policy
selects, each with its instances, scheduler and statistics; a model that fails to load is recorded as
UNAVAILABLE with the reason and never stops the others.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from reference_server import model_config
from reference_server.errors import ModelConfigError, NotFound, ServerError, Unavailable
from reference_server.onnx_backend import OnnxInstance, plan_instances, session_options
from reference_server.scheduler import BatchingPolicy, Scheduler
from reference_server.stats import ModelStats

log = logging.getLogger(__name__)

READY = "READY"
UNAVAILABLE = "UNAVAILABLE"
LOADING = "LOADING"
UNLOADING = "UNLOADING"


@dataclass(slots=True)
class ModelVersion:
    """One served version of a model: its completed config, instances, scheduler and statistics."""

    name: str
    version: int
    config: mc.ModelConfig
    instances: list[OnnxInstance]
    scheduler: Scheduler
    stats: ModelStats
    inputs: dict[str, mc.ModelInput]
    outputs: dict[str, mc.ModelOutput]

    async def close(self, grace_s: float) -> None:
        await self.scheduler.close(grace_s)


@dataclass(frozen=True, slots=True)
class _PreparedVersion:
    name: str
    version: int
    config: mc.ModelConfig
    instances: list[OnnxInstance]


def _start_version(prepared: _PreparedVersion) -> ModelVersion:
    stats = ModelStats()
    config = prepared.config
    return ModelVersion(
        name=prepared.name,
        version=prepared.version,
        config=config,
        instances=prepared.instances,
        scheduler=Scheduler(BatchingPolicy.from_config(config), prepared.instances, stats),
        stats=stats,
        inputs={i.name: i for i in config.input},
        outputs={o.name: o for o in config.output},
    )


@dataclass(slots=True)
class ModelRecord:
    name: str
    state: str = UNAVAILABLE
    reason: str = ""
    versions: dict[int, ModelVersion] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class ModelRepository:
    def __init__(self, root: Path, *, gpu_count: int = 0, default_max_batch_size: int = 4) -> None:
        self.root = root.resolve()
        if not self.root.is_dir():
            raise ModelConfigError(f"{root}: model repository is not a directory; pass --model-repository DIR")
        self.gpu_count = gpu_count
        self.default_max_batch_size = default_max_batch_size
        self._records: dict[str, ModelRecord] = {}
        self._retired: set[asyncio.Task[None]] = set()

    # --- discovery -------------------------------------------------------------------------------

    def model_names(self) -> list[str]:
        """Models present on disk: every non-hidden folder of the repository."""
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith("."))

    def model_dir(self, name: str) -> Path:
        """The folder of model `name`; names that would leave the repository are not models."""
        candidate = self.root / name
        if not name or name in (".", "..") or "/" in name or "\\" in name or "\x00" in name or not candidate.is_dir():
            raise NotFound(f"model '{name}' is not in the model repository")
        resolved = candidate.resolve()
        if resolved.parent != self.root:
            raise ModelConfigError(
                f"{candidate}: model folder resolves to {resolved}, outside the model repository {self.root}"
            )
        return candidate

    # --- loading ---------------------------------------------------------------------------------

    async def load(self, name: str, override: mc.ModelConfig | None = None) -> None:
        """Load (or reload) `name`. A failed load raises and leaves any serving versions in place."""
        record = self._records.setdefault(name, ModelRecord(name))
        async with record.lock:
            previous_state = record.state
            if not record.versions:
                record.state = LOADING
            try:
                model_dir = self.model_dir(name)
                loop = asyncio.get_running_loop()
                # Sessions take long to create: build them off the loop, schedulers on it.
                prepared = await loop.run_in_executor(None, self._prepare_versions, name, model_dir, override)
                versions = {p.version: _start_version(p) for p in prepared}
            except ServerError as exc:
                record.state = previous_state if record.versions else UNAVAILABLE
                record.reason = str(exc)
                log.error("failed to load '%s': %s", name, exc)
                raise
            except Exception as exc:
                record.state = previous_state if record.versions else UNAVAILABLE
                record.reason = f"{type(exc).__name__}: {exc}"
                log.exception("failed to load '%s'", name)
                raise ModelConfigError(f"model '{name}' failed to load: {exc}") from exc
            old = record.versions
            record.versions = versions
            record.state, record.reason = READY, ""
            self._retire(old.values())
            log.info("loaded model '%s' versions %s", name, sorted(versions))

    async def load_all(self, names: Iterable[str] | None = None) -> None:
        """Load several models; failures are recorded per model and logged, never raised."""
        for name in self.model_names() if names is None else names:
            try:
                await self.load(name)
            except ServerError:
                pass

    async def unload(self, name: str) -> None:
        record = self._records.get(name)
        if record is None:
            if name not in self.model_names():
                raise NotFound(f"model '{name}' is not in the model repository")
            self._records[name] = ModelRecord(name, UNAVAILABLE, "unloaded")
            return
        async with record.lock:
            old = record.versions
            record.versions = {}
            record.state, record.reason = UNAVAILABLE, "unloaded"
            self._retire(old.values())

    def _prepare_versions(self, name: str, model_dir: Path, override: mc.ModelConfig | None) -> list[_PreparedVersion]:
        config_path = model_dir / "config.pbtxt"
        raw = override if override is not None else model_config.read_config(model_dir)
        base = mc.ModelConfig()
        if raw is not None:
            base.CopyFrom(raw)
        if not base.name:
            base.name = name
        available = model_config.available_versions(model_dir)
        selected = model_config.select_versions(base, available)
        if not selected:
            raise ModelConfigError(
                f"{model_dir}: no version to serve (version folders found: {available or 'none'}; "
                "a version is a numeric folder holding the model file)"
            )
        return [self._prepare_version(name, v, model_dir, config_path, raw, base) for v in selected]

    def _prepare_version(
        self,
        name: str,
        version: int,
        model_dir: Path,
        config_path: Path,
        raw: mc.ModelConfig | None,
        base: mc.ModelConfig,
    ) -> _PreparedVersion:
        model_path = model_config.model_file(model_dir, version, base)
        placements = plan_instances(base, self.gpu_count, config_path)
        options = session_options(base)
        instances = [OnnxInstance(p, model_path, options) for p in placements]
        inputs, outputs = model_config.signature_from_session(instances[0].session)
        config = model_config.complete_config(
            raw,
            inputs,
            outputs,
            model_name=name,
            config_path=config_path,
            model_path=model_path,
            default_max_batch_size=self.default_max_batch_size,
        )
        return _PreparedVersion(name, version, config, instances)

    def _retire(self, versions: Iterable[ModelVersion], grace_s: float = 30.0) -> None:
        """Close replaced versions in the background: requests already queued on them still finish."""
        for model_version in versions:
            task = asyncio.get_running_loop().create_task(model_version.close(grace_s))
            self._retired.add(task)
            task.add_done_callback(self._retired.discard)

    # --- lookup ----------------------------------------------------------------------------------

    def get(self, name: str, version: str = "") -> ModelVersion:
        """The version to serve: `version` when given, else the highest ready one."""
        record = self._records.get(name)
        if record is None:
            if name in self.model_names():
                raise Unavailable(f"model '{name}' is not loaded")
            raise NotFound(f"model '{name}' is not found")
        if not record.versions:
            why = f": {record.reason}" if record.reason else ""
            raise Unavailable(f"model '{name}' is not ready (state {record.state}){why}")
        if not version:
            return record.versions[max(record.versions)]
        if not version.isdigit():
            raise NotFound(f"model '{name}' has no version '{version}' (versions are integers)")
        model_version = record.versions.get(int(version))
        if model_version is None:
            raise NotFound(f"model '{name}' version {version} is not served (served: {sorted(record.versions)})")
        return model_version

    def is_ready(self, name: str, version: str = "") -> bool:
        try:
            self.get(name, version)
        except ServerError:
            return False
        return True

    def loaded(self) -> list[ModelVersion]:
        return [mv for record in self._records.values() for mv in record.versions.values()]

    def all_ready(self) -> bool:
        """Every model the repository was asked to load is serving."""
        return all(record.state == READY or record.reason == "unloaded" for record in self._records.values())

    def index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Repository index entries as Triton's POST /v2/repository/index returns them."""
        entries: list[dict[str, str]] = []
        for name in sorted(set(self.model_names()) | set(self._records)):
            record = self._records.get(name)
            if record is None:
                if not ready_only:
                    entries.append({"name": name})
                continue
            if record.versions:
                for version in sorted(record.versions):
                    entries.append({"name": name, "version": str(version), "state": READY, "reason": ""})
            elif not ready_only:
                entries.append({"name": name, "state": record.state, "reason": record.reason})
        return entries

    async def close(self, grace_s: float) -> None:
        versions = self.loaded()
        for record in self._records.values():
            record.versions = {}
            record.state, record.reason = UNAVAILABLE, "server shutting down"
        await asyncio.gather(*(mv.close(grace_s) for mv in versions), *self._retired)
