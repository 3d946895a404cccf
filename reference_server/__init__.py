"""A KServe v2 inference server for ONNX models in a Triton model repository."""
