"""`pb_utils.InferenceResponseSender`: how a model sends a request's responses itself (Triton's
python backend README, "Decoupled mode" and "Using the response sender in non-decoupled models").

A decoupled model sends any number of responses, from any thread, during `execute` or long after
it returned, and ends the request with the final flag. A non-decoupled model may send its one
response here, with the final flag, instead of returning it from `execute`: during execute, or
later from a thread of its own for a request that execute gave no response (returned None for
it, or returned None): the stub leaves that request open (`stub._leave_open`, which sets `_late`).
Misuse is refused with Triton's words (python_backend src/response_sender.cc).

A sender that is dropped before its final flag while its request is open (no reference left to
it: the model returned, or its thread ended, without ever ending the request) reports its token to the stub,
which ends the request with an error instead of leaving the client waiting forever.
"""

from __future__ import annotations

import queue
import threading
from typing import ClassVar

# Imported by pb_utils, which this module needs at call time only: import pb_utils, not this.
from reference_server.backends.python.pb import triton_python_backend_utils as pb

__all__ = ["InferenceResponseSender"]


class InferenceResponseSender:
    """Sends a request's responses, from any thread, until the final flag."""

    __slots__ = ("_token", "_decoupled", "_closed", "_sent", "kept", "_late")

    _lock = threading.Lock()  # one check-and-close at a time, across every sender (rarely contended)
    #: Where a decoupled sender dropped before its final flag puts its token (set by the stub): a
    #: SimpleQueue, whose `put` is safe inside `__del__`, on any thread at any moment.
    dropped: ClassVar[queue.SimpleQueue[int] | None] = None

    def __init__(self, token: int, decoupled: bool) -> None:
        self._token = token
        self._decoupled = decoupled
        self._closed = False
        self._sent = 0
        self.kept: pb.InferenceResponse | None = None  # a non-decoupled model's response
        self._late = False  # a non-decoupled request left open by execute: it sends as a decoupled one

    def send(self, response: pb.InferenceResponse | None = None, flags: int = 0) -> None:
        final = pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        if flags not in (0, final):
            raise pb.TritonModelException("Unable to send response. Unsupported flag provided.")
        if response is None and flags != final:
            raise pb.TritonModelException(
                "Inference Response object must be provided when the response flags is set to zero."
            )
        if response is not None and not isinstance(response, pb.InferenceResponse):
            raise pb.TritonModelException(f"send() takes a pb_utils.InferenceResponse, got {type(response).__name__}")
        with self._lock:
            late = self._late
            if not self._decoupled:
                if not late and not pb._bridge().in_execute(self._token):
                    # Its execute returned its response, which ended the request.
                    raise pb.TritonModelException("Unable to send response. Response sender has been closed.")
                if response is not None and self._sent:
                    raise pb.TritonModelException(
                        "Unable to send response. Non-decoupled model cannot send more than one response."
                    )
                if response is None and not self._sent:
                    raise pb.TritonModelException(
                        "Unable to send response. Non-decoupled model cannot send complete final before sending "
                        "a response."
                    )
            if self._closed:
                raise pb.TritonModelException("Unable to send response. Response sender has been closed.")
            self._closed = flags == final
            self._sent += 1
            if not self._decoupled and not late:
                self.kept = response or self.kept
                return
        pb._bridge().send_response(self._token, response, flags)

    def is_cancelled(self) -> bool:
        """Whether the client gave the request up (closed its stream or connection)."""
        return pb._bridge().is_cancelled(self._token)

    def _close(self) -> bool:
        """Close it for the stub (execute failed, or the request was handed back); whether it was open."""
        with self._lock:
            was_open, self._closed = not self._closed, True
        return was_open

    def __del__(self) -> None:
        if (self._decoupled or self._late) and not self._closed and self.dropped is not None:
            self.dropped.put(self._token)
