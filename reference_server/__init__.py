"""A KServe v2 inference server for ONNX models in a Triton model repository."""

from v2kit import compiled as _compiled

_compiled.install()  # before any of the request path's modules, which may be compiled (v2kit/compiled.py)
