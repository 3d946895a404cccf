"""--model-repository given several times: the models of every repository are served, requests name
them by their folder's name, and a name found in two repositories is not loaded while the others
are; the same as tritonserver 2.51 (the peers test)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from reference_server.config import config_from_args
from reference_server.server import running_server
from tests.servers import running_triton

pytestmark = pytest.mark.integration

MODEL = """\
import numpy as np
import triton_python_backend_utils as pb_utils

SCALE = {scale}


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() * SCALE)]
            )
            for r in requests
        ]
"""
CONFIG = """\
name: "{name}"
backend: "python"
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] }} ]
"""


def _model(root: Path, name: str, scale: float) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.py").write_text(MODEL.format(scale=scale))
    (root / name / "config.pbtxt").write_text(CONFIG.format(name=name))


@pytest.fixture(scope="module")
def repositories(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    first, second = tmp_path_factory.mktemp("first"), tmp_path_factory.mktemp("second")
    _model(first, "double", 2.0)
    _model(second, "triple", 3.0)
    _model(first, "twice", 5.0)  # in both: not unique across the repositories
    _model(second, "twice", 7.0)
    return first, second


#: The models that load at start; 'twice' is asked for later (the index lists it before).
LOAD = ("--model-control-mode=explicit", "--load-model=double", "--load-model=triple")


def _observe(url: str) -> dict[str, Any]:
    client = httpclient.InferenceServerClient(url)
    try:
        seen: dict[str, Any] = {}
        for name in ("double", "triple", "twice"):
            tensor = httpclient.InferInput("INPUT0", [1], "FP32")
            tensor.set_data_from_numpy(np.ones((1,), np.float32))
            try:
                seen[name] = client.infer(name, [tensor]).as_numpy("OUTPUT0").tolist()
            except InferenceServerException as exc:
                seen[name] = (exc.status(), exc.message())
        index = client.get_model_repository_index()
        seen["index"] = sorted((m["name"], m.get("state", ""), m.get("reason", "")) for m in index)
        try:
            client.load_model("twice")
        except InferenceServerException as exc:
            seen["load"] = (exc.status(), exc.message().split(":")[0])  # ours goes on to say why
        return seen
    finally:
        client.close()


EXPECTED = {
    "double": [2.0],
    "triple": [3.0],
    "twice": ("404", "Request for unknown model: 'twice' is not found"),
    "index": [
        ("double", "READY", ""),
        ("triple", "READY", ""),
        ("twice", "UNAVAILABLE", "model appears in two or more repositories"),
    ],
    "load": ("500", "failed to load 'twice', failed to poll from model repository"),
}


def test_the_models_of_every_repository_are_served(repositories: tuple[Path, Path]) -> None:
    first, second = repositories
    args = ["--model-repository", str(first), "--model-repository", str(second), *LOAD]
    config = config_from_args([*args, "--http-port=0", "--grpc-port=0", "--metrics-port=0"])
    with running_server(config) as ours:
        assert _observe(f"127.0.0.1:{ours.http_port}") == EXPECTED


@pytest.mark.peers
def test_the_models_of_every_repository_as_tritonserver_serves_them(repositories: tuple[Path, Path]) -> None:
    peers = os.environ.get("PERFKIT_PEERS")
    if not peers:
        pytest.skip("PERFKIT_PEERS is not set: no tritonserver 2.51 to compare with")
    first, second = repositories
    with running_triton(
        Path(peers), first, extra_args=[f"--model-repository={second}", *LOAD], auto_complete=False
    ) as triton:
        assert _observe(triton.http_url) == EXPECTED
