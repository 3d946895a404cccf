"""Request release flags: how a model hands a request back to the server (Triton's python backend
README, "Request Rescheduling").

`request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)` during `execute`
asks that the request, once `execute` returns, run again rather than be released: the stub reports
it, and the sequence batcher of an `iterative_sequence` model queues the same request once more (its
inputs, correlation id and response sender), with neither START nor END. A non-decoupled model
returns None in that request's place.
"""

from __future__ import annotations

__all__ = ["RequestRelease", "release_flags"]

#: pb_utils.TRITONSERVER_REQUEST_RELEASE_ALL (this module is imported by pb_utils, not the reverse).
_RELEASE_ALL = 1


class RequestRelease:
    """The release flags of a request `execute` receives (a base of `pb_utils.InferenceRequest`)."""

    __slots__ = ("_release_flags",)

    def set_release_flags(self, flags: int) -> None:
        """TRITONSERVER_REQUEST_RELEASE_ALL (the default) or TRITONSERVER_REQUEST_RELEASE_RESCHEDULE."""
        if isinstance(flags, bool) or not isinstance(flags, int):
            raise TypeError(f"set_release_flags(): flags must be an int, got {type(flags).__name__}")
        self._release_flags = flags


def release_flags(request: object) -> int:
    """The flags `request` was released with: RELEASE_ALL unless the model set others."""
    flags: int = getattr(request, "_release_flags", _RELEASE_ALL)
    return flags
