"""Triton's shared memory extensions: the registry of system shared-memory regions, and the binding
of one inference request's tensors to them.

A client creates a POSIX shared-memory object (`shm_open("/key")`, a file in /dev/shm), registers
a window of it under a name (key, offset, byte size), and then names that region in a request:
an input's bytes are read from `shared_memory_region` at `shared_memory_offset` for
`shared_memory_byte_size` bytes, and an output is written there instead of into the response.
BYTES tensors are in Triton's length-prefixed form, as in binary tensor data.

Theory of operation:

* **Mapping.** A region maps its window of the object at registration, from the page boundary at
  or below its offset (so, unlike Triton 2.51, an offset need not be page-aligned), and keeps the
  object's descriptor open. Before every read or write the object's size is checked with `fstat`:
  a client that shrinks the object after registering it would otherwise make the server touch
  pages past the end of the file, which is SIGBUS, and the end of the server. Outputs are written
  with `pwrite`, not through the mapping, for the same reason: a page the client never allocated
  (ftruncate alone) cannot be stored into when /dev/shm is full, and `pwrite` fails that request
  (ENOSPC) where a store would be SIGBUS.
* **Lifetime.** A request holds every region it names from its start until its outputs are
  written (`RequestBinding.release`). Unregistering a region that a request holds is refused, as
  Triton 2.51 refuses it (INTERNAL, "Cannot unregister shared memory region 'NAME', it is currently
  in use."); unregistering all of them unregisters those no request holds and names the others
  ("Failed to unregister the following system shared memory regions: ..."). Only the server's
  stop retires a held region anyway: its name goes at once and it is unmapped when the last holder
  lets go, so no request has the mapping pulled out from under it.
* **Copies.** An input is copied out of its region before the request is validated, so that the
  model never sees bytes the client changes while the request runs, and a region can be
  overlapped by another, as Triton allows (two names for windows of one object): the last write
  wins, as in any shared memory.
* **Threads.** The front ends call this on the event loop; a lock still guards the registry, as
  Triton's mutex does, so that a backend thread may look regions up too.

* **CUDA.** A CUDA region is device memory a client process exported with an IPC handle
  (`cudaIpcGetMemHandle`); registering it opens the handle on its device (`v2kit/runtime/cuda.py`,
  cuda-python), refusing a byte size past the allocation as Triton does. Our backends take host
  tensors, so an input in a CUDA region is copied to the host before the request is validated, as a
  system one is, and an output is copied into its region after the model. Both kinds share one
  namespace of names (Triton's one map), and each extension's status and unregister see only its
  own kind. Without a GPU or without cuda-python, registering answers Triton's INVALID_ARG saying
  which, and the server metadata does not list "cuda_shared_memory".

Errors carry Triton's wording (`src/shared_memory_manager.cc`, checked against Triton 2.51's
answers) with what to change after it, and Triton's status, except where Triton answers a client's
mistake with INTERNAL (a key that cannot be opened, an output region too small): those are
INVALID_ARGUMENT (400) here, as every bad request is.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import stat
import threading
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import numpy as np

from reference_server.errors import AlreadyExists, InternalError, InvalidArgument, NotFound
from v2kit import codec as v2
from v2kit.runtime import cuda
from v2kit.tensors import element_count, tensor_from_raw, tensor_to_raw

log = logging.getLogger(__name__)

__all__ = ["MAX_NAME_CHARS", "MAX_REGIONS", "CudaRegion", "Region", "RequestBinding", "SharedMemoryRegistry", "SHM_DIR"]

#: Where Linux keeps POSIX shared-memory objects: `shm_open("/key")` opens SHM_DIR/key.
SHM_DIR = "/dev/shm"

#: Each region holds a descriptor and a mapping; a client cannot make the server hold more.
MAX_REGIONS = 1024
#: Longest region name: the registry keeps names, so their size is bounded too.
MAX_NAME_CHARS = 1024


class Region:
    """One registered window of a shared-memory object, mapped while registered or held."""

    __slots__ = ("name", "key", "offset", "byte_size", "_fd", "_map", "_start", "users", "retired")

    kind = "system"

    def __init__(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self.name, self.key, self.offset, self.byte_size = name, key, offset, byte_size
        self._fd = _open_key(key)
        try:
            size = _file_size(self._fd, key)
            if offset + byte_size > size:
                raise InvalidArgument(
                    f"failed to register shared memory region '{name}': invalid args: offset {offset} + "
                    f"byte_size {byte_size} is past the end of shared-memory key '{key}' ({size} bytes); "
                    "register a window inside the object"
                )
            aligned = offset - offset % mmap.ALLOCATIONGRANULARITY
            try:
                self._map = mmap.mmap(self._fd, offset - aligned + byte_size, offset=aligned)
            except (OSError, ValueError) as exc:
                raise InvalidArgument(f"failed to register shared memory region '{name}': {exc}") from None
            self._start = offset - aligned
        except BaseException:
            os.close(self._fd)
            raise
        #: Requests holding the region, and whether it was unregistered while they did.
        self.users = 0
        self.retired = False

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}

    def check_window(self, offset: int, byte_size: int) -> None:
        _check_window(self.name, self.byte_size, offset, byte_size)

    def read(self, offset: int, byte_size: int) -> bytes:
        """A copy of `byte_size` bytes at `offset` (checked with `check_window` first)."""
        self._check_object()
        start = self._start + offset
        return self._map[start : start + byte_size]

    def write(self, offset: int, data: bytes) -> None:
        # pwrite, not the mapping: a client may register an object whose pages are not allocated
        # (ftruncate alone, as tritonclient's utilities make them), and when /dev/shm is full a
        # store into such a page is SIGBUS, the end of the server; pwrite answers ENOSPC.
        self._check_object()
        view, at = memoryview(data).cast("B"), self.offset + offset
        try:
            while view:
                written = os.pwrite(self._fd, view, at)
                view, at = view[written:], at + written
        except OSError as exc:
            raise InternalError(
                f"shared memory region '{self.name}': cannot write {len(data)} bytes of output to key '{self.key}': "
                f"{exc.strerror}; free space in {SHM_DIR}, or allocate the object's pages when creating it "
                "(posix_fallocate)"
            ) from None

    def _check_object(self) -> None:
        size = _file_size(self._fd, self.key)
        if size < self.offset + self.byte_size:
            raise InvalidArgument(
                f"shared memory region '{self.name}': key '{self.key}' shrank to {size} bytes, short of the "
                f"registered offset {self.offset} + byte size {self.byte_size}; unregister the region and "
                "register it again"
            )

    @property
    def closed(self) -> bool:
        """Whether the region is unmapped (unregistered, and no request holds it any more)."""
        return self._map.closed

    def close(self) -> None:
        self._map.close()
        os.close(self._fd)


class CudaRegion:
    """One registered CUDA region: a client's device allocation, opened from its IPC handle while
    registered or held."""

    __slots__ = ("name", "device_id", "byte_size", "_memory", "users", "retired")

    kind = "cuda"

    def __init__(self, name: str, raw_handle: bytes, device_id: int, byte_size: int, opener: CudaOpener) -> None:
        self.name, self.device_id, self.byte_size = name, device_id, byte_size
        try:
            self._memory = opener(raw_handle, device_id)
        except (cuda.CudaError, ValueError) as exc:
            # Triton logs CUDA's error and answers the client only "invalid args"; ours says both.
            raise InvalidArgument(
                f"failed to register CUDA shared memory region '{name}': invalid args: cannot open the CUDA IPC "
                f"handle on device {device_id} ({exc}); send the handle cudaIpcGetMemHandle gave, from another "
                "process, for a device this server sees"
            ) from None
        if byte_size > self._memory.size:
            self._memory.close()
            raise InvalidArgument(
                f"failed to register shared memory region '{name}': invalid args: byte_size {byte_size} is past "
                f"the end of the CUDA allocation ({self._memory.size} bytes); register at most its size"
            )
        self.users = 0
        self.retired = False

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "device_id": self.device_id, "byte_size": self.byte_size}

    def check_window(self, offset: int, byte_size: int) -> None:
        _check_window(self.name, self.byte_size, offset, byte_size)

    def read(self, offset: int, byte_size: int) -> bytes:
        return self._memory.read(offset, byte_size)

    def write(self, offset: int, data: bytes) -> None:
        self._memory.write(offset, data)

    @property
    def closed(self) -> bool:
        return self._memory.closed

    def close(self) -> None:
        try:
            self._memory.close()
        except cuda.CudaError as exc:  # the region is gone from the registry either way
            log.warning("CUDA shared memory region '%s' did not close cleanly: %s", self.name, exc)


class CudaMemory(Protocol):
    """What a CUDA region needs of opened device memory (`v2kit.runtime.cuda.IpcMemory`)."""

    @property
    def size(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    def read(self, offset: int, byte_size: int) -> bytes: ...
    def write(self, offset: int, data: bytes) -> None: ...
    def close(self) -> None: ...


CudaOpener = Callable[[bytes, int], CudaMemory]
AnyRegion = Region | CudaRegion

#: The words of each extension, for a name registered as the other kind and for an unknown one.
_KIND_WORDS = {"system": "system shared memory", "cuda": "CUDA shared memory"}


class SharedMemoryRegistry:
    """The shared-memory regions of one server, system and CUDA, by name."""

    def __init__(
        self,
        max_regions: int = MAX_REGIONS,
        cuda_opener: CudaOpener = cuda.IpcMemory,
        cuda_unavailable: Callable[[], str | None] = cuda.unavailable_reason,
    ) -> None:
        self._regions: dict[str, AnyRegion] = {}
        self._lock = threading.Lock()
        self._max_regions = max_regions
        self._cuda_opener = cuda_opener
        self._cuda_unavailable = cuda_unavailable
        self._cuda_reason: list[str | None] = []  # found out once, at the first question

    def cuda_unavailable(self) -> str | None:
        """Why CUDA regions cannot be registered here (no GPU, no cuda-python), or None when they can."""
        if not self._cuda_reason:
            self._cuda_reason.append(self._cuda_unavailable())
        return self._cuda_reason[0]

    def cuda_available(self) -> bool:
        """Whether CUDA regions can be registered here: the server lists "cuda_shared_memory" only then."""
        return self.cuda_unavailable() is None

    # --- the extensions' calls -------------------------------------------------------------------

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        _check_name(name, "system")
        for field, value in (("offset", offset), ("byte_size", byte_size)):
            _check_size(name, field, value)
        if byte_size == 0:
            raise InvalidArgument(
                f"failed to register shared memory region '{name}': invalid args: byte_size must be greater than 0"
            )
        self._add(name, lambda: Region(name, key, offset, byte_size))

    def cuda_register(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        _check_name(name, "cuda")
        for field, value in (("device_id", device_id), ("byte_size", byte_size)):
            _check_size(name, field, value)
        if len(raw_handle) != cuda.HANDLE_BYTES:
            raise InvalidArgument(
                f"failed to register CUDA shared memory region '{name}': 'raw_handle' must be a valid base64 "
                f"encoded cudaIpcMemHandle_t ({cuda.HANDLE_BYTES} bytes, got {len(raw_handle)})"
            )
        if byte_size == 0:
            raise InvalidArgument(
                f"failed to register shared memory region '{name}': invalid args: byte_size must be greater than 0"
            )
        reason = self.cuda_unavailable()
        if reason is not None:
            # Triton answers a registration it cannot open with INVALID_ARG (HTTP 400).
            raise InvalidArgument(
                f"failed to register CUDA shared memory region '{name}': CUDA shared memory is not available on "
                f"this server ({reason}); use system shared memory (/v2/systemsharedmemory) instead"
            )
        self._add(name, lambda: CudaRegion(name, raw_handle, device_id, byte_size, self._cuda_opener))

    def _add(self, name: str, make: Callable[[], AnyRegion]) -> None:
        with self._lock:
            if name in self._regions:
                raise AlreadyExists(
                    f"shared memory region '{name}' already in manager; unregister it first to register it again"
                )
            if len(self._regions) >= self._max_regions:
                raise InvalidArgument(
                    f"failed to register shared memory region '{name}': the server already holds "
                    f"{self._max_regions} regions, its limit; unregister some first"
                )
            self._regions[name] = make()

    def status(self, name: str = "") -> list[dict[str, Any]]:
        """Every system region's status, or the named one's (NotFound, in Triton's words, if none)."""
        return self._status("system", name)

    def cuda_status(self, name: str = "") -> list[dict[str, Any]]:
        return self._status("cuda", name)

    def _status(self, kind: str, name: str) -> list[dict[str, Any]]:
        with self._lock:
            if not name:
                return [region.status() for region in self._regions.values() if region.kind == kind]
            region = self._regions.get(name)
        if region is None:
            unknown = "system" if kind == "system" else "cuda"
            raise NotFound(f"Unable to find {unknown} shared memory region: '{name}'")
        if region.kind != kind:
            raise NotFound(
                f"The region named '{name}' is registered as {_KIND_WORDS[region.kind]}, not {_KIND_WORDS[kind]}"
            )
        return [region.status()]

    def unregister(self, name: str = "") -> None:
        """Unregister one system region, or all of them with no name. An unknown name is no error
        (Triton's answer too): the region is not registered afterwards either way. A region a
        request holds stays, and is named in an InternalError (Triton 2.51's words)."""
        self._unregister("system", name)

    def cuda_unregister(self, name: str = "") -> None:
        self._unregister("cuda", name)

    def _unregister(self, kind: str | None, name: str) -> None:
        busy: list[str] = []
        with self._lock:
            if name:
                region = self._regions.get(name)
                if region is not None and region.kind == kind and region.users:
                    raise InternalError(f"Cannot unregister shared memory region '{name}', it is currently in use.")
                retired = [] if region is None or region.kind != kind else [self._regions.pop(name)]
            else:
                retired = [r for r in self._regions.values() if kind is None or r.kind == kind]
                if kind is not None:  # the server's stop (kind None) retires held regions too
                    busy = sorted(r.name for r in retired if r.users)
                    retired = [r for r in retired if not r.users]
                for region in retired:
                    del self._regions[region.name]
            for region in retired:
                region.retired = True
                if not region.users:
                    region.close()
        if busy:
            # Triton's list, each name followed by " ," (shared_memory_manager.cc UnregisterAll).
            raise InternalError(
                f"Failed to unregister the following {'system' if kind == 'system' else 'cuda'} shared memory "
                f"regions: {''.join(n + ' ,' for n in busy)}"
            )

    def close(self) -> None:
        """Unregister everything, of both kinds (the server is stopping)."""
        self._unregister(None, "")

    # --- requests --------------------------------------------------------------------------------

    def acquire(self, name: str) -> AnyRegion:
        """The region `name`, held until `release`: it stays mapped even if unregistered meanwhile."""
        with self._lock:
            region = self._regions.get(name)
            if region is None:  # the request is what is wrong here: 400, where Triton answers 404
                raise InvalidArgument(f"Unable to find shared memory region: '{name}'; register it before naming it")
            region.users += 1
            return region

    def release(self, regions: Iterable[AnyRegion]) -> None:
        with self._lock:
            for region in regions:
                region.users -= 1
                if region.retired and not region.users:
                    region.close()

    def bind(
        self, request: v2.InferRequest, check: Callable[[v2.InferRequest], None] | None = None
    ) -> RequestBinding | None:
        """Read `request`'s inputs out of their regions (in place) and hold the regions its outputs
        name; None when it names none, the common case, which costs a look at each tensor.

        `check(request)` runs first when an input is in shared memory: the server's limits on what a
        request may hold, which the size of a request body bounds for the others.
        """
        # Most tensors carry no parameters at all: only those that do are looked at closely.
        inputs = [(t, ref) for t in request.inputs if t.parameters and (ref := _ref(t.parameters, "input", t.name))]
        outputs = [
            (o.name, ref)
            for o in request.outputs or ()
            if o.parameters and (ref := _ref(o.parameters, "output", o.name))
        ]
        if not inputs and not outputs:
            return None
        if inputs and check is not None:
            check(request)
        binding = RequestBinding(self)
        try:
            for tensor, ref in inputs:
                region = binding.hold(ref)
                tensor.data = _read_input(region, ref, tensor, request.model_name)
            for name, ref in outputs:
                binding.outputs[name] = (binding.hold(ref), ref)
        except BaseException:
            binding.release()
            raise
        return binding


class RequestBinding:
    """The regions one request holds, and where its outputs go."""

    __slots__ = ("_registry", "_held", "outputs")

    def __init__(self, registry: SharedMemoryRegistry) -> None:
        self._registry = registry
        self._held: list[AnyRegion] = []
        self.outputs: dict[str, tuple[AnyRegion, v2.SharedMemoryRef]] = {}

    def hold(self, ref: v2.SharedMemoryRef) -> AnyRegion:
        region = self._registry.acquire(ref.region)
        self._held.append(region)
        region.check_window(ref.offset, ref.byte_size)
        return region

    def write(self, response: v2.InferResponse) -> v2.InferResponse:
        """Write the outputs that go to shared memory there. The response still lists them, with the
        region in their parameters and no data; the encoders send them without either, as Triton does."""
        if not self.outputs:
            return response
        outputs = []
        for tensor in response.outputs:
            target = self.outputs.get(tensor.name)
            if target is None:
                outputs.append(tensor)
                continue
            region, ref = target
            data = tensor_to_raw(tensor.data, tensor.datatype, f"output '{tensor.name}'")
            if len(data) > ref.byte_size:
                # Triton's words; its status is INTERNAL (it finds out in its output allocator),
                # but the client sized the region, so a client error here.
                raise InvalidArgument(
                    f"shared memory size specified with the request for output '{tensor.name}' ({ref.byte_size} "
                    f"bytes) should be at least {len(data)} bytes to hold the results"
                )
            region.write(ref.offset, data)
            parameters = {
                "shared_memory_region": ref.region,
                "shared_memory_offset": ref.offset,
                "shared_memory_byte_size": ref.byte_size,
            }
            outputs.append(v2.InferTensor(tensor.name, tensor.datatype, tensor.shape, _EMPTY, parameters))
        response.outputs = outputs
        return response

    def release(self) -> None:
        held, self._held = self._held, []
        self._registry.release(held)


_EMPTY = np.empty(0, np.uint8)


def _check_name(name: str, kind: str) -> None:
    if not name:
        # Triton's HTTP words (its gRPC front end does not check); the same here over both.
        raise InvalidArgument(f"'region name' is necessary to register {kind} shared memory region")
    if len(name) > MAX_NAME_CHARS:
        raise InvalidArgument(
            f"a shared memory region needs a name of 1 to {MAX_NAME_CHARS} characters, got {len(name)}"
        )


def _check_size(name: str, field: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise InvalidArgument(
            f"failed to register shared memory region '{name}': {field} must be an integer >= 0, got {value!r}"
        )


def _check_window(name: str, region_size: int, offset: int, byte_size: int) -> None:
    """Triton's bounds check of a tensor's window, relative to the region."""
    if offset >= region_size:
        raise InvalidArgument(
            f"Invalid offset for shared memory region: '{name}' (offset {offset}, the region holds {region_size} bytes)"
        )
    if offset + byte_size > region_size:
        raise InvalidArgument(
            f"Invalid offset + byte size for shared memory region: '{name}' (offset {offset} + "
            f"byte size {byte_size} > the region's {region_size} bytes)"
        )


def _ref(parameters: dict[str, Any], kind: str, name: str) -> v2.SharedMemoryRef | None:
    return v2.shared_memory_ref(parameters, f"{kind} '{name}'")


def _read_input(region: AnyRegion, ref: v2.SharedMemoryRef, tensor: v2.InferTensor, model: str) -> np.ndarray:
    what = f"input '{tensor.name}'"
    if tensor.datatype != "BYTES":
        expected = element_count(tensor.shape, what) * v2.datatype_to_numpy(tensor.datatype, what).itemsize
        if expected != ref.byte_size:
            raise InvalidArgument(
                f"input byte size mismatch for input '{tensor.name}' for model '{model}'. "
                f"Expected {expected}, got {ref.byte_size}"
            )
    return tensor_from_raw(region.read(ref.offset, ref.byte_size), tensor.datatype, tensor.shape, tensor.name)


def _open_key(key: str) -> int:
    # shm_open's names: one leading '/', then a file name in SHM_DIR; nothing that walks elsewhere.
    base = key[1:] if key.startswith("/") else key
    # Triton answers these INTERNAL; a key the client got wrong is a client error here (400).
    if not base or "/" in base or "\0" in base or base in (".", ".."):
        raise InvalidArgument(
            f"Unable to open shared memory region: '{key}': a key is '/' and a name without '/', as shm_open takes it"
        )
    try:
        fd = os.open(os.path.join(SHM_DIR, base), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        hint = f"no such key in {SHM_DIR}; create it (shm_open) first" if exc.errno == errno.ENOENT else exc.strerror
        raise InvalidArgument(f"Unable to open shared memory region: '{key}': {hint}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise InvalidArgument(f"Unable to open shared memory region: '{key}': not a shared-memory object")
    return fd


def _file_size(fd: int, key: str) -> int:
    try:
        return os.fstat(fd).st_size
    except OSError:
        raise InvalidArgument(f"Invalid shared memory region: '{key}'") from None
