"""Test and benchmark harness around NVIDIA's real tritonserver (from $PERFKIT_PEERS).

`triton_server()` runs tritonserver on free loopback ports and always stops it; the `write_*`
functions write the python-backend models it serves (the peers' build has no other backend).
"""

from perfkit.testing.models import read_ort_times, write_bls, write_onnx_wrapper, write_sleeper, write_staller
from perfkit.testing.triton import TritonProcess, TritonStartError, triton_server

__all__ = [
    "TritonProcess",
    "TritonStartError",
    "read_ort_times",
    "triton_server",
    "write_bls",
    "write_onnx_wrapper",
    "write_sleeper",
    "write_staller",
]
