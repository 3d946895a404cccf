"""Triton's system shared memory for the load generator (`--shared-memory system`,
`--output-shared-memory-size`, perf_analyzer's flags and meanings).

What perf_analyzer does (src/infer_data_manager_shm.cc), and so what this does:

- Inputs: one region per input per request-data step (each request perfkit builds from
  `--input-data`), holding that input's bytes (BYTES in Triton's length-prefixed form). Requests
  name the region instead of carrying the data, so the request on the wire is a few hundred bytes
  whatever the tensors' size.
- Outputs: one region per output, `--output-shared-memory-size` bytes times the batch size, which
  every request names for that output: the server writes it there instead of into the response.
  Concurrent requests write over each other, as with perf_analyzer; the load generator never reads
  outputs.
- Lifetime: the regions are POSIX shared-memory objects (`/dev/shm/perfkit_<pid>_...`), created and
  registered before the first request is sent, reused by every request, and unregistered and
  unlinked when the run ends, in a `finally`, so that an interrupted run (Ctrl-C: the event loop
  cancels the run, whose `finally` still awaits the unregistering) leaves nothing registered on the
  server and nothing in /dev/shm. perf_analyzer also unregisters *every* region first; perfkit
  touches only its own, as other clients may be using the server.

The server must offer the extension ("system_shared_memory" in its metadata) and run on this machine:
it opens the regions by key in its own /dev/shm.

`--shared-memory cuda` lays the regions out the same way in device memory on GPU 0 (perf_analyzer's
device; it has no flag to choose another), with tritonclient's `cuda_shared_memory` utilities
(cuda-python underneath): each region is `cudaMalloc`ed, filled from the host, and registered with its
CUDA IPC handle ("cuda_shared_memory" in the server's metadata), then unregistered and freed in the
same `finally`. The server opens the handles, so it runs on this machine, in another process
(CUDA opens no IPC handle in the process that made it), seeing the same GPU. Without a GPU or
cuda-python, `cuda_unsupported` says which, with the fix.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import errno
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np

from perfkit.errors import PerfkitError
from v2kit import codec as v2
from v2kit.runtime import cuda
from v2kit.tensors import tensor_to_raw

__all__ = [
    "CUDA_DEVICE",
    "EXTENSION",
    "EXTENSIONS",
    "SharedMemoryPlan",
    "SharedMemoryRegion",
    "check_extension",
    "cuda_unsupported",
    "plan_regions",
    "registered_regions",
]

EXTENSION = "system_shared_memory"
#: Each `--shared-memory` kind's extension, as the server's metadata lists it.
EXTENSIONS = {"system": EXTENSION, "cuda": "cuda_shared_memory"}
#: The GPU that holds the CUDA regions: perf_analyzer's, device 0.
CUDA_DEVICE = 0
SHM_DIR = "/dev/shm"
UNREGISTER_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class SharedMemoryRegion:
    """A region to create and register: its name (also its key, with a leading "/"), its size and,
    for an input, the bytes it holds."""

    name: str
    byte_size: int
    data: bytes | None = None  # None: an output region, left zeroed

    @property
    def key(self) -> str:
        return f"/{self.name}"


@dataclass(frozen=True, slots=True)
class SharedMemoryPlan:
    regions: tuple[SharedMemoryRegion, ...]
    requests: tuple[v2.InferRequest, ...]  # the same requests, naming the regions instead of data


def _region_params(name: str, byte_size: int) -> dict[str, Any]:
    return {"shared_memory_region": name, "shared_memory_offset": 0, "shared_memory_byte_size": byte_size}


def plan_regions(
    requests: Sequence[v2.InferRequest],
    output_names: Sequence[str],
    *,
    output_size: int,
    batch_size: int,
    prefix: str,
) -> SharedMemoryPlan:
    """The regions for `requests` (one per input per request, one per output) and the requests
    rewritten to name them. `output_names`: the model's outputs, used where a request asks for all."""
    if output_size <= 0:
        raise PerfkitError(f"--output-shared-memory-size must be a positive number of bytes, got {output_size}")
    regions: list[SharedMemoryRegion] = []
    wanted = list(dict.fromkeys(o.name for r in requests for o in r.outputs or ())) or list(output_names)
    out_params: dict[str, dict[str, Any]] = {}
    for index, name in enumerate(wanted):
        region = SharedMemoryRegion(f"{prefix}_out{index}", output_size * batch_size)
        regions.append(region)
        out_params[name] = _region_params(region.name, region.byte_size)
    rewritten = []
    for step, request in enumerate(requests):
        inputs = []
        for index, tensor in enumerate(request.inputs):
            data = tensor_to_raw(tensor.data, tensor.datatype, f"input {tensor.name!r}")
            region = SharedMemoryRegion(f"{prefix}_in{index}_{step}", len(data), data)
            regions.append(region)
            inputs.append(replace(tensor, parameters={**tensor.parameters, **_region_params(region.name, len(data))}))
        outputs = [
            v2.RequestedOutput(o.name, o.binary, {**o.parameters, **out_params[o.name]})
            for o in request.outputs or (v2.RequestedOutput(name) for name in wanted)
        ]
        rewritten.append(replace(request, inputs=inputs, outputs=outputs))
    return SharedMemoryPlan(tuple(regions), tuple(rewritten))


