"""One load worker of a distributed sweep: a plain LoadGenerator on its own event loop and clock.

`perfkit.load.cluster.distributed` runs this class as a Ray actor (this module never imports Ray, so it loads
without it). The worker builds its own client from the target's settings and its own prepared
requests from the picklable `v2.InferRequest`s: prepared requests hold connection-bound objects and
never cross processes. It records into its own SampleBuffer on its own `perf_counter_ns`; the
driver pulls what is new (`take`) and converts the timestamps to its clock.
"""

from __future__ import annotations

import os
import socket
import time

from perfkit.load.generator import LoadGenerator, RealClock
from perfkit.load.samples import SampleArrays, SampleBuffer
from perfkit.load.schedule import Load, OpenLoop
from perfkit.target import TargetSpec
from perfkit.wire.client import InferClient, make_client
from v2kit import codec as v2

__all__ = ["LoadWorker", "WorkerInfo"]

WorkerInfo = tuple[str, int]  # host name, process id


class LoadWorker:
    """The worker's side of the driver's calls; each method is one remote call."""

    def __init__(self, url: str, target: TargetSpec, requests: list[v2.InferRequest], max_outstanding: int) -> None:
        self._url = url
        self._target = target
        self._requests = requests
        self._max_outstanding = max_outstanding
        self._client: InferClient | None = None
        self._loadgen: LoadGenerator | None = None
        self._buffer = SampleBuffer()
        self._taken = 0
        self._cpu_start_s = 0.0
        self._wall_start_ns = 0

    async def open(self) -> WorkerInfo:
        """Connect the client (in this event loop) and prepare the requests."""
        t = self._target
        client = make_client(
            self._url, t.protocol, request_timeout_s=t.request_timeout_s, headers=dict(t.headers),
            json_tensors=bool(t.json_tensors), binary_outputs=not t.json_outputs, connections=t.max_connections, tls=t.tls,
            compression=t.grpc_compression,
        )  # fmt: skip
        prepared = [client.prepare(r) for r in self._requests]
        self._client = client
        self._loadgen = LoadGenerator(
            client, prepared, self._buffer, RealClock(), max_outstanding=self._max_outstanding
        )
        return socket.gethostname(), os.getpid()

    async def now_ns(self) -> int:
        return time.perf_counter_ns()

    async def start(self, load: Load | None, start_ns: int) -> None:
        """Begin `load` at `start_ns` on this worker's clock (None: this worker sits the level out)."""
        loadgen = self._require()
        await loadgen.clock.sleep_until(start_ns)
        self._cpu_start_s, self._wall_start_ns = time.process_time(), time.perf_counter_ns()
        if load is None:
            return
        loadgen.start(load)
        if isinstance(load, OpenLoop):
            # Every worker's schedule counts from the common start, not from when this one woke
            # (the dispatcher reads started_ns when it first runs, after this returns): the shares
            # stay exact parts of one schedule, and a late wake shows as late sends.
            loadgen.started_ns = start_ns

    async def take(self) -> SampleArrays:
        """The samples recorded since the last call."""
        arrays = self._buffer.arrays(self._taken)
        self._taken += len(arrays)
        return arrays

    async def recorded(self) -> int:
        """How many samples this worker has recorded in all (taken or not)."""
        return len(self._buffer)

    async def stop(self, drain_timeout_s: float | None) -> float | None:
        """Stop the load, wait for requests in flight; the CPU share of one core since `start`."""
        await self._require().stop(drain_timeout_s)
        wall_s = (time.perf_counter_ns() - self._wall_start_ns) / 1e9
        if self._wall_start_ns == 0 or wall_s <= 0:
            return None
        return 100.0 * (time.process_time() - self._cpu_start_s) / wall_s

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    def _require(self) -> LoadGenerator:
        if self._loadgen is None:
            raise RuntimeError("the load worker is not open: call open() first")
        return self._loadgen
