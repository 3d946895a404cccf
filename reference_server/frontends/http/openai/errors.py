"""OpenAI's error answer, `{"error": {"message", "type", "param", "code"}}` with its HTTP status,
and the reading of a request body, which raises it: 400 for a bad body or field, 404 for an
unknown model or route, 405 for a wrong method, the data plane's status for what it refuses."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from reference_server.errors import ServerError, server_error
from reference_server.frontends.http.messages import HttpResponse

if TYPE_CHECKING:
    from reference_server.frontends.plane import Plane

__all__ = [
    "JSON", "OpenAiError", "dumps", "failure", "from_server", "json_object", "openai_error", "require_model", "typed",
]  # fmt: skip

log = logging.getLogger(__name__)

JSON = "application/json"


class OpenAiError(Exception):
    """An error to answer in OpenAI's shape."""

    def __init__(
        self, message: str, status: int = 400, *, param: str | None = None, code: str | None = None, allow: str = ""
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code
        self.allow = allow  # a 405's Allow header (RFC 9110 §15.5.6)

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


def openai_error(error: OpenAiError) -> HttpResponse:
    headers = (("Allow", error.allow),) if error.allow else ()
    return HttpResponse(error.status, dumps(error.body()), JSON, headers)


def from_server(error: ServerError) -> OpenAiError:
    return OpenAiError(error.message, error.http_status)


def failure(exc: Exception) -> HttpResponse:
    """The answer to what an answer's task raised."""
    if isinstance(exc, OpenAiError):
        return openai_error(exc)
    error = server_error(exc)
    if error is not None:
        return openai_error(from_server(error))
    log.error("internal error serving an OpenAI request", exc_info=exc)
    return openai_error(OpenAiError(f"internal error: {type(exc).__name__}: {exc}", 500))


def json_object(body: bytes) -> dict[str, Any]:
    try:
        document = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise OpenAiError(f"request body is not valid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise OpenAiError("request body must be a JSON object")
    return document


def typed(document: dict[str, Any], key: str, kind: type | tuple[type, ...], noun: str) -> Any:
    """`document[key]`, None when absent or null; a 400 naming the key when it is not a `kind`."""
    value = document.get(key)
    if value is not None and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
        raise OpenAiError(f"'{key}' must be {noun}, got {json.dumps(value)[:40]}", param=key)
    return value


def require_model(plane: Plane, name: str) -> None:
    """A 404 in OpenAI's words unless model `name` is ready."""
    if not plane.model_ready(name):
        raise OpenAiError(f"Unknown model: {name}", 404, param="model", code="model_not_found")


def dumps(payload: Any) -> bytes:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
