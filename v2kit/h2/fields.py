"""The rules a header block must keep (RFC 9113 §8.2, §8.3), judged once per distinct block:
`HeaderDecoder` (`v2kit.h2.frames`) caches a block's `Fields` by its bytes, so a warm peer's
repeated requests cost a dict lookup. A block's problem, as a request, a response or trailers, is
a reason; `v2kit.h2.receive` makes it a stream error (RST_STREAM PROTOCOL_ERROR)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["Fields", "classify"]

#: Regular fields with a rule of their own: connection-specific ones (§8.2.2), te and content-length.
_SPECIAL = frozenset(
    ("connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "te", "content-length")
)
_REQUEST_PSEUDO = frozenset((":method", ":scheme", ":path", ":authority"))


class Fields:
    """A decoded header block: its fields by name (the last of a repeated regular name), and what
    makes it malformed (RFC 9113 §8.1.1) as a request, a response or trailers (None: nothing)."""

    __slots__ = ("headers", "request", "response", "trailers")

    def __init__(self, headers: dict[str, str], request: str | None, response: str | None, trailers: str | None):
        self.headers = headers
        self.request = request
        self.response = response
        self.trailers = trailers


def classify(fields: Sequence[tuple[str, str]]) -> Fields:
    """Judge a decoded header block once for each use it may be put to. One pass, the common
    case cheap: a grpcio client's blocks change the HPACK table on every call (grpc-timeout), so
    they are judged on every call."""
    headers: dict[str, str] = {}
    pseudo: dict[str, str] = {}
    common: str | None = None
    regular = False
    for name, value in fields:
        if name[:1] == ":":
            if regular or name in pseudo:
                common = common or f"pseudo-header {name} {'after regular fields' if regular else 'repeated'}"
            pseudo[name] = value
        else:
            regular = True
            if name in _SPECIAL:
                common = common or _special_problem(name, value)
            headers[name] = value
        if "\r" in value or "\n" in value or "\x00" in value:
            common = common or f"field {name!r} has a forbidden character in its value"
    names = "".join(headers)
    if names != names.lower() or "" in headers:
        common = common or "a field name is empty or has upper-case letters"
    if pseudo:
        headers = {**pseudo, **headers}  # in the order a request's or response's fields come
    if common is not None:
        return Fields(headers, common, common, common)
    return Fields(headers, _request_problem(pseudo), _response_problem(pseudo), _trailers_problem(pseudo))


def _special_problem(name: str, value: str) -> str | None:
    if name == "te":
        return None if value.strip().lower() == "trailers" else f"te: {value!r} (only 'trailers' is allowed)"
    if name == "content-length":
        return None if value.isdigit() else f"content-length {value!r} is not a number"
    return f"connection-specific field {name!r}"


def _request_problem(pseudo: dict[str, str]) -> str | None:
    unknown = pseudo.keys() - _REQUEST_PSEUDO
    if unknown:
        return f"pseudo-header {min(unknown)} in a request"
    if pseudo.get(":method") == "CONNECT":  # §8.5: :authority only
        return None if ":authority" in pseudo and len(pseudo) == 2 else "a malformed CONNECT request"
    for name in (":method", ":scheme", ":path"):
        if name not in pseudo:
            return f"a request without {name}"
    if not pseudo[":path"]:
        return "a request with an empty :path"
    return None


def _response_problem(pseudo: dict[str, str]) -> str | None:
    status = pseudo.get(":status")
    if status is None:
        return "a response without :status"
    if len(pseudo) > 1:
        return f"pseudo-header {min(pseudo.keys() - {':status'})} in a response"
    if len(status) != 3 or not status.isdigit():
        return f":status {status!r} is not a three-digit code"
    return None


def _trailers_problem(pseudo: dict[str, str]) -> str | None:
    return f"pseudo-header {min(pseudo)} in trailers" if pseudo else None
