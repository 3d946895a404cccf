"""The models loaded as the server starts: --model-load-thread-count at once, each tried again up to
--model-load-retry-count times, and with --exit-on-error true a failure that stops the server.

Ensembles load after every other model, one at a time through `ModelRepository.load_all`, so that a
composing model is never loaded twice at once (once for itself, once for its ensemble).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from reference_server.core.ensemble.loading import composing_on_disk
from reference_server.core.repository import ModelRepository
from reference_server.errors import ServerError

__all__ = ["ModelsFailed", "load_at_start"]

log = logging.getLogger("reference_server.server")


class ModelsFailed(ServerError):
    """--exit-on-error true and a model did not load: the server stops (exit 1, as tritonserver)."""


async def load_at_start(
    repository: ModelRepository,
    names: Iterable[str] | None = None,
    *,
    threads: int = 4,
    retries: int = 0,
    exit_on_error: bool = False,
) -> list[str]:
    """Load `names` (default: every model in the repository); returns those that failed."""
    names = list(repository.model_names() if names is None else names)
    ensembles = [name for name in names if repository.on_disk(name) and composing_on_disk(repository, name)]
    plain = [name for name in names if name not in ensembles]
    gate = asyncio.Semaphore(max(1, threads))

    async def load(name: str) -> None:
        async with gate:
            for attempt in range(retries + 1):
                try:
                    await repository.load(name)
                    return
                except ServerError:
                    if attempt < retries:
                        log.warning("loading '%s' again (--model-load-retry-count %d)", name, retries)

    await asyncio.gather(*(load(name) for name in plain))
    for _ in range(retries + 1):
        pending = [name for name in ensembles if not repository.serving(name)]
        if not pending:
            break
        await repository.load_all(pending)
    failed = [name for name in names if not repository.serving(name)]
    if failed and exit_on_error:
        raise ModelsFailed(f"failed to load all models: {', '.join(failed)} (--exit-on-error true)")
    return failed
