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
  pages past the end of the file, which is SIGBUS, and the end of the server.
* **Lifetime.** A request holds every region it names from its start until its outputs are
  written (`RequestBinding.release`). Unregistering a region that a request holds removes its
  name at once (new requests no longer find it; the name may be registered again) and unmaps it
  when the last holder lets go, as Triton's `awaiting_unregister_` does: no request has the
  mapping pulled out from under it.
* **Copies.** An input is copied out of its region before the request is validated, so that the
  model never sees bytes the client changes while the request runs, and a region can be
  overlapped by another, as Triton allows (two names for windows of one object): the last write
  wins, as in any shared memory.
* **Threads.** The front ends call this on the event loop; a lock still guards the registry, as
  Triton's mutex does, so that a backend thread may look regions up too.

Errors carry Triton's wording (`src/shared_memory_manager.cc`, checked against Triton 2.51's
answers) with what to change after it, and Triton's status, except where Triton answers a client's
mistake with INTERNAL (a key that cannot be opened, an output region too small): those are
INVALID_ARGUMENT (400) here, as every bad request is. CUDA shared memory needs CUDA IPC, which this
server does not implement: its status lists no region, unregistering succeeds, and registering
answers Triton's INVALID_ARG saying so; the server metadata therefore does not list
"cuda_shared_memory".
"""

from __future__ import annotations

import errno
import mmap
import os
import stat
import threading
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from reference_server.errors import AlreadyExists, InvalidArgument, NotFound
from v2kit import codec as v2
from v2kit.runtime import gpu
from v2kit.tensors import element_count, tensor_from_raw, tensor_to_raw

__all__ = ["MAX_NAME_CHARS", "MAX_REGIONS", "Region", "RequestBinding", "SharedMemoryRegistry", "SHM_DIR"]

#: Where Linux keeps POSIX shared-memory objects: `shm_open("/key")` opens SHM_DIR/key.
SHM_DIR = "/dev/shm"

#: Each region holds a descriptor and a mapping; a client cannot make the server hold more.
MAX_REGIONS = 1024
#: Longest region name: the registry keeps names, so their size is bounded too.
MAX_NAME_CHARS = 1024


class Region:
    """One registered window of a shared-memory object, mapped while registered or held."""

    __slots__ = ("name", "key", "offset", "byte_size", "_fd", "_map", "_start", "users", "retired")

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
        """Triton's bounds check of a tensor's window, relative to the region."""
        if offset >= self.byte_size:
            raise InvalidArgument(
                f"Invalid offset for shared memory region: '{self.name}' (offset {offset}, the region holds "
                f"{self.byte_size} bytes)"
            )
        if offset + byte_size > self.byte_size:
            raise InvalidArgument(
                f"Invalid offset + byte size for shared memory region: '{self.name}' (offset {offset} + "
                f"byte size {byte_size} > the region's {self.byte_size} bytes)"
            )

    def read(self, offset: int, byte_size: int) -> bytes:
        """A copy of `byte_size` bytes at `offset` (checked with `check_window` first)."""
        self._check_object()
        start = self._start + offset
        return self._map[start : start + byte_size]

    def write(self, offset: int, data: bytes) -> None:
        self._check_object()
        start = self._start + offset
        self._map[start : start + len(data)] = data

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


class SharedMemoryRegistry:
    """The system shared-memory regions of one server, by name."""

    def __init__(self, max_regions: int = MAX_REGIONS) -> None:
        self._regions: dict[str, Region] = {}
        self._lock = threading.Lock()
        self._max_regions = max_regions

    # --- the extension's three calls -------------------------------------------------------------

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        if not name or len(name) > MAX_NAME_CHARS:
            raise InvalidArgument(
                f"a shared memory region needs a name of 1 to {MAX_NAME_CHARS} characters, got {len(name)}"
            )
        for field, value in (("offset", offset), ("byte_size", byte_size)):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
                raise InvalidArgument(
                    f"failed to register shared memory region '{name}': {field} must be an integer >= 0, got {value!r}"
                )
        if byte_size == 0:
            raise InvalidArgument(
                f"failed to register shared memory region '{name}': invalid args: byte_size must be greater than 0"
            )
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
            self._regions[name] = Region(name, key, offset, byte_size)

    def status(self, name: str = "") -> list[dict[str, Any]]:
        """Every region's status, or the named one's (NotFound, in Triton's words, if none)."""
        with self._lock:
            if not name:
                return [region.status() for region in self._regions.values()]
            region = self._regions.get(name)
        if region is None:
            raise NotFound(f"Unable to find system shared memory region: '{name}'")
        return [region.status()]

    def unregister(self, name: str = "") -> None:
        """Unregister one region, or all of them with no name. An unknown name is no error (Triton's
        answer too): the region is not registered afterwards either way."""
        with self._lock:
            if name:
                region = self._regions.pop(name, None)
                retired = [] if region is None else [region]
            else:
                retired, self._regions = list(self._regions.values()), {}
            for region in retired:
                region.retired = True
                if not region.users:
                    region.close()

    def close(self) -> None:
        """Unregister everything (the server is stopping)."""
        self.unregister()

    # --- requests --------------------------------------------------------------------------------

    def acquire(self, name: str) -> Region:
        """The region `name`, held until `release`: it stays mapped even if unregistered meanwhile."""
        with self._lock:
            region = self._regions.get(name)
            if region is None:  # the request is what is wrong here: 400, where Triton answers 404
                raise InvalidArgument(f"Unable to find shared memory region: '{name}'; register it before naming it")
            region.users += 1
            return region

    def release(self, regions: Iterable[Region]) -> None:
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

    # --- CUDA shared memory: not offered ---------------------------------------------------------

    def cuda_register(self, name: str) -> None:
        gpus = gpu.gpu_count()
        reason = "no GPU" if not gpus else f"{gpus} GPU(s), but this server does not implement CUDA IPC"
        # Triton answers a registration it cannot open with INVALID_ARG (HTTP 400).
        raise InvalidArgument(
            f"failed to register CUDA shared memory region '{name}': CUDA shared memory is not available on "
            f"this server ({reason}); use system shared memory (/v2/systemsharedmemory) instead"
        )

    def cuda_status(self, name: str = "") -> list[dict[str, Any]]:
        """No CUDA region is ever registered; a name is not found, in Triton's words."""
        if not name:
            return []
        with self._lock:
            system = name in self._regions
        if system:
            raise NotFound(f"The region named '{name}' is registered as system shared memory, not CUDA shared memory")
        raise NotFound(f"Unable to find cuda shared memory region: '{name}'")

    def cuda_unregister(self, name: str = "") -> None:
        """Nothing to unregister; Triton answers success, and so do we."""


class RequestBinding:
    """The regions one request holds, and where its outputs go."""

    __slots__ = ("_registry", "_held", "outputs")

    def __init__(self, registry: SharedMemoryRegistry) -> None:
        self._registry = registry
        self._held: list[Region] = []
        self.outputs: dict[str, tuple[Region, v2.SharedMemoryRef]] = {}

    def hold(self, ref: v2.SharedMemoryRef) -> Region:
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


def _ref(parameters: dict[str, Any], kind: str, name: str) -> v2.SharedMemoryRef | None:
    return v2.shared_memory_ref(parameters, f"{kind} '{name}'")


def _read_input(region: Region, ref: v2.SharedMemoryRef, tensor: v2.InferTensor, model: str) -> np.ndarray:
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