def cuda_unsupported() -> str | None:
    """Why `--shared-memory cuda` cannot run here, with the fix; None when it can."""
    why = cuda.unavailable_reason()
    if why is None:
        try:
            _cuda_utilities()
        except (ImportError, RuntimeError) as exc:  # tritonclient raises RuntimeError without cuda-python
            why = f"tritonclient's CUDA shared memory utilities do not load ({exc}); pip install 'tritonclient[cuda]'"
    if why is None:
        return None
    return f"--shared-memory cuda: {why}; use --shared-memory system with a server on this machine, or none"


def _cuda_utilities() -> Any:
    import tritonclient.utils.cuda_shared_memory as cudashm  # lazily: it needs cuda-python

    return cudashm


class _Registrar(Protocol):
    url: str

    async def register_system_shared_memory(self, name: str, key: str, byte_size: int) -> None: ...
    async def unregister_system_shared_memory(self, name: str) -> None: ...
    async def register_cuda_shared_memory(
        self, name: str, raw_handle: bytes, device_id: int, byte_size: int
    ) -> None: ...
    async def unregister_cuda_shared_memory(self, name: str) -> None: ...


def check_extension(server_metadata: Mapping[str, Any], url: str, kind: str = "system") -> None:
    """Refuse a server that does not list `kind`'s shared memory extension (exit 2, naming the fix)."""
    extensions = [str(e) for e in server_metadata.get("extensions", ()) or ()]
    if EXTENSIONS[kind] not in extensions:
        words = "CUDA" if kind == "cuda" else kind
        raise PerfkitError(
            f"--shared-memory {kind}: the server at {url} does not offer Triton's {words} shared memory extension "
            f"(its extensions: {', '.join(extensions) or 'none'}); drop --shared-memory, or measure a server that "
            "has it"
        )


def _create(region: SharedMemoryRegion) -> None:
    path = os.path.join(SHM_DIR, region.name)
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, region.byte_size)
        # Every page allocated now: where /dev/shm fills up, the run fails here, at once, rather
        # than the server meeting an unallocated page of an output region (SIGBUS in Triton).
        os.posix_fallocate(fd, 0, region.byte_size)
        if region.data:
            view = memoryview(region.data)
            while view:
                view = view[os.write(fd, view) :]
    except BaseException:
        _unlink(region)  # not whole: the caller never knew it, so removes nothing of it
        raise
    finally:
        os.close(fd)


def _room_error(what: str, need: int, free: int | None = None) -> PerfkitError:
    """No room in SHM_DIR for `what` (`need` bytes): what is free, and the fix."""
    if free is None:
        with contextlib.suppress(OSError):
            stats = os.statvfs(SHM_DIR)
            free = stats.f_bavail * stats.f_frsize
    has = "" if free is None else f" ({free} bytes free)"
    return PerfkitError(
        f"--shared-memory system: no room in {SHM_DIR}{has} for {what}, {need} bytes; free space there "
        f"(remove what other runs left in it), make it larger (docker run --shm-size, or mount -o "
        f"remount,size=... {SHM_DIR}), or run without --shared-memory"
    )


