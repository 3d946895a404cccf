"""What a client and the log are told of the repository's loads, as tritonserver 2.51 tells it: a
model version that fails to load, and the repository index (`index_entries`).

Triton's answer to the load is "load failed for model 'X': version 1 is at UNAVAILABLE state:
Internal: ValueError: ...;\\n" (HTTP 400, gRPC INVALID_ARGUMENT, whatever failed), its repository
index lists the version as `{"name", "version", "state": "UNAVAILABLE", "reason": "Internal: ..."}`
until a load works, and its log says "failed to load 'X' version 1: <reason>" then "failed to load
'X'". The reason is the failure as Triton prints a Status: the code's word, then the message (the
python backend's failures are Internal, with the Python error and its frames as the stub formats
them). Where the version failed (the model file, the instance) goes to our log, not to the answer,
which clients compare with Triton's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from reference_server import errors
from reference_server.errors import ModelConfigError, ServerError

if TYPE_CHECKING:
    from reference_server.core.repository import ModelRecord

__all__ = ["VersionFailed", "index_entries", "versions_failed"]

log = logging.getLogger(__name__)


class VersionFailed(ModelConfigError):
    """Versions of a model failed to build; its message is Triton's words for them, after "load
    failed for model 'X': "."""

    def __init__(self, message: str, failed: dict[int, str] | None = None) -> None:
        super().__init__(message)
        #: Version -> what the repository index says of it: the failure as Triton prints it
        #: ("Internal: ValueError: ..."), or "unloaded" for one that loaded beside a failed one.
        self.failed = failed or {}
        self.reason = next((r for r in self.failed.values() if r != _UNLOADED), "")


_UNLOADED = "unloaded"


def versions_failed(name: str, failures: dict[int, Exception], built: list[int]) -> VersionFailed:
    """`failures` (version -> what building it raised) of model `name`, as Triton reports them (and
    logged as Triton logs them); the `built` versions are dropped with them, as in Triton."""
    reasons: dict[int, str] = {}
    for version, exc in failures.items():
        if isinstance(exc, ServerError):
            reasons[version] = errors.status_text(exc)
        else:  # a bug of ours, or a library's: Triton's backends answer these as Internal
            reasons[version] = f"Internal: {type(exc).__name__}: {exc}"
        log.error(
            "failed to load '%s' version %d: %s",
            name,
            version,
            reasons[version],
            exc_info=not isinstance(exc, ServerError),
        )
    # Triton lists the failed versions highest first.
    words = "".join(errors.version_unavailable(v, reasons[v]) for v in sorted(reasons, reverse=True)) + "\n"
    return VersionFailed(words, {**dict.fromkeys(built, _UNLOADED), **reasons})


def index_entries(
    records: Mapping[str, ModelRecord],
    on_disk: Iterable[str],
    is_ready: Callable[[str, str], bool],
    ready_only: bool = False,
) -> list[dict[str, str]]:
    """Repository index entries as Triton's POST /v2/repository/index returns them.

    Every model folder on disk is listed (Triton lists the repository), plus any model still
    serving after its folder went away. A serving version carries the reason of a failed reload,
    if the last load attempt failed; a model whose last load failed at a version lists that
    version with its reason, as Triton does.
    """
    entries: list[dict[str, str]] = []
    serving = {name for name, record in records.items() if record.versions}
    for name in sorted(set(on_disk) | serving):
        record = records.get(name)
        if record is None:
            if not ready_only:
                entries.append({"name": name})
            continue
        if record.versions:
            for version, served in sorted(record.versions.items()):
                entry = {"name": name, "version": str(version), "state": "READY"}
                if record.reason:  # Triton leaves an empty reason out
                    entry["reason"] = record.reason
                missing = [model for model, v in served.composing if not is_ready(model, v)]
                if missing:
                    # An ensemble whose composing model went away serves nothing until it is back.
                    if ready_only:
                        continue
                    entry["state"] = "UNAVAILABLE"
                    entry["reason"] = f"composing model(s) not ready: {', '.join(missing)}"
                entries.append(entry)
        elif ready_only:
            continue
        elif record.failed:
            entries.extend(
                {"name": name, "version": str(version), "state": "UNAVAILABLE", "reason": reason}
                for version, reason in sorted(record.failed.items())
            )
        else:
            entries.append({"name": name, "state": record.state, "reason": record.reason})
    return entries
