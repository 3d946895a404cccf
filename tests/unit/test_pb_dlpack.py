"""`pb_utils.Tensor` and DLPack on the CPU: capsules and objects numpy exports (which Triton 2.51's
stub dies on, so tests/integration/test_python_backend_parity.py cannot try them there), memory
shared rather than copied, and a CUDA tensor without a framework to take it refused with the fix."""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

import numpy as np
import pytest

from reference_server.backends.python.pb import dlpack
from reference_server.backends.python.pb import triton_python_backend_utils as pb_utils


def test_a_numpy_capsule_becomes_a_tensor_over_the_same_memory() -> None:
    source = np.arange(6, dtype=np.float32).reshape(2, 3)
    tensor = pb_utils.Tensor.from_dlpack("OUT", source.__dlpack__())
    assert tensor.is_cpu() and tensor.shape() == [2, 3] and tensor.triton_dtype() == 11
    source[0, 0] = 42.0
    assert tensor.as_numpy()[0, 0] == 42.0  # shared, not copied


def test_an_object_with_dlpack_and_a_tensor_read_back_by_numpy() -> None:
    source = np.array([1, -2, 3], dtype=np.int64)
    tensor = pb_utils.Tensor.from_dlpack("OUT", source)
    assert tensor.__dlpack_device__() == (dlpack.CPU, 0)
    assert np.from_dlpack(tensor).tolist() == [1, -2, 3]
    again = pb_utils.Tensor.from_dlpack("AGAIN", tensor.to_dlpack())
    assert again.as_numpy().tolist() == [1, -2, 3]


def test_a_read_only_tensor_still_gives_a_capsule() -> None:
    # A capsule of the legacy kind cannot say "read-only": numpy refuses to export such an array,
    # so the tensor hands over a copy.
    frozen = np.array([1.0, 2.0], dtype=np.float32)
    frozen.flags.writeable = False
    tensor = pb_utils.Tensor("IN", frozen)
    assert np.from_dlpack(pb_utils.dlpack._Capsule(tensor.to_dlpack())).tolist() == [1.0, 2.0]


def test_a_capsule_makes_one_tensor_only() -> None:
    capsule = np.ones(2, dtype=np.float32).__dlpack__()
    pb_utils.Tensor.from_dlpack("FIRST", capsule)
    with pytest.raises(pb_utils.TritonModelException, match="already used"):
        pb_utils.Tensor.from_dlpack("SECOND", capsule)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("OUT", np.arange(4, dtype=np.float32).reshape(2, 2).T, "DLPack tensor is not contiguous"),
        ("OUT", [1.0, 2.0], "Tensor must be a DLPack capsule"),
        ("", np.ones(2, dtype=np.float32), "Tensor name cannot be an empty string."),
    ],
)
def test_what_triton_refuses_is_refused_in_its_words(name: str, value: Any, message: str) -> None:
    with pytest.raises(pb_utils.TritonModelException, match=message):
        pb_utils.Tensor.from_dlpack(name, value)


class _OnCuda:
    """Stands in for a framework's tensor on CUDA device 1."""

    def __dlpack__(self, stream: Any = None, **_: Any) -> Any:
        raise AssertionError("not read without a framework")

    def __dlpack_device__(self) -> tuple[int, int]:
        return (dlpack.CUDA, 1)


@pytest.mark.skipif(
    importlib.util.find_spec("torch") is not None or importlib.util.find_spec("cupy") is not None,
    reason="torch or cupy is installed here: a CUDA tensor would be read",
)
def test_a_cuda_tensor_without_torch_or_cupy_is_refused_with_the_fix() -> None:
    with pytest.raises(pb_utils.TritonModelException, match="needs torch or cupy"):
        pb_utils.Tensor.from_dlpack("OUT", _OnCuda())


def test_another_device_is_refused_in_tritons_words() -> None:
    class OnVulkan(_OnCuda):
        def __dlpack_device__(self) -> tuple[int, int]:
            return (7, 0)

    with pytest.raises(pb_utils.TritonModelException, match="DLDevice type 7 is not support by Python backend."):
        pb_utils.Tensor.from_dlpack("OUT", OnVulkan())


class _FakeCupyArray:
    """What CuPy's from_dlpack gives, over host memory: enough to follow a GPU tensor's path."""

    __module__ = "cupy"

    def __init__(self, array: np.ndarray) -> None:
        self.array = array
        self.shape = array.shape
        self.dtype = array.dtype
        self.flags = array.flags

    def get(self) -> np.ndarray:
        return self.array.copy()

    def __dlpack__(self, stream: Any = None, **_: Any) -> Any:
        return self.array.__dlpack__()


def test_a_cuda_tensor_stays_with_its_framework_until_the_response_is_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    class OnCuda(_OnCuda):
        def __init__(self, array: np.ndarray) -> None:
            self.array = array

    fake_cupy = type(sys)("cupy")
    fake_cupy.from_dlpack = lambda source: _FakeCupyArray(source.array)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch fails: CuPy takes it
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    tensor = pb_utils.Tensor.from_dlpack("OUT", OnCuda(np.array([[1.0, 2.0]], dtype=np.float16)))
    assert not tensor.is_cpu() and tensor.__dlpack_device__() == (dlpack.CUDA, 1)
    assert tensor.shape() == [1, 2] and tensor.triton_dtype() == 10  # TRITONSERVER_TYPE_FP16
    with pytest.raises(
        pb_utils.TritonModelException, match="^Tensor is stored in GPU and cannot be converted to NumPy.$"
    ):
        tensor.as_numpy()
    assert tensor._host_array().tolist() == [[1.0, 2.0]]  # what the stub writes into the response
    assert np.from_dlpack(dlpack._Capsule(tensor.to_dlpack())).tolist() == [[1.0, 2.0]]
