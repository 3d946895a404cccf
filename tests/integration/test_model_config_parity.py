"""Reshape, classification and `file:` overrides, side by side on real tritonserver 2.51 and the
reference server: the same python-backend model folder, the same requests through tritonclient
(HTTP and gRPC), the same answers byte for byte; what Triton refuses, refused here too, with its
status.

Not sent to Triton: classes of a BYTES output, which Triton's documentation and code refuse
("class result not available for output due to unsupported type 'BYTES'") but which drops the
HTTP connection of Triton 2.51 and takes its server down; the reference server refuses it (see
test_model_config_features).

The model sees the reshape ([batch, 2, 2]) and reports the shape it saw; the client sees the dims
([batch, 4]); its scores output has a labels file shorter than the output, so the classes past it
come without a label.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from reference_server.server import running_server
from tests.servers import loopback_config, running_triton

pytestmark = [pytest.mark.integration, pytest.mark.peers]

MODEL = """\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            seen = np.tile(np.array(x.shape, dtype=np.int64), (x.shape[0], 1))
            tags = np.array([[b"tag"]] * x.shape[0], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("SCORES", (x * 2).astype(np.float32)),
                pb_utils.Tensor("SEEN", seen),
                pb_utils.Tensor("TAG", tags),
            ]))
        return responses
"""

CONFIG: dict[str, Any] = {
    "name": "pyreshape",
    "backend": "python",
    "max_batch_size": 4,
    "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [4], "reshape": {"shape": [2, 2]}}],
    "output": [
        {
            "name": "SCORES",
            "data_type": "TYPE_FP32",
            "dims": [4],
            "reshape": {"shape": [2, 2]},
            "label_filename": "labels.txt",
        },
        {"name": "SEEN", "data_type": "TYPE_INT64", "dims": [3]},
        {"name": "TAG", "data_type": "TYPE_STRING", "dims": [1]},
    ],
    "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
}
CONFIG_PBTXT = """\
name: "pyreshape"
backend: "python"
max_batch_size: 4
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] reshape { shape: [ 2, 2 ] } } ]
output [
  { name: "SCORES" data_type: TYPE_FP32 dims: [ 4 ] reshape { shape: [ 2, 2 ] } label_filename: "labels.txt" },
  { name: "SEEN" data_type: TYPE_INT64 dims: [ 3 ] },
  { name: "TAG" data_type: TYPE_STRING dims: [ 1 ] }
]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
LABELS = b"first\nsecond\n"
X = np.array([[0.25, 3.5, -1.0, 2.0], [9.0, -4.5, 0.125, 7.75]], np.float32)


@pytest.fixture(scope="module")
def servers(peers: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[str, str]]]:
    """{"triton": (http, grpc), "ours": (http, grpc)}, in explicit model control, both serving one
    repository that holds `pyreshape`."""
    repository = tmp_path_factory.mktemp("config_parity") / "models"
    (repository / "pyreshape" / "1").mkdir(parents=True)
    (repository / "pyreshape" / "1" / "model.py").write_text(MODEL)
    (repository / "pyreshape" / "config.pbtxt").write_text(CONFIG_PBTXT)
    (repository / "pyreshape" / "labels.txt").write_bytes(LABELS)
    explicit = ("--model-control-mode=explicit", "--load-model=pyreshape")
    with (
        running_triton(peers, repository, extra_args=explicit, auto_complete=False) as triton,
        running_server(loopback_config(repository, load=("pyreshape",))) as ours,
    ):
        yield {
            "triton": (triton.http_url, triton.grpc_url),
            "ours": (ours.http_url, f"{ours.config.host}:{ours.grpc_port}"),
        }


def _client(transport: str, urls: tuple[str, str]) -> Any:
    if transport == "http":
        return httpclient.InferenceServerClient(urls[0], network_timeout=60)
    return grpcclient.InferenceServerClient(urls[1])


def _infer(transport: str, urls: tuple[str, str], model: str, outputs: dict[str, int]) -> dict[str, Any]:
    """The answer's outputs as (datatype, shape, values), or the refusal's message."""
    module = httpclient if transport == "http" else grpcclient
    client = _client(transport, urls)
    try:
        x = module.InferInput("X", list(X.shape), "FP32")
        x.set_data_from_numpy(X)
        requested = [module.InferRequestedOutput(name, class_count=count) for name, count in outputs.items()]
        try:
            result = client.infer(model, [x], outputs=requested)
        except InferenceServerException as error:
            return {"refused": error}
        answer = {}
        for name in outputs:
            tensor = result.get_output(name)
            datatype, shape = (
                (tensor["datatype"], tensor["shape"]) if transport == "http" else (tensor.datatype, list(tensor.shape))
            )
            answer[name] = (datatype, shape, result.as_numpy(name).tolist())
        return answer
    finally:
        client.close()


