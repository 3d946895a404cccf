"""The front ends, built from the server's configuration over a `Plane`: in the core process over
its DataPlane, or in a front-end worker process over a RemotePlane (`workers/`)."""

from __future__ import annotations

import logging
import ssl
from functools import partial

from reference_server.config import ServerConfig
from reference_server.errors import ServerError
from reference_server.frontends.auth import Token
from reference_server.frontends.compression import coding_for_level
from reference_server.frontends.forwarding import HeaderForwarding
from reference_server.frontends.grpc.server import GrpcServer
from reference_server.frontends.grpc.service import InferenceServicer
from reference_server.frontends.http.read_gate import ReadGate
from reference_server.frontends.http.rest import build_rest_server
from reference_server.frontends.http.server import HttpServer
from reference_server.frontends.plane import Plane
from reference_server.frontends.restricted import Restrictions

__all__ = ["build_grpc", "build_http", "grpc_ssl_context", "listen_grpc", "server_ssl_context"]

log = logging.getLogger("reference_server.server")


def build_http(config: ServerConfig, plane: Plane, token: Token | None) -> HttpServer:
    """The REST front end over `plane`, not yet listening."""
    gate = ReadGate(config.http_read_pause_inflight) if config.http_read_pause_inflight else None
    server = build_rest_server(
        plane,
        max_request_bytes=config.http_max_input_size,
        token=token,
        read_gate=gate,
        body_timeout_s=config.http_body_timeout_secs,
        access_log=log if config.log_verbose > 0 else None,
        limits=config.http_limits,
        header_forward=HeaderForwarding.of(config.http_header_forward_pattern),
        restricted=Restrictions.for_http(config.http_restricted_api),
    )
    server.tracing = plane.tracing
    return server


def build_grpc(config: ServerConfig, plane: Plane, token: Token | None) -> GrpcServer:
    """The gRPC front end over `plane`, not yet listening. One size limit for both front ends:
    --http-max-input-size also caps gRPC messages."""
    server = GrpcServer(
        InferenceServicer(plane),
        max_message_bytes=config.http_max_input_size,
        token=token,
        header_forward=HeaderForwarding.of(config.grpc_header_forward_pattern),
        restricted=Restrictions.for_grpc(config.grpc_restricted_protocol),
        max_streams=config.grpc_max_concurrent_streams,
        h2_limits=config.grpc_http2_limits,
        reply_coding=partial(coding_for_level, config.grpc_response_compression)
        if config.grpc_response_compression != "none"
        else None,
    )
    server.tracing = plane.tracing
    return server


async def listen_grpc(server: GrpcServer, config: ServerConfig, port: int, *, reuse_port: bool = False) -> int:
    host = config.grpc_host
    context = grpc_ssl_context(config) if config.grpc_ssl else server_ssl_context(config, alpn="h2")
    try:
        return await server.listen(host, port, context, reuse_port=reuse_port)
    except OSError as exc:
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        raise OSError(exc.errno, f"cannot bind the gRPC listener to {address} (--grpc-port): {exc.strerror}") from exc


def grpc_ssl_context(config: ServerConfig) -> ssl.SSLContext:
    """TLS on the gRPC listener alone (--grpc-use-ssl), requiring a client certificate signed by
    --grpc-root-cert with --grpc-use-ssl-mutual."""
    assert config.grpc_server_cert is not None and config.grpc_server_key is not None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(config.grpc_server_cert, config.grpc_server_key)
        if config.grpc_use_ssl_mutual and config.grpc_root_cert is not None:
            context.load_verify_locations(config.grpc_root_cert)
            context.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as exc:
        raise ServerError(
            f"--grpc-server-cert {config.grpc_server_cert} / --grpc-server-key {config.grpc_server_key}"
            f"{f' / --grpc-root-cert {config.grpc_root_cert}' if config.grpc_use_ssl_mutual else ''}: cannot use "
            f"them for TLS: {exc}"
        ) from None
    context.set_alpn_protocols(["h2"])
    return context


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
