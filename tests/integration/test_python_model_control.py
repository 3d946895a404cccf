"""The model loading API from model.py (`pb_utils.load_model`, `unload_model`, `is_model_ready`;
python_backend README "Model Loading API"), and BLS refused outside `execute`.

- In explicit model control mode a model loads another from the repository, checks its readiness
  (with and without a version), unloads it, and loads a model from files it passes itself (a config
  in JSON and a "file:1/model.py" of 6 MiB, more than a control message holds): the client sees
  each change, alike on tritonserver 2.51 and ours.
- BLS from `initialize` fails the load with Triton's words ("BLS is only supported during the
  'execute' function."), on both.
- On ours only, since tritonserver 2.51 aborts on a refused model-control call from a model: outside
  explicit mode a load from model.py raises TritonModelException with core's words, and a version
  that is no number is refused with the python backend's.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from reference_server.server import running_server
from tests.servers import http_client, loopback_config, running_triton

pytestmark = [pytest.mark.integration]

TARGET = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN")
                .as_numpy() * 2)]) for r in requests]
"""

CONTROLLER = """\
import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

COPIED_CONFIG = json.dumps({
    "backend": "python",
    "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [1]}],
    "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [1]}],
})


class TritonPythonModel:
    def initialize(self, args):
        self.target_source = (Path(args["model_repository"]).parent / "target" / "1" / "model.py").read_bytes()

    def act(self, action):
        if action == "load":
            return pb_utils.load_model(model_name="target")
        if action == "unload":
            return pb_utils.unload_model(model_name="target", unload_dependents=False)
        if action == "ready":
            return pb_utils.is_model_ready(model_name="target")
        if action == "ready_v1":
            return pb_utils.is_model_ready(model_name="target", model_version="1")
        if action == "ready_bad_version":
            return pb_utils.is_model_ready(model_name="target", model_version="one")
        if action == "load_files":
            # Larger than a control message: 6 MiB of comment after the code. One file only: with
            # more, tritonserver 2.51 gives every file the last one's contents.
            files = {"file:1/model.py": self.target_source + b"\\n#" + b"-" * (6 << 20) + b"\\n"}
            return pb_utils.load_model("copied", config=COPIED_CONFIG, files=files)
        raise ValueError(action)

    def execute(self, requests):
        responses = []
        for request in requests:
            action = pb_utils.get_input_tensor_by_name(request, "ACTION").as_numpy()[0].decode()
            try:
                answer = {"result": self.act(action)}
            except pb_utils.TritonModelException as exc:
                answer = {"error": str(exc)}
            out = np.array([json.dumps(answer).encode()], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]))
        return responses
"""

BLS_INIT = """\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        request = pb_utils.InferenceRequest(model_name="target", requested_output_names=["OUT"],
                                            inputs=[pb_utils.Tensor("IN", np.zeros([1], np.float32))])
        request.exec()

    def execute(self, requests):
        return None
"""

BLS_WORDS = "TritonModelException: BLS is only supported during the 'execute' function."


def _config(name: str, in_type: str, out_type: str, in_name: str = "IN") -> str:
    return (
        f'name: "{name}"\nbackend: "python"\n'
        f'input [ {{ name: "{in_name}" data_type: {in_type} dims: [ 1 ] }} ]\n'
        f'output [ {{ name: "OUT" data_type: {out_type} dims: [ 1 ] }} ]\n'
        "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
    )


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("model_control") / "models"
    for name, source, config in (
        ("target", TARGET, _config("target", "TYPE_FP32", "TYPE_FP32")),
        ("controller", CONTROLLER, _config("controller", "TYPE_STRING", "TYPE_STRING", "ACTION")),
        ("bls_init", BLS_INIT, _config("bls_init", "TYPE_FP32", "TYPE_FP32")),
    ):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(source)
        (root / name / "config.pbtxt").write_text(config)
    return root


def _act(client: httpclient.InferenceServerClient, action: str) -> dict[str, Any]:
    tensor = httpclient.InferInput("ACTION", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([action.encode()], dtype=np.object_))
    answer: dict[str, Any] = json.loads(client.infer("controller", [tensor]).as_numpy("OUT")[0])
    return answer


def _scaled(client: httpclient.InferenceServerClient, model: str) -> list[float]:
    tensor = httpclient.InferInput("IN", [1], "FP32")
    tensor.set_data_from_numpy(np.array([1.5], dtype=np.float32))
    result: list[float] = client.infer(model, [tensor]).as_numpy("OUT").tolist()
    return result


def _eventually(check: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + 10
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _control_from_the_model(client: httpclient.InferenceServerClient) -> None:
    """The model loads, checks, unloads and loads from files; the client sees each step."""
    assert not client.is_model_ready("target")
    assert _act(client, "ready") == {"result": False}
    assert _act(client, "load") == {"result": None}
    assert client.is_model_ready("target") and _scaled(client, "target") == [3.0]
    assert _act(client, "ready") == {"result": True}
    assert _act(client, "ready_v1") == {"result": True}
    assert _act(client, "unload") == {"result": None}
    assert _act(client, "ready") == {"result": False}
    assert _eventually(lambda: not client.is_model_ready("target"))
    assert _act(client, "load_files") == {"result": None}
    assert client.is_model_ready("copied") and _scaled(client, "copied") == [3.0]
    with pytest.raises(InferenceServerException) as caught:
        client.load_model("bls_init")
    assert BLS_WORDS in caught.value.message()
    assert "load failed for model 'bls_init'" in caught.value.message()


def test_a_model_loads_and_unloads_others_in_explicit_mode(repository: Path) -> None:
    with running_server(loopback_config(repository, load=("controller",))) as server:
        client = http_client(server)
        try:
            _control_from_the_model(client)
            assert _act(client, "ready_bad_version") == {
                "error": "Failed to check model readiness: Failed to process the request for model 'controller_0_0', "
                "message: failed to get model version from specified version string 'one' (details: stol), version "
                "should be an integral value > 0"
            }
        finally:
            client.close()


def test_outside_explicit_mode_a_load_from_the_model_is_refused(repository: Path, tmp_path: Path) -> None:
    for name in ("controller", "target"):  # every model loads at start: not bls_init
        shutil.copytree(repository / name, tmp_path / name)
    with running_server(loopback_config(tmp_path)) as server:
        client = http_client(server)
        try:
            answer = _act(client, "unload")
            prefix = "Failed to unload model: Failed to process the request for model 'controller_0_0', message: "
            assert answer["error"].startswith(prefix + "explicit model load / unload is not allowed if polling")
            assert client.is_model_ready("target")
        finally:
            client.close()


@pytest.mark.peers
def test_triton_does_the_same(peers: Path, repository: Path) -> None:
    with running_triton(
        peers, repository, extra_args=["--model-control-mode=explicit", "--load-model=controller"], auto_complete=False
    ) as t:
        client = httpclient.InferenceServerClient(t.http_url)
        try:
            _control_from_the_model(client)
        finally:
            client.close()
