"""A python-backend model on a GPU, as Triton users write one: a KIND_GPU instance learns its device
from `args`, computes with torch on it, and answers with tensors handed over through DLPack while
they are still on the device (`is_cpu()` False, `as_numpy()` refused in Triton's words); the client
gets the numbers. Skipped, with the reason, where there is no GPU or no torch with CUDA."""

from __future__ import annotations

import importlib.util
import json
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from reference_server.server import running_server
from tests.servers import loopback_config
from v2kit.runtime import gpu


def _torch_cuda() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(gpu.gpu_count() == 0, reason="needs an NVIDIA GPU that NVML (pynvml) can see; none here"),
    pytest.mark.skipif(not _torch_cuda(), reason="needs torch with CUDA in this Python; not here"),
]

MODEL = """\
import json

import numpy as np
import torch
from torch.utils.dlpack import from_dlpack, to_dlpack
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.placed = [args["model_instance_kind"], args["model_instance_device_id"]]
        self.device = torch.device(f"cuda:{args['model_instance_device_id']}")

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            on_gpu = from_dlpack(x.to_dlpack()).to(self.device)
            doubled = pb_utils.Tensor.from_dlpack("DOUBLED", to_dlpack(on_gpu * 2))  # a capsule
            squared = pb_utils.Tensor.from_dlpack("SQUARED", (on_gpu * on_gpu).contiguous())  # a torch tensor
            try:
                doubled.as_numpy()
                refusal = "accepted"
            except pb_utils.TritonModelException as error:
                refusal = str(error)
            back = from_dlpack(doubled.to_dlpack())  # still on the device, shared
            facts = {
                "placed": self.placed,
                "is_cpu": [doubled.is_cpu(), squared.is_cpu()],
                "device": list(doubled.__dlpack_device__()),
                "back_on": str(back.device),
                "shape": doubled.shape(),
                "refusal": refusal,
            }
            info = pb_utils.Tensor("INFO", np.array([json.dumps(facts).encode()], dtype=np.object_))
            responses.append(pb_utils.InferenceResponse([doubled, squared, info]))
        return responses
"""

CONFIG = """\
name: "torch_gpu"
backend: "python"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]
output [
  { name: "DOUBLED" data_type: TYPE_FP32 dims: [ -1, 4 ] },
  { name: "SQUARED" data_type: TYPE_FP32 dims: [ -1, 4 ] },
  { name: "INFO" data_type: TYPE_STRING dims: [ 1 ] }
]
instance_group [ { count: 1, kind: KIND_GPU, gpus: [ 0 ] } ]
"""


def test_a_torch_model_on_the_gpu_answers_through_dlpack(tmp_path: Path) -> None:
    version = tmp_path / "models" / "torch_gpu" / "1"
    version.mkdir(parents=True)
    (version / "model.py").write_text(MODEL)
    (version.parent / "config.pbtxt").write_text(CONFIG)
    rows = np.array([[1.5, -2.0, 3.0, 0.25], [4.0, 5.0, -6.0, 7.0]], dtype=np.float32)
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2, 4], "data": rows.ravel().tolist()}]}
    with running_server(loopback_config(tmp_path / "models")) as server:
        request = urllib.request.Request(
            f"http://{server.http_url}/v2/models/torch_gpu/infer",
            json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            outputs = {output["name"]: output for output in json.loads(response.read())["outputs"]}
    assert outputs["DOUBLED"]["shape"] == [2, 4] and outputs["DOUBLED"]["datatype"] == "FP32"
    np.testing.assert_allclose(np.array(outputs["DOUBLED"]["data"]).reshape(2, 4), rows * 2)
    np.testing.assert_allclose(np.array(outputs["SQUARED"]["data"]).reshape(2, 4), rows * rows)
    facts = json.loads(outputs["INFO"]["data"][0])
    assert facts["placed"] == ["GPU", "0"]
    assert facts["is_cpu"] == [False, False] and facts["device"] == [2, 0]  # kDLCUDA, device 0
    assert facts["back_on"] == "cuda:0" and facts["shape"] == [2, 4]
    assert facts["refusal"] == "Tensor is stored in GPU and cannot be converted to NumPy."
