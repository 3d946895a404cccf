"""Request headers forwarded to the model as inference request parameters, as Triton does with
--http-header-forward-pattern and --grpc-header-forward-pattern (docs/protocol/extension_parameters.md,
"Forwarding HTTP/GRPC Headers as Parameters"): a header whose name the pattern matches anywhere
(RE2's PartialMatch; case-insensitive unless the pattern starts with `(?-i)`) becomes a string
parameter under its name, as sent (gRPC metadata names are always lower case). A matching header
named like a reserved parameter fails the request with the words of Triton after 2.51, which checks
this (2.51 itself passes such a header on as a custom string parameter): here a request's parameters
are the ones the scheduler reads, so a forwarded `priority` or `sequence_id` would change the request.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from reference_server.errors import InvalidArgument

__all__ = ["RESERVED_PARAMETERS", "HeaderForwarding", "compile_forward_pattern", "forward_into", "grpc_metadata"]

#: Triton's kReservedParameterKeys (src/common.h); names starting with `triton_` are reserved too.
RESERVED_PARAMETERS = frozenset(
    ("sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "headers", "binary_data_output")
)
#: HTTP/2 headers that grpc core keeps to itself rather than show a server as the call's metadata.
_TRANSPORT_HEADERS = frozenset(("te", "content-type"))


def compile_forward_pattern(pattern: str) -> re.Pattern[str]:
    """A forward pattern as Triton reads it (it puts `(?i)` in front): case-insensitive unless it
    starts with `(?-i)`. Raises re.error."""
    if pattern.startswith("(?-i)"):
        return re.compile(pattern[5:])
    return re.compile(pattern, re.IGNORECASE)


class HeaderForwarding:
    __slots__ = ("pattern",)

    def __init__(self, pattern: str) -> None:
        self.pattern: re.Pattern[str] = compile_forward_pattern(pattern)

    @classmethod
    def of(cls, pattern: str | None) -> HeaderForwarding | None:
        return None if not pattern else cls(pattern)

    def select(self, headers: Iterable[tuple[str, str]]) -> dict[str, str]:
        """The headers to forward, by name; raises InvalidArgument for a reserved name."""
        chosen: dict[str, str] = {}
        search = self.pattern.search
        for name, value in headers:
            if search(name) is None:
                continue
            if name in RESERVED_PARAMETERS or name.startswith("triton_"):
                raise InvalidArgument(f"Header '{name}' is reserved for Triton usage and cannot be forwarded.")
            chosen[name] = value
        return chosen

    def apply(self, headers: Iterable[tuple[str, str]], parameters: dict[str, Any]) -> None:
        """Add the forwarded headers to a decoded request's `parameters`."""
        parameters.update(self.select(headers))


def grpc_metadata(headers: dict[str, str]) -> list[tuple[str, str]]:
    """A gRPC call's metadata as grpc core shows it to a server: its headers but the pseudo-headers,
    gRPC's own (`grpc-*`) and the transport's."""
    return [
        (name, value) for name, value in headers.items()
        if not name.startswith((":", "grpc-")) and name not in _TRANSPORT_HEADERS
    ]  # fmt: skip


def forward_into(request: Any, forwarded: dict[str, str]) -> Any:
    """A gRPC ModelInferRequest (or a malformed one, untouched) with `forwarded` as string parameters."""
    parameters = getattr(request, "parameters", None)
    if parameters is not None:
        for name, value in forwarded.items():
            parameters[name].string_param = value
    return request
