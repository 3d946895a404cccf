"""What a server serves, read alike by `sweep`, `probe` and `tune` from any KServe v2 server.

Triton answers everything perfkit asks. The Open Inference Protocol itself promises less: health,
metadata and inference. MLServer and KServe have no model configuration (a Triton extension), KServe
no repository index (the HTTP client falls back to the names `GET /v2/models` lists), and their
metadata may hold `null` where Triton has a list. So:

- `read_model` reads a model's metadata, then its configuration: None where the server has no model
  configuration extension, and requests are then built from the metadata alone
  (`perfkit.load.inputs.batch_dimension`); `no_config_note` says once what that leaves unknown, and
  `config_needed` is the error of whatever cannot go on without it (tune, the sequence flags, the
  composing models).
- `model_error` tells "no such model" (a usage error, exit 2: -m is what to change) from the
  server failing (exit 1), by its index or, where it has none, the metadata call's 404 / NOT_FOUND.
- `ready_models` and `describe_models` read an index, whatever its states' spelling.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from perfkit.errors import MissingExtension, PerfkitError, TargetError

__all__ = [
    "ServedModel",
    "config_needed",
    "describe_models",
    "model_error",
    "no_config_note",
    "read_model",
    "ready_models",
]

#: How the clients word a server's "no such model" to a metadata call (HTTP and gRPC).
_NOT_FOUND = (": HTTP 404:", ": NOT_FOUND:")


class ModelSource(Protocol):
    """What of an `InferClient` (or a fleet of them) this module calls."""

    async def model_metadata(self, model: str, version: str = "") -> dict[str, Any]: ...
    async def model_config(self, model: str, version: str = "") -> dict[str, Any]: ...
    async def repository_index(self) -> list[dict[str, Any]]: ...


@dataclass(frozen=True, slots=True)
class ServedModel:
    metadata: dict[str, Any]
    config: dict[str, Any] | None  # None: the server has no model configuration extension
    missing: MissingExtension | None = None  # why config is None: the call and the server's answer


def ready_models(index: Sequence[Any]) -> list[str]:
    """The names of the READY models of a repository index (an entry without a state counts as ready)."""
    return sorted({str(e.get("name")) for e in index if isinstance(e, dict) and e.get("state", "READY") == "READY"})


def describe_models(index: Sequence[Any]) -> str:
    """Every model of an index with its state and reason: "a (UNAVAILABLE: load failed), b (LOADING)"."""
    found = []
    for entry in index:
        if isinstance(entry, dict):
            state, reason = str(entry.get("state") or "state unknown"), str(entry.get("reason") or "")
            found.append(f"{entry.get('name')} ({state}{': ' + reason if reason else ''})")
    return ", ".join(found)


async def model_error(client: ModelSource, model: str, url: str, exc: Exception) -> PerfkitError:
    """Why the model's metadata could not be read: a usage error (exit 2) when the server has no
    such model, so -m is what to change; otherwise the server's own failure (exit 1)."""
    try:
        index: list[dict[str, Any]] | None = await client.repository_index()
    except Exception:  # no repository extension: the metadata call's answer is all there is to go by
        index = None
    if index is not None:
        names = sorted({str(entry.get("name")) for entry in index if isinstance(entry, dict)})
        if model not in names:
            return PerfkitError(
                f"-m {model}: the server at {url} has no model '{model}'; it has {', '.join(names) or 'none'}"
            )
    elif isinstance(exc, TargetError) and any(mark in str(exc) for mark in _NOT_FOUND):
        return PerfkitError(f"-m {model}: the server at {url} has no model '{model}' ({exc}); name a model it serves")
    return TargetError(f"model '{model}' on {url}: {exc}")


async def read_model(client: ModelSource, model: str, version: str, url: str) -> ServedModel:
    """The model's metadata and configuration (None where the server has no model configuration
    extension). Raises `model_error`'s error when either cannot be read otherwise."""
    try:
        metadata = await client.model_metadata(model, version)
    except Exception as exc:
        raise await model_error(client, model, url, exc) from None
    try:
        config = await client.model_config(model, version)
    except MissingExtension as missing:  # its metadata was read: the route, not the model, is missing
        return ServedModel(metadata, None, missing)
    except Exception as exc:
        raise await model_error(client, model, url, exc) from None
    return ServedModel(metadata, config)


def no_config_note(url: str, missing: MissingExtension) -> str:
    """The one console note of a server without model configuration: what is unknown without it."""
    return (
        f"{url} has no model configuration extension ({missing}): requests built from the model metadata; "
        "its batching, sequence batching and ensemble steps are unknown"
    )


def config_needed(what: str, url: str, missing: MissingExtension, fix: str) -> TargetError:
    """The error of `what`, which cannot go on without the model configuration the server lacks."""
    return TargetError(f"{what}: the model configuration is needed, and {url} has no {missing.extension} "
                       f"extension ({missing}); {fix}")  # fmt: skip
