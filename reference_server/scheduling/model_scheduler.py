"""What the data plane and an ensemble call on a model version's scheduler, whichever it is.

`scheduler.Scheduler` (Triton's default scheduler and dynamic batcher) and the ensemble's
`core.ensemble.scheduler.EnsembleScheduler` both have this surface; `ModelVersion.scheduler` holds either.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

from reference_server.errors import ServerError
from reference_server.scheduling.execute import Tensors
from reference_server.scheduling.stats import ModelStats

__all__ = ["ModelScheduler"]


class ModelScheduler(Protocol):
    """A model version's scheduler: `Scheduler`, or an ensemble's. `secondary_stats` also counts the
    request (Triton's secondary stats aggregator): an ensemble sums its steps' compute times in it.

    `infer_stream` yields (outputs, final) per response: a `ServerError` in place of the outputs is
    an error response the model sent (the stream goes on), None a final flag sent on its own."""

    async def infer(
        self,
        inputs: Tensors,
        output_names: Sequence[str],
        *,
        timeout_us: int | None = None,
        received_ns: int | None = None,
        request_id: str = "",
        parameters: dict[str, Any] | None = None,
        secondary_stats: ModelStats | None = None,
    ) -> Tensors: ...

    def infer_stream(
        self,
        inputs: Tensors,
        output_names: Sequence[str],
        *,
        timeout_us: int | None = None,
        received_ns: int | None = None,
        request_id: str = "",
        parameters: dict[str, Any] | None = None,
    ) -> AsyncIterator[tuple[Tensors | ServerError | None, bool]]: ...

    async def close(self, grace_s: float) -> None: ...
