"""Optional bearer-token authentication, shared by the HTTP middleware and the gRPC interceptor.

With a token configured (`--auth-token` or `--auth-token-file`), every endpoint except the health
probes wants `Authorization: Bearer <token>` (HTTP header or gRPC metadata `authorization`).
Liveness and readiness stay open, as Kubernetes probes and load balancers call them without
credentials and they reveal nothing but "up". The metrics port is not covered: like Triton's, it
serves Prometheus in the clear; keep it on loopback or turn it off (`--allow-metrics false`).

The comparison is constant-time (`hmac.compare_digest`), and the token is never logged: `Token`
prints as `Token(***)`, and failures say only what was wrong with the header's shape.
"""

from __future__ import annotations

import hmac
from pathlib import Path

from reference_server.errors import ServerError

__all__ = ["OPEN_GRPC_METHODS", "OPEN_HTTP_PATHS", "Token", "Unauthenticated", "read_token_file"]

#: Health probes answer without a token (HTTP paths, gRPC full method names).
OPEN_HTTP_PATHS = frozenset({"/v2/health/live", "/v2/health/ready"})
OPEN_GRPC_METHODS = frozenset(
    {"/inference.GRPCInferenceService/ServerLive", "/inference.GRPCInferenceService/ServerReady"}
)


class Unauthenticated(ServerError):
    http_status = 401
    grpc_code = "UNAUTHENTICATED"


class Token:
    """A bearer token that checks `Authorization` values and never shows itself."""

    __slots__ = ("_expected",)

    def __init__(self, secret: str) -> None:
        if not secret or secret != secret.strip() or any(c in secret for c in "\r\n\x00"):
            raise ServerError("the auth token must be non-empty, without surrounding spaces or control characters")
        self._expected = secret.encode()

    def __repr__(self) -> str:
        return "Token(***)"

    def check(self, authorization: str | None) -> None:
        """Raise Unauthenticated unless `authorization` is `Bearer <the token>`."""
        if not authorization:
            raise Unauthenticated("authentication required: send 'Authorization: Bearer <token>'")
        scheme, _, credentials = authorization.strip().partition(" ")
        if scheme.lower() != "bearer":
            raise Unauthenticated("authentication required: the Authorization scheme must be Bearer")
        # Constant time whatever the length and content, so the answer's timing tells nothing.
        if not hmac.compare_digest(credentials.strip().encode("utf-8", "surrogateescape"), self._expected):
            raise Unauthenticated("authentication failed: the bearer token is not valid")


def read_token_file(path: Path) -> str:
    """The token in `path` (surrounding whitespace, such as a final newline, is dropped)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ServerError(f"--auth-token-file {path}: cannot read the token: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        # Not quoted: the error's text would carry bytes of the secret.
        raise ServerError(f"--auth-token-file {path}: the file is not UTF-8 text") from None
    token = text.strip()
    if not token:
        raise ServerError(f"--auth-token-file {path}: the file is empty")
    return token
