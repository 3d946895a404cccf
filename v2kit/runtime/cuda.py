"""CUDA device memory that another process exported with an IPC handle (`cudaIpcGetMemHandle`),
opened, read and written here: the server's side of Triton's CUDA shared memory.

cuda-python's runtime bindings (`cuda.bindings.runtime`, the library tritonclient's
`cuda_shared_memory` utilities use) are imported lazily, on the first use: a machine without them,
or without a GPU, still imports this module, and `unavailable_reason` says which is missing and how
to fix it. The bindings' API names are those of cuda-python 12.8+ and 13 alike; an IPC handle's 64
bytes are read and written through `getPtr()`, as cuda-bindings 13 no longer exposes `reserved`.

CUDA cannot open an IPC handle in the process that exported it (`cudaIpcOpenMemHandle` refuses
it), so a client and a server that share memory this way run as two processes.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

from v2kit.runtime import gpu

__all__ = ["HANDLE_BYTES", "CudaError", "IpcMemory", "unavailable_reason"]

#: sizeof(cudaIpcMemHandle_t), CUDA_IPC_HANDLE_SIZE.
HANDLE_BYTES = 64
#: cudaIpcMemLazyEnablePeerAccess, the flag Triton opens handles with.
_LAZY_PEER_ACCESS = 1

_lock = threading.RLock()  # IpcMemory closes itself, under the lock, when opening fails half-way


class CudaError(RuntimeError):
    """A CUDA call failed; the message names the call and CUDA's error."""


def _runtime() -> Any:
    import cuda.bindings.runtime as cudart  # lazily: cuda-python is optional

    return cudart


def _driver() -> Any:
    import cuda.bindings.driver as cuda_driver

    return cuda_driver


def unavailable_reason() -> str | None:
    """Why CUDA shared memory cannot work in this process (with the fix), or None when it can."""
    if gpu.gpu_count() == 0:
        return "no GPU: NVML (pynvml) sees none on this machine"
    try:
        _runtime()
    except ImportError:
        return "cuda-python is not installed; pip install cuda-python (or 'tritonclient[cuda]')"
    return None


def _call(what: str, result: Any) -> Any:
    """The value of a cuda-python call, which answers (error, value...); CudaError if it failed."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise CudaError(f"{what} failed: {getattr(err, 'name', err)}")
    return values[0] if len(values) == 1 else tuple(values)


class IpcMemory:
    """Another process's device allocation, opened from its IPC handle on `device_id`; `size` is the
    allocation's size as the driver knows it (what a registration may not exceed)."""

    __slots__ = ("device_id", "pointer", "size", "_closed")

    def __init__(self, raw_handle: bytes, device_id: int) -> None:
        if len(raw_handle) != HANDLE_BYTES:
            raise ValueError(f"a CUDA IPC handle is {HANDLE_BYTES} bytes, got {len(raw_handle)}")
        cudart = _runtime()
        self.device_id = device_id
        self._closed = True
        with _lock:
            _call("cudaSetDevice", cudart.cudaSetDevice(device_id))
            handle = cudart.cudaIpcMemHandle_t()
            ctypes.memmove(handle.getPtr(), raw_handle, HANDLE_BYTES)
            flags = getattr(cudart, "cudaIpcMemLazyEnablePeerAccess", _LAZY_PEER_ACCESS)
            self.pointer = int(_call("cudaIpcOpenMemHandle", cudart.cudaIpcOpenMemHandle(handle, flags)))
            self._closed = False
            try:
                self.size = _allocation_size(self.pointer)
            except BaseException:
                self.close()
                raise

    def read(self, offset: int, byte_size: int) -> bytes:
        """A host copy of `byte_size` bytes at `offset`."""
        buffer = bytearray(byte_size)
        if byte_size:
            host = (ctypes.c_char * byte_size).from_buffer(buffer)
            self._copy(ctypes.addressof(host), self.pointer + offset, byte_size, "cudaMemcpyDeviceToHost")
        return bytes(buffer)

    def write(self, offset: int, data: bytes) -> None:
        if data:
            host = ctypes.create_string_buffer(data, len(data))
            self._copy(self.pointer + offset, ctypes.addressof(host), len(data), "cudaMemcpyHostToDevice")

    def _copy(self, destination: int, source: int, byte_size: int, kind: str) -> None:
        cudart = _runtime()
        with _lock:
            if self._closed:
                raise CudaError("the CUDA IPC memory is closed")
            _call("cudaSetDevice", cudart.cudaSetDevice(self.device_id))
            copy_kind = getattr(cudart.cudaMemcpyKind, kind)
            _call("cudaMemcpy", cudart.cudaMemcpy(destination, source, byte_size, copy_kind))

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        with _lock:
            if self._closed:
                return
            self._closed = True
            cudart = _runtime()
            _call("cudaSetDevice", cudart.cudaSetDevice(self.device_id))
            _call("cudaIpcCloseMemHandle", cudart.cudaIpcCloseMemHandle(self.pointer))


def _allocation_size(pointer: int) -> int:
    """The size of the allocation `pointer` starts (cuMemGetAddressRange, as Triton checks it)."""
    cuda_driver = _driver()
    try:
        result = cuda_driver.cuMemGetAddressRange(pointer)
    except TypeError:  # bindings that take only a CUdeviceptr
        result = cuda_driver.cuMemGetAddressRange(cuda_driver.CUdeviceptr(pointer))
    base, size = _call("cuMemGetAddressRange", result)
    return int(size) - (pointer - int(base))
