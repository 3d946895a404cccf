"""Requests a python model released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE (the stub's
`reschedule` list in an execute answer; `pb/release.py` is the model's side).

Only a model with `sequence_batching { iterative_sequence: true }` may reschedule, as in Triton:
its request is answered `Rescheduled` and its sequence batcher runs it again; a decoupled request's
stream stays open for the next run's responses (its inputs are written again then, so this run's
are freed now). Any other model's request fails with core's words for the refused release.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from reference_server.backends.python.process import PythonModel, StubProcess
from reference_server.errors import InvalidArgument
from reference_server.scheduling.execute import RESCHEDULE_REFUSED, Rescheduled, Tensors

__all__ = ["reschedule"]


def iterative(model: PythonModel) -> bool:
    """Whether the model's config has `sequence_batching { iterative_sequence: true }`."""
    config = json.loads(model.config_json or "{}")
    return bool(config.get("sequence_batching", {}).get("iterative_sequence", False))


def reschedule(
    model: PythonModel,
    stub: StubProcess,
    items: Sequence[tuple[Any, ...]],
    indices: Sequence[int],
    results: list[Tensors | Exception],
) -> None:
    """Answer the batch's requests at `indices` (of `items`, the execute message's requests, the
    token first) as rescheduled, in `results`."""
    again = iterative(model)
    for i in indices:
        stub.drop_stream(items[i][0])  # a decoupled request's next run opens its stream again
        results[i] = Rescheduled() if again else InvalidArgument(RESCHEDULE_REFUSED)
