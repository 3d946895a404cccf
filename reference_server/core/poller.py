"""Poll mode (`--model-control-mode poll`): follow the model repository as it changes on disk.

Every `interval_s` seconds (`--repository-poll-secs`) the poller fingerprints each model folder
(`model_source.model_fingerprint`: a stat of every entry, no hashing) and compares it with the fingerprint the
repository recorded when it last tried to load that model:

- a folder whose fingerprint differs, or that was never loaded, is (re)loaded. A reload swaps the
  versions without dropping requests (see `repository`); a failed one leaves the previous versions
  serving and puts the reason in the repository index;
- a model that was loaded and whose folder is gone is unloaded.

A failed load keeps the fingerprint it read, so a broken model is retried when it changes again, not
on every poll. A folder caught half-copied may fail to load; the copy finishing changes its
fingerprint and the next poll loads it (moving a finished folder into place avoids even that).
Polls run one at a time and load models one by one; the load and unload API is refused in poll mode,
as in Triton, so nothing else changes models meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

from reference_server.core.model_source import Fingerprint, model_fingerprint
from reference_server.core.repository import ModelRepository
from reference_server.errors import ServerError

__all__ = ["PollResult", "RepositoryPoller"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class PollResult:
    """What one poll did."""

    loaded: list[str] = field(default_factory=list)
    unloaded: list[str] = field(default_factory=list)
    #: model → why its (re)load failed
    failed: dict[str, str] = field(default_factory=dict)


class RepositoryPoller:
    """Reload changed, load new and unload removed models every `interval_s` seconds."""

    def __init__(self, repository: ModelRepository, interval_s: float) -> None:
        if interval_s <= 0:
            raise ServerError(f"--repository-poll-secs must be a positive number of seconds, got {interval_s}")
        self.repository = repository
        self.interval_s = interval_s
        self.polls = 0  # completed polls
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start polling in the background; the first poll comes one interval from now."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="repository-poller")

    async def stop(self) -> None:
        """Stop polling; a load in progress is abandoned (its half-built versions are dropped)."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.poll_once()
            except Exception:  # a poll that fails (say, the repository folder vanished) must not stop polling
                log.exception("repository poll failed; trying again in %ss", self.interval_s)

    async def poll_once(self) -> PollResult:
        """Compare the repository on disk with what is loaded and apply the differences."""
        repository = self.repository
        on_disk = await asyncio.to_thread(self._scan)
        result = PollResult()
        for name in repository.known():
            if name not in on_disk:
                await repository.unload(name)
                result.unloaded.append(name)
        for name, fingerprint in on_disk.items():
            if repository.fingerprint(name) == fingerprint:
                continue
            try:
                await repository.load(name)
            except ServerError as exc:  # recorded and logged by the repository
                result.failed[name] = str(exc)
            else:
                result.loaded.append(name)
        self.polls += 1
        if result.loaded or result.unloaded or result.failed:
            log.info(
                "repository poll: loaded %s, unloaded %s, failed %s",
                result.loaded,
                result.unloaded,
                sorted(result.failed),
            )
        return result

    def _scan(self) -> dict[str, Fingerprint]:
        namespaces = self.repository.namespaces
        folder = namespaces.place if namespaces else self.repository.roots.folder
        return {name: model_fingerprint(folder(name)) for name in self.repository.model_names()}
