"""Front-end worker processes: how the core starts, watches and stops them (`FrontendWorkers`), and
what each one runs (`main`, as `python -m reference_server.workers.process`).

The core reserves the HTTP and gRPC ports first (bound with SO_REUSEPORT, never listening), so that
port 0 resolves once and nobody else takes the port between the workers' binds; each worker then
listens on the same ports with SO_REUSEPORT and the kernel spreads connections over them. A worker
reads its configuration from its standard input, says `Worker ready` on its standard output once it
listens, and ends when told (SIGTERM, SIGINT) or when the core's connection closes, so a core that
dies leaves no listener behind. A worker that dies while the server runs is started again, as a
supervisor does: after a delay that doubles with each death in a short window (`Restarts`), and not
at all once it has died that often in that window (a crash loop; the others serve on).

A worker started again runs the code installed *now*, with the core's configuration pickled by the
code the core started with: after a package upgrade the two disagree (a field renamed, moved or
added), and the worker failed on the first use of the config, again at every restart. So the core
sends, before the config, each source file of reference_server and v2kit with its content's hash as
it was at its start (`code_files`, ~140 files, a few ms); a worker that finds other files on disk
exits with CODE_CHANGED_EXIT before it unpickles anything, and the core logs which files changed and
does not start that worker again.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import pickle
import signal
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import reference_server
import v2kit
from reference_server.config import ServerConfig
from reference_server.core.log_settings import LogSettings, install
from reference_server.errors import ServerError
from reference_server.frontends.auth import Token
from reference_server.frontends.listener import Listener
from reference_server.workers.frontends import build_grpc, build_http, listen_grpc, server_ssl_context
from reference_server.workers.local_models import LocalModels, remove_counters_of
from reference_server.workers.remote_plane import connect

__all__ = ["FrontendWorkers", "main"]

log = logging.getLogger(__name__)

READY_LINE = b"Worker ready"
START_TIMEOUT_S = 60.0
#: A worker that died is started again after RESTART_DELAY_S, doubled for each other death within
#: CRASH_LOOP_WINDOW_S, up to RESTART_DELAY_MAX_S; CRASH_LOOP_DEATHS deaths in that window is a crash
#: loop, and the worker is not started again.
RESTART_DELAY_S = 0.1
RESTART_DELAY_MAX_S = 5.0
CRASH_LOOP_WINDOW_S = 60.0
CRASH_LOOP_DEATHS = 5
#: How a worker that runs other code than its core's exits: not a crash, and not started again.
CODE_CHANGED_EXIT = 3
# What precedes the core's code files (JSON, one line) on a worker's standard input.
_CODE_LINE = b"reference_server code files: "


class CodeChanged(ServerError):
    """A worker found other code installed than its core started with."""


def code_files() -> dict[str, str]:
    """Each source or extension file of reference_server and v2kit ("v2kit/codec.py") -> the
    sha256 of its content: the code a worker must share with its core. Contents, not file times: an
    install sets those in any order."""
    files: dict[str, str] = {}
    for package in (reference_server, v2kit):
        root = Path(package.__file__ or "").parent
        for folder, subfolders, names in os.walk(root):
            subfolders[:] = sorted(name for name in subfolders if name != "__pycache__")
            for name in names:
                if name.endswith((".py", ".so", ".pyd")):
                    path = Path(folder, name)
                    digest = hashlib.sha256(path.read_bytes()).hexdigest()
                    files[f"{root.name}/{path.relative_to(root).as_posix()}"] = digest
    return files


def code_changes(then: Mapping[str, str], now: Mapping[str, str]) -> list[str]:
    """The files changed, added or removed between two `code_files`, sorted."""
    return sorted(path for path in then.keys() | now.keys() if then.get(path) != now.get(path))


def code_changed_text(changed: list[str]) -> str:
    """Why a worker cannot serve for its core: the files that changed (three named), and the fix."""
    named = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
    what = f"{named} differs" if len(changed) == 1 else f"{named or 'its code files'} differ"
    return f"reference_server changed since the server started ({what}); restart the server"


class Restarts:
    """When one worker that died is started again: the deaths it had lately decide the delay."""

    def __init__(self) -> None:
        self._deaths: list[float] = []

    def delay_after_death(self, now: float) -> float | None:
        """Seconds to wait before starting the worker again after a death at `now` (monotonic);
        None when it is in a crash loop (CRASH_LOOP_DEATHS deaths within CRASH_LOOP_WINDOW_S)."""
        self._deaths = [t for t in self._deaths if now - t < CRASH_LOOP_WINDOW_S] + [now]
        if len(self._deaths) >= CRASH_LOOP_DEATHS:
            return None
        return float(min(RESTART_DELAY_S * 2 ** (len(self._deaths) - 1), RESTART_DELAY_MAX_S))


class FrontendWorkers:
    def __init__(self, config: ServerConfig, plane_path: str) -> None:
        self.config = config
        self.plane_path = plane_path
        self._reserved: list[socket.socket] = []
        self._processes: list[asyncio.subprocess.Process | None] = [None] * config.frontend_workers
        self._watchers: set[asyncio.Task[None]] = set()
        self._restarts = [Restarts() for _ in range(config.frontend_workers)]
        self._stopping = False
        self.restarts = 0
        self._code = code_files()  # the code this core runs, which every worker must run too

    async def start(self) -> tuple[int | None, int | None]:
        """Reserve the ports, start every worker and wait until each listens; the ports bound."""
        config = self.config
        http_port = self._reserve(config.host, config.http_port) if config.allow_http else None
        grpc_port = self._reserve(config.grpc_host, config.grpc_port) if config.allow_grpc else None
        self.config = replace(config, http_port=http_port or 0, grpc_port=grpc_port or 0)
        try:
            await asyncio.gather(*(self._start(index) for index in range(len(self._processes))))
        except BaseException:
            await self.stop(0)
            raise
        return http_port, grpc_port

    def _reserve(self, host: str, port: int) -> int:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        reserved = socket.socket(family, kind, proto)
        reserved.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        reserved.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            reserved.bind(address)
        except OSError:
            reserved.close()
            raise
        self._reserved.append(reserved)
        return int(reserved.getsockname()[1])

    async def _start(self, index: int) -> None:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "reference_server.workers.process",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        self._processes[index] = process
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(_CODE_LINE + json.dumps(self._code).encode() + b"\n")
        process.stdin.write(pickle.dumps((self.config, self.plane_path, index)))
        process.stdin.close()
        try:
            await asyncio.wait_for(_ready(process.stdout), START_TIMEOUT_S)
        except (asyncio.TimeoutError, EOFError):
            try:
                code = await asyncio.wait_for(process.wait(), 5.0)
            except asyncio.TimeoutError:  # it hangs: a worker started again must not leave it behind
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                code = await process.wait()
            if code == CODE_CHANGED_EXIT:
                changed = code_changes(self._code, code_files())
                raise CodeChanged(f"front-end worker {index}: {code_changed_text(changed)}") from None
            raise ServerError(
                f"front-end worker {index} did not start (exit code {code}; its error is above); "
                "run with --frontend-workers 1 to serve from one process"
            ) from None
        watcher = asyncio.get_running_loop().create_task(self._watch(index, process))
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)

    async def _watch(self, index: int, process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None
        await process.stdout.read()  # its output until it ends (nothing is expected after the ready line)
        ended = f"exited with {await process.wait()}"
        if left := remove_counters_of(process.pid):
            log.warning("front-end worker %d left statistics files; removed %s", index, ", ".join(left))
        while not self._stopping:
            delay = self._restarts[index].delay_after_death(time.monotonic())
            if delay is None:
                log.error(
                    "front-end worker %d %s, its %d exits within %.0f s: a crash loop; not starting it again "
                    "(the other workers serve on; restart the server once the cause is fixed)",
                    index, ended, CRASH_LOOP_DEATHS, CRASH_LOOP_WINDOW_S,
                )  # fmt: skip
                return
            log.error("front-end worker %d %s; starting it again in %.1f s", index, ended, delay)
            await asyncio.sleep(delay)
            if self._stopping:
                return
            self.restarts += 1
            try:
                await self._start(index)
                return
            except CodeChanged as exc:  # it would run other code at every start: one error, no loop
                log.error("%s; not starting it again (the other workers serve on)", exc)
                return
            except ServerError as exc:  # it died starting: that counts as a death too
                if not self._stopping:
                    log.error("%s", exc)
                ended = "did not start"

    async def stop(self, grace_s: float) -> None:
        """Tell every worker to stop (they let what they serve finish within `grace_s`), then wait."""
        self._stopping = True
        running = [p for p in self._processes if p is not None and p.returncode is None]
        for process in running:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        for process in running:
            try:
                await asyncio.wait_for(process.wait(), grace_s + 5.0)
            except asyncio.TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
        for watcher in list(self._watchers):
            watcher.cancel()
        for reserved in self._reserved:
            reserved.close()
        self._reserved.clear()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._processes if p is not None and p.returncode is None]


async def _ready(stdout: asyncio.StreamReader) -> None:
    while True:
        line = await stdout.readline()
        if not line:
            raise EOFError
        if line.strip() == READY_LINE:
            return


async def serve(config: ServerConfig, plane_path: str, index: int) -> None:
    """One worker: the front ends on the shared ports over a RemotePlane, until told to stop."""
    local = LocalModels(config) if config.worker_instances else None
    # Requests run here take no slot in the core: this worker admits its share of the limit.
    limit = -(-config.max_inflight_requests // config.frontend_workers) if local is not None else 0
    plane = await connect(plane_path, index, local, limit)
    token = Token(config.auth_token) if config.auth_token is not None else None
    listeners: list[Listener] = []
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        if config.allow_http:
            http = build_http(config, plane, token)
            listeners.append(http)
            await http.listen(config.host, config.http_port, server_ssl_context(config), reuse_port=True)
        if config.allow_grpc:
            grpc = build_grpc(config, plane, token)
            listeners.append(grpc)
            await listen_grpc(grpc, config, config.grpc_port, reuse_port=True)
        sys.stdout.buffer.write(READY_LINE + b"\n")
        sys.stdout.flush()
        lost = loop.create_task(plane.closed.wait())
        told = loop.create_task(stop.wait())
        await asyncio.wait((lost, told), return_when=asyncio.FIRST_COMPLETED)
        lost.cancel()
        told.cancel()
        plane.accepting = False
    finally:
        grace = 0.0 if plane.closed.is_set() else config.exit_timeout_secs
        await asyncio.gather(*(listener.stop(grace) for listener in listeners))
        plane.close()
        if local is not None:
            await local.close(0.0)


def main() -> int:
    core_code, pickled = _core_code(sys.stdin.buffer.read())
    # Checked before the config is unpickled: pickled by other code, it may load into other fields.
    if core_code is None:  # a core that predates this check: its code cannot be this one
        print(f"error: front-end worker: {code_changed_text([])}", file=sys.stderr)
        return CODE_CHANGED_EXIT
    if code_changes(core_code, code_files()):
        return CODE_CHANGED_EXIT  # the core names the files and does not start this worker again
    config, plane_path, index = pickle.loads(pickled)
    # The core's log settings at start, in the same format and file; the core tells the logging
    # extension's later changes (`RemotePlane._settings`).
    install(LogSettings(str(config.log_file or ""), config.log_info, config.log_warning, config.log_error,
                        config.log_verbose, config.log_format))  # fmt: skip
    from v2kit.runtime.eventloop import run

    try:
        run(serve(config, plane_path, index))
    except ServerError as exc:
        print(f"error: front-end worker {index}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: front-end worker {index}: cannot start listening: {exc}", file=sys.stderr)
        return 1
    return 0


def _core_code(payload: bytes) -> tuple[dict[str, str] | None, bytes]:
    """The core's `code_files` and the pickled config, from what a worker reads on its stdin."""
    if not payload.startswith(_CODE_LINE):
        return None, payload
    line, _, pickled = payload.partition(b"\n")
    return json.loads(line[len(_CODE_LINE) :]), pickled


if __name__ == "__main__":
    sys.exit(main())
