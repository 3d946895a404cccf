"""How the load generator judges a reply without decoding more than it must: its framing, the
short kind each failure is counted under ("HTTP 503", "grpc UNAVAILABLE", "timeout", "connection
refused", ...), the text kept for the first few of a kind, and output validation against
`validation_data`. An `Outcome` is what a client's `send()` makes of one request: its kind, sizes
and client-side times (what `send_ns` and `recv_ns` cover: `perfkit.wire.client`)."""

from __future__ import annotations

import errno
import json
import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from perfkit.wire import http_pool as http_wire
from v2kit import codec as v2
from v2kit.compiled import by_constructor

__all__ = [
    "MESSAGES_PER_KIND",
    "VALIDATION_MISMATCH",
    "FailureLog",
    "Outcome",
    "ReplyFraming",
    "body_framing_ok",
    "describe",
    "failure_line",
    "grpc_failure_kind",
    "http_failure_kind",
    "http_outputs",
    "note_once",
    "output_mismatch",
]

MESSAGES_PER_KIND = 10
#: Distinct texts of one kind kept for the console: a server that words each failure anew (an id in
#: it) still gets a few lines, not one per request.
TEXTS_PER_KIND = 3
#: The console line's cut: a server's text can be a whole traceback or an echo of the request.
TEXT_CHARS = 400
VALIDATION_MISMATCH = "validation mismatch"


@dataclass(slots=True, init=False)
class Outcome:
    """One per request: its own `__init__` (compiled, where the dataclass's generated one would run
    interpreted, and a frozen one sets each field through `object.__setattr__`). Not changed once made."""

    error: str  # "" on success, else the error's kind, used for counting
    bytes_in: int
    send_ns: int
    recv_ns: int
    message: str  # the error's text, for the first occurrences of each kind
    response_ns: tuple[int, ...] | None  # streaming only: each response's arrival (perf_counter_ns)
    tokens: tuple[int, ...]  # a generative request's token record (load/samples.py TOKEN_COLUMNS)
    text: str  # a generative request's answer text (a session's next turn carries it)

    def __init__(
        self,
        error: str,
        bytes_in: int,
        send_ns: int,
        recv_ns: int,
        message: str = "",
        response_ns: tuple[int, ...] | None = None,
        tokens: tuple[int, ...] = (),
        text: str = "",
    ) -> None:
        self.error, self.bytes_in, self.send_ns, self.recv_ns = error, bytes_in, send_ns, recv_ns
        self.message, self.response_ns, self.tokens, self.text = message, response_ns, tokens, text

    def __reduce__(self) -> tuple[type[Outcome], tuple[Any, ...]]:
        # By the constructor: compiled, the default pickling (an empty instance, then each field)
        # fails, and a distributed load's workers may send outcomes.
        return by_constructor(self)


def output_mismatch(expected: Mapping[str, bytes], outputs: Mapping[str, bytes]) -> str:
    """Why an answer's outputs differ from the expected ones; "" when they do not."""
    for name, want in expected.items():
        got = outputs.get(name)
        if got is None:
            return f"output '{name}' is missing from the answer"
        if got != want:
            what = "size" if len(got) != len(want) else "data"
            return f"output '{name}': {what} differs from validation_data (got {got[:32]!r}, want {want[:32]!r})"
    return ""


def http_outputs(body: bytes, header_length: bytes | str | None) -> dict[str, bytes]:
    response = v2.decode_infer_response(body, None if header_length is None else int(header_length))
    return {t.name: v2.tensor_to_raw(t.data, t.datatype, t.name) for t in response.outputs}


