"""DLPack for `pb_utils.Tensor`: what a model hands `Tensor.from_dlpack` (a "dltensor" capsule, as
`torch.utils.dlpack.to_dlpack` makes, or any object with `__dlpack__` and `__dlpack_device__`), on
the CPU or on a CUDA device, as Triton's python backend takes it (src/pb_tensor.cc, FromDLPack).

A CPU tensor becomes a numpy array over the same memory. A CUDA tensor stays on its device, held by
the framework that made it (torch or CuPy, whichever takes it: the model imported one of them to
put it there), until the stub sends the response, which crosses to the server through host memory.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["CPU", "CUDA", "CUDA_HOST", "DlpackError", "GpuTensor", "from_dlpack"]

# DLDeviceType values (dlpack.h).
CPU = 1
CUDA = 2
CUDA_HOST = 3

NOT_CONTIGUOUS = (
    "DLPack tensor is not contiguous. Only contiguous DLPack tensors that are stored in C-Order are supported."
)


class DlpackError(ValueError):
    """What the model handed over cannot be a tensor; the message is Triton's."""


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLTensorHead(ctypes.Structure):
    """The start of DLTensor, up to its device: all a capsule is opened for here."""

    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice)]


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_valid.restype = ctypes.c_int
_capsule_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _is_capsule(value: Any) -> bool:
    return type(value).__name__ == "PyCapsule"


class _Capsule:
    """A legacy "dltensor" capsule as an object with `__dlpack__`, the form numpy, torch and CuPy take."""

    __slots__ = ("capsule", "device")

    def __init__(self, capsule: Any) -> None:
        if not _capsule_valid(capsule, b"dltensor"):
            raise DlpackError("the DLPack capsule was already used: a capsule can make one tensor only")
        # DLManagedTensor starts with its DLTensor, which starts with the data pointer and the device.
        head = _DLTensorHead.from_address(_capsule_pointer(capsule, b"dltensor"))
        self.capsule = capsule
        self.device = (int(head.device.device_type), int(head.device.device_id))

    def __dlpack__(self, stream: Any = None, **_: Any) -> Any:
        return self.capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.device


class GpuTensor:
    """A tensor on a CUDA device, held by the framework that took it (torch or CuPy)."""

    __slots__ = ("value", "device_id", "shape", "dtype")

    def __init__(self, value: Any, device_id: int) -> None:
        self.value = value
        self.device_id = device_id
        self.shape = [int(size) for size in value.shape]
        self.dtype: np.dtype[Any] = _numpy_dtype(value)

    def host(self) -> npt.NDArray[Any]:
        """A copy in host memory."""
        if type(self.value).__module__.startswith("cupy"):
            return np.asarray(self.value.get())
        return np.asarray(self.value.detach().cpu().numpy())

    def to_dlpack(self, **kwargs: Any) -> Any:
        """A capsule over the device memory (`kwargs`: those of `__dlpack__`, stream among them)."""
        return self.value.__dlpack__(**kwargs)


def _numpy_dtype(value: Any) -> np.dtype[Any]:
    dtype = value.dtype
    if isinstance(dtype, np.dtype):
        return dtype
    import torch  # a torch tensor: the numpy type of an empty CPU tensor of its dtype

    try:
        numpy_dtype: np.dtype[Any] = np.dtype(torch.empty(0, dtype=dtype).numpy().dtype)
        return numpy_dtype
    except TypeError as error:  # bfloat16 and the like
        raise DlpackError(f"DLPack tensor of {dtype} has no Triton data type this server can send") from error


def from_dlpack(value: Any) -> npt.NDArray[Any] | GpuTensor:
    """A numpy array over a CPU tensor's memory, or a GpuTensor for one on a CUDA device."""
    source = _Capsule(value) if _is_capsule(value) else value
    if not hasattr(source, "__dlpack__") or not hasattr(source, "__dlpack_device__"):
        # Triton's words, with the run of spaces its C++ line continuation puts inside them.
        raise DlpackError(
            "Provided tensor is not supported. Tensor must be a DLPack capsule         or have `__dlpack__` and "
            "`__dlpack_device__` attributes"
        )
    device_type, device_id = source.__dlpack_device__()
    if device_type == CUDA:
        gpu = GpuTensor(_on_gpu(source), int(device_id))
        if not _contiguous(gpu.value):
            raise DlpackError(NOT_CONTIGUOUS)
        return gpu
    if device_type not in (CPU, CUDA_HOST):
        raise DlpackError(f"DLDevice type {device_type} is not support by Python backend.")
    array = np.from_dlpack(source)
    if not array.flags.c_contiguous:
        raise DlpackError(NOT_CONTIGUOUS)
    return array


def _on_gpu(source: Any) -> Any:
    try:
        import torch

        return torch.from_dlpack(source)
    except ImportError:
        pass
    try:
        import cupy

        return cupy.from_dlpack(source)
    except ImportError:
        raise DlpackError(
            "a DLPack tensor on a CUDA device needs torch or cupy in the model's Python environment to be "
            "read; install one, or hand the tensor over on the CPU"
        ) from None


def _contiguous(value: Any) -> bool:
    if hasattr(value, "is_contiguous"):
        return bool(value.is_contiguous())
    return bool(value.flags.c_contiguous)