def _same(servers: dict[str, tuple[str, str]], transport: str, model: str, outputs: dict[str, int]) -> dict[str, Any]:
    answers = {server: _infer(transport, urls, model, outputs) for server, urls in servers.items()}
    assert answers["ours"] == answers["triton"] or "refused" in answers["triton"], answers
    return answers["triton"]


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_reshaped_and_classified_outputs_match_triton(servers: dict[str, tuple[str, str]], transport: str) -> None:
    plain = _same(servers, transport, "pyreshape", {"SCORES": 0, "SEEN": 0, "TAG": 0})
    assert plain["SCORES"][1] == [2, 4] and plain["SEEN"][2] == [[2, 2, 2], [2, 2, 2]]  # the model saw [2,2,2]
    classes = _same(servers, transport, "pyreshape", {"SCORES": 3, "SEEN": 2})
    assert classes["SCORES"] == (
        "BYTES",
        [2, 3],
        [
            [b"7.000000:1:second", b"4.000000:3", b"0.500000:0:first"],
            [b"18.000000:0:first", b"15.500000:3", b"0.250000:2"],
        ],
    )
    assert classes["SEEN"][2] == [[b"2:0", b"2:1"], [b"2:0", b"2:1"]]  # integers as integers; ties in index order
    every = _same(servers, transport, "pyreshape", {"SCORES": 50})
    assert every["SCORES"][1] == [2, 4]  # a count past the elements gives them all


def test_file_overrides_load_the_same_model_and_refuse_the_same_requests(servers: dict[str, tuple[str, str]]) -> None:
    config = json.dumps({**CONFIG, "name": "pyfiles"})
    files = {"file:1/model.py": MODEL.encode(), "file:labels.txt": LABELS}
    for transport in ("http", "grpc"):
        for urls in servers.values():
            client = _client(transport, urls)
            client.load_model("pyfiles", config=config, files=files)
            client.close()
        _same(servers, transport, "pyfiles", {"SCORES": 2})
        refusals = {}
        for server, urls in servers.items():
            client = _client(transport, urls)
            cases: dict[str, dict[str, Any]] = {
                "escape": {"config": config, "files": {"file:../x": b"x"}},
                "no config": {"files": files},
            }
            for case, arguments in cases.items():
                with pytest.raises(InferenceServerException) as caught:
                    client.load_model("pyfiles", **arguments)
                refusals[server, case] = caught.value
            assert client.is_model_ready("pyfiles")  # the failed loads left the loaded model serving
            client.close()
        # Triton answers both with INTERNAL and one message, the reason only in its log; ours adds
        # the reason, and answers a client's mistake with a client's status (docs/reliability.md, "Bad input").
        for case in ("escape", "no config"):
            triton, ours = refusals["triton", case], refusals["ours", case]
            assert triton.status() == ("500" if transport == "http" else "StatusCode.INTERNAL")
            assert ours.status() == ("400" if transport == "http" else "StatusCode.INVALID_ARGUMENT")
            assert triton.message() == "failed to load 'pyfiles', failed to poll from model repository"
            assert ours.message().startswith(triton.message() + ": ")
        assert "must stay within model directory" in refusals["ours", "escape"].message()


def test_metadata_and_config_show_the_dims_and_the_reshape_as_triton_does(servers: dict[str, tuple[str, str]]) -> None:
    seen = {}
    for server, urls in servers.items():
        client = httpclient.InferenceServerClient(urls[0])
        metadata = client.get_model_metadata("pyreshape")
        config = client.get_model_config("pyreshape")
        client.close()
        tensors = {t["name"]: t["shape"] for t in (*metadata["inputs"], *metadata["outputs"])}
        reshapes = {
            t["name"]: (t["dims"], t.get("reshape"), t.get("label_filename"))
            for t in (*config["input"], *config["output"])
        }
        seen[server] = (tensors, reshapes)
    assert seen["ours"] == seen["triton"]
    assert seen["triton"][0]["X"] == [-1, 4]  # the client's view: dims, with the batch dimension
    assert seen["triton"][1]["SCORES"] == ([4], {"shape": [2, 2]}, "labels.txt")