class FailureLog:
    """A client's failures: counted by kind, and each distinct text of the first few of a kind kept
    until the console has said it (`unsaid`), so that a run shows why its requests failed."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.texts: dict[tuple[str, str], bool] = {}  # (kind, text) -> said on the console

    def wanted(self, kind: str) -> bool:
        """Whether the next failure of `kind` still carries its text (decoding it costs)."""
        return self.counts.get(kind, 0) < MESSAGES_PER_KIND

    def note(self, kind: str, message: str) -> str:
        """Count one failure; `message` for the first few of its kind, "" after: samples stay small."""
        self.counts[kind] = count = self.counts.get(kind, 0) + 1
        if count > MESSAGES_PER_KIND:
            return ""
        if sum(k == kind for k, _ in self.texts) < TEXTS_PER_KIND:
            self.texts.setdefault((kind, message), False)
        return message

    def unsaid(self) -> list[tuple[str, str]]:
        """The (kind, text) pairs not said yet, in the order they came; now counted as said."""
        new = [pair for pair, said in self.texts.items() if not said]
        for pair in new:
            self.texts[pair] = True
        return new


def note_once(seen: FailureLog, kind: str, message: str) -> str:
    """`message` for the first few failures of a kind, "" after (FailureLog.note)."""
    return seen.note(kind, message)


#: Failures an HTTP server gives a body it cannot read: its error status, or closing the connection.
_UNREAD_BODY = ("HTTP 400", "HTTP 415", "HTTP 422", "HTTP 500", "connection reset", "disconnected")


def failure_line(
    kind: str, text: str, *, protocol: str, binary_inputs: bool, binary_outputs: bool, binary_listed: bool = False
) -> str:
    """One console line for a failure: its kind, the server's own text, and the flag that may help,
    e.g. `--input-tensor-format json` when a server refused (or hung up on) binary tensors.
    `binary_listed`: the server lists the binary_tensor_data extension, so its failures are not
    the format's (a python model's 500 on Triton is no reason to try JSON)."""
    text = " ".join(text.split())
    if len(text) > TEXT_CHARS:
        text = text[: TEXT_CHARS - 3] + "..."
    line = f"{kind}: {text}" if text else kind
    if protocol == "http" and binary_inputs and not binary_listed and kind in _UNREAD_BODY:
        line += ("; perfkit sent binary tensors (the binary_tensor_data extension), which the server may not "
                 "read: try --input-tensor-format json")  # fmt: skip
    elif protocol == "http" and binary_outputs and not binary_listed and kind == "bad response":
        line += "; perfkit asked for binary outputs: try --output-tensor-format json"
    elif kind in ("HTTP 401", "HTTP 403", "grpc UNAUTHENTICATED", "grpc PERMISSION_DENIED"):
        line += "; give the server's credentials with -H, e.g. -H 'Authorization: Bearer TOKEN'"
    return line


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def http_failure_kind(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, http_wire.Disconnected):
        return "disconnected"
    if isinstance(exc, http_wire.BadResponse):
        return "bad response"
    connecting = isinstance(exc, http_wire.ConnectFailed)
    if isinstance(exc, http_wire.ConnectFailed):
        exc = exc.os_error
    if isinstance(exc, ssl.SSLError):  # certificate verification included
        return "tls error"
    if isinstance(exc, socket.gaierror):
        return "name resolution failed"
    if isinstance(exc, OSError):
        if isinstance(exc, ConnectionRefusedError) or exc.errno == errno.ECONNREFUSED:
            return "connection refused"
        if isinstance(exc, ConnectionResetError) or exc.errno in (errno.ECONNRESET, errno.EPIPE):
            return "connection reset"
        return "connection failed" if connecting else "connection error"
    return "client error"


def body_framing_ok(body: bytes, header_length: bytes | str | None) -> bool:
    """Framing check without decoding tensors: the JSON header parses, names outputs, and the binary
    sections it declares fill the rest of the body exactly."""
    try:
        if header_length is None:
            doc = json.loads(body)
            return isinstance(doc.get("outputs"), list)
        n = int(header_length)
        outputs = json.loads(body[:n])["outputs"]
        return bool(n + sum((o.get("parameters") or {}).get("binary_data_size", 0) for o in outputs) == len(body))
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return False


class ReplyFraming:
    """`body_framing_ok` for one client's replies, remembering the last binary reply head that
    passed. A server answers a load's requests with the same JSON header (the same outputs and
    sizes) every time, and framing depends on nothing but that header and the body's length: a
    reply whose header bytes and length are the last good one's is framed as it was, without
    parsing its JSON again (the parse was the largest single cost of an HTTP reply in the client's
    profile, docs/compiled.md). JSON replies (no header length) carry their data in the JSON and
    are parsed every time. `parses` counts the JSON parses made."""

    def __init__(self) -> None:
        self.parses = 0
        self._length: bytes | str | None = None  # the last good binary reply's header length,
        self._head = b""  # its JSON header
        self._size = -1  # and its whole length

    def ok(self, body: bytes, header_length: bytes | str | None) -> bool:
        if header_length == self._length and len(body) == self._size and body.startswith(self._head):
            return True  # never for a JSON reply: _length is None only while _size is -1
        self.parses += 1
        if not body_framing_ok(body, header_length):
            return False
        if header_length is not None:
            self._length, self._head, self._size = header_length, body[: int(header_length)], len(body)
        return True


def grpc_failure_kind(code: grpc.StatusCode, details: str) -> str:
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return "timeout"
    if code == grpc.StatusCode.UNAVAILABLE:  # a failed connection reads the same as over HTTP
        lowered = details.lower()
        if "connection refused" in lowered:
            return "connection refused"
        if "connection reset" in lowered:
            return "connection reset"
    return f"grpc {code.name}"
