"""The data plane's operations on models as a whole rather than on requests: the statistics extension
and the model repository extension (index, load with its parameters and `file:` overrides, unload,
and the explicit model control mode they require).

`ModelManagement` is a base of `core.dataplane.DataPlane`, which sets the attributes it declares;
`checked_model_name` is the check every lookup by name makes, the data plane's per-request ones too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from reference_server.core import model_config
from reference_server.core.load_overrides import FILE_PREFIX, OverrideFolders
from reference_server.core.model_version import ModelVersion
from reference_server.core.namespaces import Ambiguous
from reference_server.core.repository import ModelRepository
from reference_server.errors import InvalidArgument, NotFound, Unavailable, unknown_model
from reference_server.scheduling.stats import ModelStats

#: The longest file name most file systems take (NAME_MAX); a longer name is no model folder.
_NAME_MAX_BYTES = 255


def checked_model_name(name: str) -> str:
    """`name`, if it can name a model folder at all; NotFound before the file system is asked (which
    would fail with ENAMETOOLONG or on an unencodable name)."""
    try:
        size = len(name.encode("utf-8", "surrogateescape"))
    except UnicodeEncodeError:
        size = -1
    if not 0 < size <= _NAME_MAX_BYTES:
        shown = name if len(name) <= 64 else name[:61] + "..."
        raise NotFound(f"{unknown_model(shown)}: not a model folder name")
    return name


class ModelManagement:
    """The statistics and model repository extensions, over the attributes the data plane sets."""

    repository: ModelRepository
    model_control_mode: str
    override_folders: OverrideFolders
    stats_of: Callable[[ModelVersion], ModelStats]

    def statistics(self, name: str = "", version: str = "") -> dict[str, Any]:
        try:
            if not name:
                served = self.repository.loaded()
            elif version:
                served = [self.repository.get(checked_model_name(name), version)]
            else:
                self.repository.get(checked_model_name(name))  # raises NotFound / Unavailable for the right reason
                served = [mv for mv in self.repository.loaded() if mv.name == name]
        except NotFound as exc:  # Triton's words for statistics
            raise NotFound(f"requested model '{name}' is not available: {exc}") from None
        except Ambiguous:  # a name of several repositories (--model-namespacing true): Triton says no more
            raise InvalidArgument(f"requested model '{name}' is not available") from None
        served.sort(key=lambda mv: (mv.name, mv.version))
        return {
            "model_stats": [self.stats_of(mv).to_dict(mv.name, str(mv.version), _memory_usage(mv)) for mv in served]
        }

    def repository_index(self, ready_only: bool = False) -> list[dict[str, str]]:
        return self.repository.index(ready_only)

    async def load_model(self, name: str, parameters: dict[str, Any] | None = None) -> None:
        self._require_explicit("load")
        parameters = parameters or {}
        override = None
        files = {}
        for key, value in parameters.items():
            if key == "config":
                if not isinstance(value, str):
                    raise InvalidArgument("load parameter 'config' must be a JSON string of a model config")
                override = model_config.config_from_json(value, f"load request for model '{name}'")
            elif key.startswith(FILE_PREFIX):
                files[key] = value
            else:
                raise InvalidArgument(
                    f"unknown load parameter '{key}'; those accepted are 'config' and '{FILE_PREFIX}<path>'"
                )
        source = None
        if files:  # Triton loads such a model from a temporary folder of those files, not the repository
            source = await asyncio.get_running_loop().run_in_executor(
                None, self.override_folders.stage, checked_model_name(name), override, files
            )
        try:
            await self.repository.load(checked_model_name(name), override, source=source)
        finally:
            # What the model serves from now; with loads of one model racing, the last to swap in.
            serving = self.repository.source(name) if self.repository.serving(name) else None
            self.override_folders.commit(name, serving)
            if source is not None and source != serving:
                self.override_folders.discard(source)

    async def unload_model(self, name: str, parameters: dict[str, Any] | None = None) -> None:
        self._require_explicit("unload")
        parameters = parameters or {}
        for key in parameters:
            if key != "unload_dependents":
                raise InvalidArgument(f"unknown unload parameter '{key}'")
        dependents = parameters.get("unload_dependents", False)
        if not isinstance(dependents, bool):
            raise InvalidArgument("unload parameter 'unload_dependents' must be a boolean")
        await self.repository.unload(checked_model_name(name), unload_dependents=dependents)
        self.override_folders.commit(name, None)

    def _require_explicit(self, action: str) -> None:
        if self.model_control_mode != "explicit":
            # Triton answers model control outside explicit mode with UNAVAILABLE, in these words for
            # both the none and the poll mode (core model_repository_manager.cc).
            raise Unavailable(
                f"explicit model load / unload is not allowed if polling is enabled (asked to {action} in model "
                f"control mode '{self.model_control_mode}'); start the server with --model-control-mode explicit"
            )


def _memory_usage(served: ModelVersion) -> list[dict[str, Any]]:
    # Only GPU memory is measured (per version, at load): CPU memory cannot be told apart by model
    # inside one process.
    return [{"type": "GPU", "id": index, "byte_size": size} for index, size in sorted(served.gpu_memory_bytes.items())]