def _check_room(regions: Sequence[SharedMemoryRegion]) -> None:
    """Refuse at once, before creating any, regions that SHM_DIR has no room for."""
    try:
        stats = os.statvfs(SHM_DIR)
    except OSError:
        return  # creating them says why
    page = stats.f_frsize or 4096
    need = sum(-(-region.byte_size // page) * page for region in regions)
    free = stats.f_bavail * stats.f_frsize
    if need > free:
        raise _room_error(f"the run's {len(regions)} shared-memory regions", need, free)


def _unlink(region: SharedMemoryRegion) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(SHM_DIR, region.name))


class _SystemRegions:
    """Regions as POSIX shared-memory objects in /dev/shm, registered by key."""

    kind = "system"

    def __init__(self, client: _Registrar) -> None:
        self._client = client

    def check_room(self, regions: Sequence[SharedMemoryRegion]) -> None:
        _check_room(regions)

    def create(self, region: SharedMemoryRegion) -> None:
        try:
            _create(region)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:  # filled since check_room looked
                raise _room_error(f"region {region.name}", region.byte_size) from None
            raise PerfkitError(f"--shared-memory system: cannot create {SHM_DIR}/{region.name}: {exc}") from None

    async def register(self, region: SharedMemoryRegion) -> None:
        await self._client.register_system_shared_memory(region.name, region.key, region.byte_size)

    async def unregister(self, name: str) -> None:
        await self._client.unregister_system_shared_memory(name)

    def destroy(self, region: SharedMemoryRegion) -> None:
        _unlink(region)

    def where(self, region: SharedMemoryRegion) -> str:
        return f"the server must run on this machine, where it opens {SHM_DIR}{region.key}"


class _CudaRegions:
    """Regions in device memory on CUDA_DEVICE (tritonclient's utilities), registered by IPC handle."""

    kind = "cuda"

    def __init__(self, client: _Registrar) -> None:
        self._client = client
        self._cudashm = _cuda_utilities()
        self._handles: dict[str, Any] = {}

    def check_room(self, regions: Sequence[SharedMemoryRegion]) -> None:
        pass  # the device says, region by region (`create`)

    def create(self, region: SharedMemoryRegion) -> None:
        try:
            handle = self._handles[region.name] = self._cudashm.create_shared_memory_region(
                region.name, region.byte_size, CUDA_DEVICE
            )
            if region.data:
                self._cudashm.set_shared_memory_region(handle, [np.frombuffer(region.data, np.uint8)])
        except self._cudashm.CudaSharedMemoryException as exc:
            self.destroy(region)  # allocated but not filled: the caller knows only regions it made whole
            raise PerfkitError(
                f"--shared-memory cuda: cannot create region {region.name} ({region.byte_size} bytes) on GPU "
                f"{CUDA_DEVICE}: {exc}"
            ) from None

    async def register(self, region: SharedMemoryRegion) -> None:
        raw_handle = base64.b64decode(self._cudashm.get_raw_handle(self._handles[region.name]))
        await self._client.register_cuda_shared_memory(region.name, raw_handle, CUDA_DEVICE, region.byte_size)

    async def unregister(self, name: str) -> None:
        await self._client.unregister_cuda_shared_memory(name)

    def destroy(self, region: SharedMemoryRegion) -> None:
        handle = self._handles.pop(region.name, None)
        if handle is not None:
            self._cudashm.destroy_shared_memory_region(handle)

    def where(self, region: SharedMemoryRegion) -> str:
        return f"the server must run on this machine, in another process, and see GPU {CUDA_DEVICE}"


@contextlib.asynccontextmanager
async def registered_regions(
    client: _Registrar, plan: SharedMemoryPlan, kind: str = "system"
) -> AsyncIterator[tuple[v2.InferRequest, ...]]:
    """Create and register `plan`'s regions (`kind`: system or cuda); yield its requests; unregister
    and destroy the regions however the block ends (an error, a cancellation)."""
    regions = _CudaRegions(client) if kind == "cuda" else _SystemRegions(client)
    created: list[SharedMemoryRegion] = []
    registered: list[str] = []
    try:
        regions.check_room(plan.regions)
        for region in plan.regions:
            regions.create(region)
            created.append(region)
        for region in plan.regions:
            registered.append(region.name)  # before the answer: an interrupted call may have registered it
            try:
                await regions.register(region)
            except PerfkitError as exc:
                raise PerfkitError(
                    f"--shared-memory {kind}: the server at {client.url} did not register region {region.name} "
                    f"({exc}); {regions.where(region)}"
                ) from None
        yield plan.requests
    finally:
        try:
            for name in reversed(registered):
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(regions.unregister(name), UNREGISTER_TIMEOUT_S)
        finally:
            for region in created:
                regions.destroy(region)
