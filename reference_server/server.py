"""ReferenceServer: the listeners and the lifecycle. `start()` returns once every listener is bound,
with the real ports set (port 0 picks a free one); `serve_forever()` is for the command line."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import ssl
import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from aiohttp import web

from reference_server.config import ServerConfig
from reference_server.core.dataplane import DataPlane
from reference_server.core.poller import RepositoryPoller
from reference_server.core.repository import ModelRepository
from reference_server.core.response_cache import ResponseCache
from reference_server.errors import ServerError
from reference_server.frontends.auth import Token
from reference_server.frontends.grpc.server import GrpcServer
from reference_server.frontends.grpc.service import InferenceServicer
from reference_server.frontends.http.read_gate import ReadGate
from reference_server.frontends.http.rest import build_rest_server
from reference_server.frontends.http.server import HttpServer
from reference_server.frontends.metrics import build_metrics_app
from reference_server.scheduling.rate_limiter import RateLimiter
from v2kit.runtime import gpu

log = logging.getLogger(__name__)


class ReferenceServer:
    def __init__(self, config: ServerConfig) -> None:
        config.validate()
        self.config = config
        self.repository: ModelRepository | None = None
        self.dataplane: DataPlane | None = None
        self.http_port: int | None = None
        self.metrics_port: int | None = None
        self.grpc_port: int | None = None
        self._runners: list[web.AppRunner] = []
        self._http: HttpServer | None = None
        self._poller: RepositoryPoller | None = None
        self._grpc_server: GrpcServer | None = None
        self._token = Token(config.auth_token) if config.auth_token is not None else None
        self._ssl = _server_ssl_context(config)

    @property
    def http_url(self) -> str:
        return f"{self.config.host}:{self.http_port}"

    async def start(self) -> None:
        config = self.config
        self.repository = ModelRepository(
            config.model_repository,
            gpu_count=gpu.gpu_count(),
            default_max_batch_size=config.default_max_batch_size,
            backend_config=config.backend_config,
        )
        if config.response_cache_bytes is not None:
            self.repository.response_cache = ResponseCache(config.response_cache_bytes)
        if config.rate_limit == "execution_count":
            self.repository.rate_limiter = RateLimiter(config.rate_limit_resources)
        self.dataplane = DataPlane(
            self.repository,
            model_control_mode=config.model_control_mode,
            strict_readiness=config.strict_readiness,
            max_inflight_requests=config.max_inflight_requests,
            max_tensor_elements=config.max_tensor_elements,
            server_name=config.server_name,
        )
        if config.model_control_mode == "explicit":
            await self.repository.load_all(self.repository.resolve_load_models(config.load_models))
        else:
            await self.repository.load_all()
        if config.model_control_mode == "poll":
            self._poller = RepositoryPoller(self.repository, config.repository_poll_secs)
            await self._poller.start()
        try:
            if config.allow_http:
                gate = ReadGate(config.http_read_pause_inflight) if config.http_read_pause_inflight else None
                self._http = build_rest_server(
                    self.dataplane,
                    max_request_bytes=config.http_max_input_size,
                    token=self._token,
                    read_gate=gate,
                    body_timeout_s=config.http_body_timeout_secs,
                    access_log=log if config.log_verbose > 0 else None,
                    limits=config.http_limits,
                )
                self.http_port = await self._http.listen(config.host, config.http_port, self._ssl)
                print(f"Started HTTPService at {config.host}:{self.http_port}", flush=True)
            if config.allow_grpc:
                self.grpc_port = await self._listen_grpc(self.dataplane, config.grpc_port)
                print(f"Started GRPCInferenceService at {config.host}:{self.grpc_port}", flush=True)
            if config.allow_metrics:
                self.metrics_port = await self._listen(build_metrics_app(self.repository), config.metrics_port)
                print(f"Started Metrics Service at {config.host}:{self.metrics_port}", flush=True)
        except BaseException:
            await self.stop(grace_s=0)
            raise

    async def _listen(self, app: web.Application, port: int) -> int:
        runner = web.AppRunner(
            app,
            access_log=log if self.config.log_verbose > 0 else None,
            shutdown_timeout=self.config.exit_timeout_secs,
        )
        await runner.setup()
        self._runners.append(runner)
        site = web.TCPSite(runner, self.config.host, port, reuse_address=True)
        await site.start()
        bound: Any = runner.addresses[-1]
        return int(bound[1])

    async def _listen_grpc(self, plane: DataPlane, port: int) -> int:
        # One size limit for both front ends: --http-max-input-size also caps gRPC messages.
        server = GrpcServer(
            InferenceServicer(plane), max_message_bytes=self.config.http_max_input_size, token=self._token
        )
        self._grpc_server = server  # set first, so that stop() cleans up after a failed bind
        host = self.config.host
        try:
            return await server.listen(host, port, _server_ssl_context(self.config, alpn="h2"))
        except OSError as exc:
            address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            raise OSError(
                exc.errno, f"cannot bind the gRPC listener to {address} (--grpc-port): {exc.strerror}"
            ) from exc

    async def stop(self, grace_s: float | None = None) -> None:
        """Stop accepting, let in-flight requests finish within the grace period, then unload."""
        grace = self.config.exit_timeout_secs if grace_s is None else grace_s
        poller, self._poller = self._poller, None
        if poller is not None:
            await poller.stop()  # first: no model may be (re)loaded while the server winds down
        if self.dataplane is not None:
            self.dataplane.accepting = False
        grpc_server, self._grpc_server = self._grpc_server, None
        if grpc_server is not None:
            await grpc_server.stop(grace)
        http, self._http = self._http, None
        if http is not None:
            await http.stop(grace)
        runners, self._runners = self._runners, []
        for runner in runners:
            await runner.cleanup()
        if self.repository is not None:
            await self.repository.close(grace)
        if self.dataplane is not None:
            self.dataplane.shared_memory.close()  # unmaps what no request holds any more

    async def serve_forever(self) -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await self.start()
        # The last startup line: a parent process waiting on our stdout may proceed.
        print("Server ready", flush=True)
        await stop.wait()
        log.info("shutting down: finishing in-flight requests (up to %ss)", self.config.exit_timeout_secs)
        await self.stop()


def _server_ssl_context(config: ServerConfig, alpn: str | None = None) -> ssl.SSLContext | None:
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


@contextlib.contextmanager
def running_server(config: ServerConfig, *, start_timeout_s: float = 120.0) -> Iterator[ReferenceServer]:
    """Run a ReferenceServer on its own event loop in a background thread (for synchronous callers:
    tests with blocking clients, command-line probes). The server is stopped on exit."""
    server = ReferenceServer(config)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="reference-server", daemon=True)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(server.start(), loop).result(start_timeout_s)
        yield server
    finally:
        try:
            asyncio.run_coroutine_threadsafe(server.stop(grace_s=5.0), loop).result(60)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
            loop.close()


def free_port_config(config: ServerConfig) -> ServerConfig:
    """The same configuration with every port set to 0 (bind free ports)."""
    return replace(config, http_port=0, grpc_port=0, metrics_port=0)
