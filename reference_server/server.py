"""ReferenceServer: the listeners and the lifecycle. `start()` returns once every listener is bound,
with the real ports set (port 0 picks a free one); `serve_forever()` is for the command line."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from aiohttp import web

from reference_server.config import AUTO_FRONTEND_WORKERS, ServerConfig, auto_frontend_workers
from reference_server.core.dataplane import DataPlane
from reference_server.core.log_settings import LogSettings
from reference_server.core.poller import RepositoryPoller
from reference_server.core.repository import ModelRepository
from reference_server.core.response_cache import ResponseCache
from reference_server.core.tracing import Tracing, startup_settings
from reference_server.frontends.auth import Token
from reference_server.frontends.grpc.server import GrpcServer
from reference_server.frontends.http.server import HttpServer
from reference_server.frontends.metrics import build_metrics_app
from reference_server.scheduling.rate_limiter import RateLimiter
from reference_server.scheduling.summaries import SummarizedStats
from reference_server.startup import ModelsFailed, load_at_start
from reference_server.workers.frontends import build_grpc, build_http, listen_grpc, server_ssl_context
from reference_server.workers.hosting import WorkerHosting, hostable_instance_counts
from reference_server.workers.plane_server import PlaneServer
from reference_server.workers.process import START_TIMEOUT_S as WORKER_START_TIMEOUT_S
from reference_server.workers.process import FrontendWorkers
from v2kit.runtime import gpu

log = logging.getLogger(__name__)

#: How often a server that started not ready looks again, to say "Server ready" once it is.
READY_POLL_S = 0.25


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
        self._workers: FrontendWorkers | None = None
        self._plane_server: PlaneServer | None = None
        self._plane_dir: tempfile.TemporaryDirectory[str] | None = None
        self._token = Token(config.auth_token) if config.auth_token is not None else None
        #: What the logging and trace extensions report and change (`__main__` installs the log).
        self.log_settings = LogSettings(
            str(config.log_file or ""), config.log_info, config.log_warning, config.log_error, config.log_verbose,
            config.log_format,
        )  # fmt: skip
        self.tracing = Tracing(startup_settings(config.trace_config))
        self._ssl = server_ssl_context(config)

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
            auto_complete_config=config.auto_complete_config,
            model_config_name=config.model_config_name,
            more_roots=config.more_model_repositories,
            namespacing=config.model_namespacing,
        )
        if config.response_cache_bytes is not None:
            self.repository.response_cache = ResponseCache(config.response_cache_bytes)
        if config.rate_limit == "execution_count":
            self.repository.rate_limiter = RateLimiter(config.rate_limit_resources)
        if config.metrics_summary_latencies:
            self.repository.new_stats = SummarizedStats
        self.dataplane = DataPlane(
            self.repository,
            model_control_mode=config.model_control_mode,
            strict_readiness=config.strict_readiness,
            max_inflight_requests=config.max_inflight_requests,
            max_tensor_elements=config.max_tensor_elements,
            server_name=config.server_name,
            log_settings=self.log_settings,
            tracing=self.tracing,
        )
        for flag, why in config.no_effect_flags:
            log.warning("%s has no effect on this server: %s", flag, why)
        explicit = config.model_control_mode == "explicit"
        try:
            await load_at_start(
                self.repository,
                self.repository.resolve_load_models(config.load_models) if explicit else None,
                threads=config.model_load_thread_count,
                retries=config.model_load_retry_count,
                exit_on_error=config.exit_on_error,
            )
        except ModelsFailed:
            await self.stop(grace_s=0)  # the models that did load, and their stubs
            raise
        if config.frontend_workers == AUTO_FRONTEND_WORKERS:
            counts = hostable_instance_counts(self.repository, config)
            config = self.config = replace(config, frontend_workers=auto_frontend_workers(instance_counts=counts))
            log.info("--frontend-workers auto: %d (models the workers could run have %s instances)",
                     config.frontend_workers, counts or "no")  # fmt: skip
        if config.model_control_mode == "poll":
            self._poller = RepositoryPoller(self.repository, config.repository_poll_secs)
            await self._poller.start()
        try:
            if config.frontend_workers > 1:
                await self._start_workers(self.dataplane)
            else:
                if config.allow_http:
                    self._http = build_http(config, self.dataplane, self._token)
                    self.http_port = await self._http.listen(
                        config.host, config.http_port, self._ssl, reuse_port=config.reuse_http_port
                    )
                if config.allow_grpc:
                    self._grpc_server = build_grpc(config, self.dataplane, self._token)
                    self.grpc_port = await listen_grpc(
                        self._grpc_server, config, config.grpc_port, reuse_port=config.reuse_grpc_port
                    )
            if config.allow_http:
                print(f"Started HTTPService at {config.host}:{self.http_port}", flush=True)
            if config.allow_grpc:
                print(f"Started GRPCInferenceService at {config.grpc_host}:{self.grpc_port}", flush=True)
            if config.allow_metrics:
                app = build_metrics_app(
                    self.repository, self.dataplane.stats_of, gpu=config.allow_gpu_metrics,
                    cpu=config.allow_cpu_metrics, counter_latencies=config.metrics_counter_latencies,
                    interval_s=None if config.metrics_interval_ms is None else config.metrics_interval_ms / 1000,
                    summary_quantiles=config.metrics_summary_quantiles if config.metrics_summary_latencies else None,
                )  # fmt: skip
                self.metrics_port = await self._listen(app, config.metrics_port)
                print(f"Started Metrics Service at {config.metrics_host}:{self.metrics_port}", flush=True)
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
        site = web.TCPSite(runner, self.config.metrics_host, port, reuse_address=True)
        await site.start()
        bound: Any = runner.addresses[-1]
        return int(bound[1])

    async def _start_workers(self, plane: DataPlane) -> None:
        """The front ends in `--frontend-workers` processes of their own, calling `plane` here."""
        self._plane_dir = tempfile.TemporaryDirectory(prefix="reference-server-")
        hosting = WorkerHosting(plane, self.config)
        await hosting.sync()  # what the workers run, from the models loaded; each is told once connected
        self._plane_server = PlaneServer(plane, os.path.join(self._plane_dir.name, "plane.sock"), hosting)
        await self._plane_server.start()
        self._workers = FrontendWorkers(self.config, self._plane_server.path)
        self.http_port, self.grpc_port = await self._workers.start()
        try:  # so that the first requests already run where they will
            await asyncio.wait_for(hosting.settled(), WORKER_START_TIMEOUT_S)
        except asyncio.TimeoutError:
            log.warning("not every front-end worker runs its models yet; until it does, the core runs them")
        log.info("front ends in %d worker processes (--frontend-workers)", self.config.frontend_workers)

    async def stop(self, grace_s: float | None = None) -> None:
        """Stop accepting, let in-flight requests finish within the grace period, then unload."""
        grace = self.config.exit_timeout_secs if grace_s is None else grace_s
        poller, self._poller = self._poller, None
        if poller is not None:
            await poller.stop()  # first: no model may be (re)loaded while the server winds down
        if self.dataplane is not None:
            self.dataplane.accepting = False
        workers, self._workers = self._workers, None
        if workers is not None:
            await workers.stop(grace)
        grpc_server, self._grpc_server = self._grpc_server, None
        if grpc_server is not None:
            await grpc_server.stop(grace)
        http, self._http = self._http, None
        if http is not None:
            await http.stop(grace)
        plane_server, self._plane_server = self._plane_server, None
        if plane_server is not None:
            await plane_server.stop()
        if self._plane_dir is not None:
            self._plane_dir.cleanup()
            self._plane_dir = None
        runners, self._runners = self._runners, []
        for runner in runners:
            await runner.cleanup()
        if self.repository is not None:
            await self.repository.close(grace)
        if self.dataplane is not None:
            self.dataplane.shared_memory.close()  # unmaps what no request holds any more
        self.tracing.close()  # the traces held are written, the trace file closed

    async def serve_forever(self) -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await self.start()
        announcing = asyncio.create_task(self.announce_readiness())
        await stop.wait()
        announcing.cancel()
        log.info("shutting down: finishing in-flight requests (up to %ss)", self.config.exit_timeout_secs)
        await self.stop()

    async def announce_readiness(self) -> None:
        """Say "Server ready" on standard output (the last startup line: a parent process waiting on
        it may proceed) once /v2/health/ready answers 200, and not before. A server that starts not
        ready (--strict-readiness true and a model that failed to load) says "Server not ready"
        there instead, logs each model that keeps it so and why, and says "Server ready" once they
        serve (loaded through the repository API, or mended in poll mode)."""
        plane, repository = self.dataplane, self.repository
        assert plane is not None and repository is not None
        if not plane.ready():
            waiting = repository.not_ready()
            for name, state, reason in waiting:
                log.error("model '%s' is %s%s: it keeps the server not ready", name, state,
                          f" ({reason})" if reason else "")  # fmt: skip
            names = ", ".join(f"'{name}'" for name, _, _ in waiting)
            log.warning("Server not ready: /v2/health/ready answers 400 until %s %s ready "
                        "(--strict-readiness true; false: ready while the server is up)",
                        names or "every model", "is" if len(waiting) == 1 else "are")  # fmt: skip
            print(f"Server not ready: {names or 'shutting down'}", flush=True)
            # Readiness follows loads from the repository API, poll mode and the models themselves, with
            # no one event to wait on; four looks a second, only while the server is not ready.
            while not plane.ready():  # noqa: ASYNC110
                await asyncio.sleep(READY_POLL_S)
            log.info("Server ready: every model the repository was asked to load serves")
        print("Server ready", flush=True)


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
