"""The front ends, built from the server's configuration over a `Plane`: in the core process over
its DataPlane, or in a front-end worker process over a RemotePlane (`workers/`)."""

from __future__ import annotations

import logging
import ssl

from reference_server.config import ServerConfig
from reference_server.errors import ServerError
from reference_server.frontends.auth import Token
from reference_server.frontends.grpc.server import GrpcServer
from reference_server.frontends.grpc.service import InferenceServicer
from reference_server.frontends.http.read_gate import ReadGate
from reference_server.frontends.http.rest import build_rest_server
from reference_server.frontends.http.server import HttpServer
from reference_server.frontends.plane import Plane

__all__ = ["build_grpc", "build_http", "listen_grpc", "server_ssl_context"]

log = logging.getLogger("reference_server.server")


def build_http(config: ServerConfig, plane: Plane, token: Token | None) -> HttpServer:
    """The REST front end over `plane`, not yet listening."""
    gate = ReadGate(config.http_read_pause_inflight) if config.http_read_pause_inflight else None
    return build_rest_server(
        plane,
        max_request_bytes=config.http_max_input_size,
        token=token,
        read_gate=gate,
        body_timeout_s=config.http_body_timeout_secs,
        access_log=log if config.log_verbose > 0 else None,
        limits=config.http_limits,
    )


def build_grpc(config: ServerConfig, plane: Plane, token: Token | None) -> GrpcServer:
    """The gRPC front end over `plane`, not yet listening. One size limit for both front ends:
    --http-max-input-size also caps gRPC messages."""
    return GrpcServer(InferenceServicer(plane), max_message_bytes=config.http_max_input_size, token=token)


async def listen_grpc(server: GrpcServer, config: ServerConfig, port: int, *, reuse_port: bool = False) -> int:
    host = config.host
    try:
        return await server.listen(host, port, server_ssl_context(config, alpn="h2"), reuse_port=reuse_port)
    except OSError as exc:
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        raise OSError(exc.errno, f"cannot bind the gRPC listener to {address} (--grpc-port): {exc.strerror}") from exc


def server_ssl_context(config: ServerConfig, alpn: str | None = None) -> ssl.SSLContext | None:
    """TLS for a listener (and a check of the pair before anything listens), or None. gRPC's
    listener offers ALPN `h2`, which gRPC clients require."""
    if config.ssl_certfile is None or config.ssl_keyfile is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(config.ssl_certfile, config.ssl_keyfile)
    except (OSError, ssl.SSLError) as exc:
        raise ServerError(
            f"--ssl-certfile {config.ssl_certfile} / --ssl-keyfile {config.ssl_keyfile}: cannot use them as a "
            f"certificate and its key: {exc}"
        ) from None
    if alpn is not None:
        context.set_alpn_protocols([alpn])
    return context
