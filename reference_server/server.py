"""ReferenceServer: the listeners and the lifecycle. `start()` returns once every listener is bound,
with the real ports set (port 0 picks a free one); `serve_forever()` is for the command line."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from aiohttp import web

from reference_server import gpu
from reference_server.config import ServerConfig
from reference_server.dataplane import DataPlane
from reference_server.metrics import build_metrics_app
from reference_server.repository import ModelRepository
from reference_server.rest import build_rest_app

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

    @property
    def http_url(self) -> str:
        return f"{self.config.host}:{self.http_port}"

    async def start(self) -> None:
        config = self.config
        self.repository = ModelRepository(
            config.model_repository,
            gpu_count=gpu.gpu_count(),
            default_max_batch_size=config.default_max_batch_size,
        )
        self.dataplane = DataPlane(
            self.repository,
            model_control_mode=config.model_control_mode,
            strict_readiness=config.strict_readiness,
        )
        if config.model_control_mode == "explicit":
            names = self.repository.model_names() if "*" in config.load_models else list(config.load_models)
            await self.repository.load_all(names)
        else:
            await self.repository.load_all()
        try:
            if config.allow_http:
                app = build_rest_app(self.dataplane, max_request_bytes=config.http_max_input_size)
                self.http_port = await self._listen(app, config.http_port)
                print(f"Started HTTPService at {config.host}:{self.http_port}", flush=True)
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

    async def stop(self, grace_s: float | None = None) -> None:
        """Stop accepting, let in-flight requests finish within the grace period, then unload."""
        grace = self.config.exit_timeout_secs if grace_s is None else grace_s
        if self.dataplane is not None:
            self.dataplane.accepting = False
        runners, self._runners = self._runners, []
        for runner in runners:
            await runner.cleanup()
        if self.repository is not None:
            await self.repository.close(grace)

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
