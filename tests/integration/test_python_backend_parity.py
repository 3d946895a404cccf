"""The same python-backend model folders, served by real tritonserver 2.51 and by the reference
server, answer the same requests alike: outputs byte for byte, and failures with the same status.

The models are written as Triton users write them (`import triton_python_backend_utils as pb_utils`):
Triton's add_sub example (output dtypes from `get_output_config_by_name`), a BYTES model that reverses
each element (NUL, non-UTF-8 and empty elements), the common weights pattern (`initialize` loads a
`.npy` from the version folder, `execute` runs it over the dynamic batcher's requests), a model that
answers with an error response, one whose `execute` raises, one that reads request ids and parameters,
a BLS model calling add_sub (and one with a request's options: preferred memory, trace, flags), an ensemble of two python steps, and a model that passes tensors
through DLPack (numpy reading a `pb_utils.Tensor`, `to_dlpack` and `from_dlpack` of that capsule,
and the misuses Triton refuses, in its words). Triton 2.51's stub dies when `from_dlpack` gets
what numpy exports (numpy's capsule destructor then meets the name Triton gave the used capsule),
so that is tested on ours alone (tests/unit/test_pb_dlpack.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from reference_server.server import running_server
from tests.servers import loopback_config, running_triton

pytestmark = [pytest.mark.integration, pytest.mark.peers]

ADD_SUB = """\
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.dtypes = [
            pb_utils.triton_string_to_numpy(pb_utils.get_output_config_by_name(config, name)["data_type"])
            for name in ("OUTPUT0", "OUTPUT1")
        ]

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            out0 = pb_utils.Tensor("OUTPUT0", (a + b).astype(self.dtypes[0]))
            out1 = pb_utils.Tensor("OUTPUT1", (a - b).astype(self.dtypes[1]))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out0, out1]))
        return responses
"""

ADD_SUB_CONFIG = """\
name: "add_sub"
backend: "python"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 4 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

REVERSE = """\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            flat = [bytes(item)[::-1] for item in text.reshape(-1)]
            out = np.array(flat, dtype=np.object_).reshape(text.shape)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("REVERSED", out)]))
        return responses
"""

REVERSE_CONFIG = """\
name: "reverse"
backend: "python"
max_batch_size: 8
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "REVERSED" data_type: TYPE_STRING dims: [ -1 ] } ]
"""

WEIGHTS = """\
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        folder = os.path.join(args["model_repository"], args["model_version"])
        self.weights = np.load(os.path.join(folder, "weights.npy"))

    def execute(self, requests):
        batch = [pb_utils.get_input_tensor_by_name(r, "X").as_numpy() for r in requests]
        sizes = [len(x) for x in batch]
        y = np.concatenate(batch) @ self.weights
        responses, start = [], 0
        for size in sizes:
            part = y[start : start + size].astype(np.float32)
            start += size
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", part)]))
        return responses
"""

WEIGHTS_CONFIG = """\
name: "weights"
backend: "python"
max_batch_size: 16
input [ { name: "X" data_type: TYPE_FP32 dims: [ 8 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 3 ] } ]
dynamic_batching { max_queue_delay_microseconds: 2000 }
"""

ERROR_RESPONSE = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError("value out of range: 7"))
            for _ in requests
        ]
"""

RAISES = """\
class TritonPythonModel:
    def execute(self, requests):
        raise ValueError("weights are not loaded")
"""

WRONG_SHAPE = """\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = pb_utils.Tensor("OUTPUT0", np.zeros((3,), np.float32))
        return [pb_utils.InferenceResponse([out]) for _ in requests]
"""

ONE_IN_ONE_OUT_CONFIG = """\
name: "{name}"
backend: "python"
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
"""

REQUEST_INFO = """\
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            info = {"id": request.request_id(), "parameters": json.loads(request.parameters())}
            out = np.array([json.dumps(info, sort_keys=True).encode()], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("INFO", out)]))
        return responses
"""

REQUEST_INFO_CONFIG = """\
name: "request_info"
backend: "python"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "INFO" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

BLS = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            call = pb_utils.InferenceRequest(
                model_name="add_sub",
                requested_output_names=["OUTPUT0"],
                inputs=[pb_utils.Tensor("INPUT0", x), pb_utils.Tensor("INPUT1", x)],
            )
            reply = call.exec()
            if reply.has_error():
                raise pb_utils.TritonModelException(reply.error().message())
            doubled = pb_utils.get_output_tensor_by_name(reply, "OUTPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", doubled * 10)]))
        return responses
"""

ENSEMBLE_CONFIG = """\
name: "add_then_bls"
platform: "ensemble"
input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "RESULT" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [
  { model_name: "add_sub" model_version: -1
    input_map { key: "INPUT0" value: "A" } input_map { key: "INPUT1" value: "B" }
    output_map { key: "OUTPUT0" value: "sum" } },
  { model_name: "bls" model_version: -1
    input_map { key: "INPUT0" value: "sum" } output_map { key: "OUTPUT0" value: "RESULT" } }
] }
"""

DLPACK = """\
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            view = np.from_dlpack(x)  # the object form: pb_utils.Tensor has __dlpack__
            doubled = pb_utils.Tensor("OUTPUT0", view * 2)
            same = pb_utils.Tensor.from_dlpack("SAME", x.to_dlpack())  # the input's memory passed on
            refusals = []
            misuses = (
                ("OUT", np.arange(4, dtype=np.float32).reshape(2, 2).T),
                ("OUT", "not a tensor"),
                ("", view),
            )
            for name, value in misuses:
                try:
                    pb_utils.Tensor.from_dlpack(name, value)
                    refusals.append("accepted")
                except pb_utils.TritonModelException as error:
                    refusals.append(str(error))
            try:
                pb_utils.Tensor("TEXT", np.array([b"a"], dtype=np.object_)).to_dlpack()
                refusals.append("accepted")
            except pb_utils.TritonModelException as error:
                refusals.append(str(error))
            facts = {
                "is_cpu": [x.is_cpu(), doubled.is_cpu(), same.is_cpu()],
                "device": list(x.__dlpack_device__()),
                "shape": same.shape(),
                "refusals": refusals,
            }
            info = pb_utils.Tensor("INFO", np.array([json.dumps(facts).encode()], dtype=np.object_))
            responses.append(pb_utils.InferenceResponse([doubled, same, info]))
        return responses
"""

BLS_OPTIONS = """\
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            call = pb_utils.InferenceRequest(
                model_name="add_sub",
                inputs=[pb_utils.Tensor("INPUT0", x), pb_utils.Tensor("INPUT1", x)],
                requested_output_names=["OUTPUT0"],
                preferred_memory=pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, 0),
                trace=request.trace(),
            )
            call.set_flags(0)
            facts = {
                "trace_context": request.trace().get_context(),
                "flags": call.flags(),
                "memory_types": [int(pb_utils.TRITONSERVER_MEMORY_GPU), int(pb_utils.TRITONSERVER_MEMORY_CPU)],
            }
            try:
                pb_utils.InferenceRequest(model_name="add_sub", inputs=[], requested_output_names=[], correlation_id=1.5)
                facts["float_correlation_id"] = "accepted"
            except pb_utils.TritonModelException as error:
                facts["float_correlation_id"] = str(error)
            output = pb_utils.get_output_tensor_by_name(call.exec(), "OUTPUT0")
            facts["is_cpu"] = output.is_cpu()
            info = pb_utils.Tensor("INFO", np.array([json.dumps(facts).encode()], dtype=np.object_))
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", output.as_numpy()), info]))
        return responses
"""

BLS_OPTIONS_CONFIG = """\
name: "bls_options"
backend: "python"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INFO" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

# A BLS call whose tensor is larger than a client's may be (--max-tensor-elements, 16,777,216 by
# default): the model made it, so it is not held to a client's bound, as on Triton.
# Raises through two calls and the standard library; the error lists the frames as Triton's stub
# does (pybind11: innermost first, out through the callers; an `async def`'s frames below it only).
TRACEBACK = """\
import os

import triton_python_backend_utils as pb_utils


def lookup():
    return os.environ["PERFKIT_PARITY_SURELY_UNSET"]


class TritonPythonModel:
    def helper(self):
        return lookup()

    {prefix}def execute(self, requests):
        {call}
        return []
"""

BIG_BLS = """\
import numpy as np
import triton_python_backend_utils as pb_utils

ELEMENTS = 17_000_000


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            big = np.arange(ELEMENTS, dtype=np.float32)
            call = pb_utils.InferenceRequest(
                model_name="big_identity", inputs=[pb_utils.Tensor("INPUT0", big)], requested_output_names=["OUTPUT0"]
            )
            answer = call.exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            back = pb_utils.get_output_tensor_by_name(answer, "OUTPUT0").as_numpy()
            same = np.array([back.shape == big.shape and bool(np.array_equal(back, big))])
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SAME", same)]))
        return responses
"""

BIG_BLS_CONFIG = """\
name: "big_bls"
backend: "python"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "SAME" data_type: TYPE_BOOL dims: [ 1 ] } ]
"""

BIG_IDENTITY = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests
        ]
"""

BIG_IDENTITY_CONFIG = """\
name: "big_identity"
backend: "python"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""

DLPACK_CONFIG = """\
name: "dlpack"
backend: "python"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "SAME" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "INFO" data_type: TYPE_STRING dims: [ 1 ] }
]
"""

WEIGHTS_ARRAY = np.arange(24, dtype=np.float32).reshape(8, 3) / 10


def write_repository(root: Path) -> Path:
    def model(name: str, source: str | None, config: str) -> Path:
        version = root / name / "1"
        version.mkdir(parents=True)
        if source is not None:
            (version / "model.py").write_text(source)
        (root / name / "config.pbtxt").write_text(config)
        return version

    model("add_sub", ADD_SUB, ADD_SUB_CONFIG)
    model("reverse", REVERSE, REVERSE_CONFIG)
    np.save(model("weights", WEIGHTS, WEIGHTS_CONFIG) / "weights.npy", WEIGHTS_ARRAY)
    model("error_response", ERROR_RESPONSE, ONE_IN_ONE_OUT_CONFIG.format(name="error_response"))
    model("raises", RAISES, ONE_IN_ONE_OUT_CONFIG.format(name="raises"))
    model("wrong_shape", WRONG_SHAPE, ONE_IN_ONE_OUT_CONFIG.format(name="wrong_shape"))
    model("request_info", REQUEST_INFO, REQUEST_INFO_CONFIG)
    model("bls", BLS, ONE_IN_ONE_OUT_CONFIG.format(name="bls"))
    model("add_then_bls", None, ENSEMBLE_CONFIG)
    model("dlpack", DLPACK, DLPACK_CONFIG)
    model("bls_options", BLS_OPTIONS, BLS_OPTIONS_CONFIG)
    model("big_bls", BIG_BLS, BIG_BLS_CONFIG)
    model(
        "raises_deep",
        TRACEBACK.format(prefix="", call="self.helper()"),
        ONE_IN_ONE_OUT_CONFIG.format(name="raises_deep"),
    )
    async_source = TRACEBACK.format(prefix="async ", call="await self.coroutine()").replace(
        "    def helper(self):", "    async def coroutine(self):\n        return lookup()\n\n    def helper(self):"
    )
    model("raises_deep_async", async_source, ONE_IN_ONE_OUT_CONFIG.format(name="raises_deep_async"))
    model("big_identity", BIG_IDENTITY, BIG_IDENTITY_CONFIG)
    return root


@pytest.fixture(scope="module")
def urls(peers: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[str, str]]]:
    """{"triton": (http, grpc), "ours": (http, grpc)}, both serving one copy of the repository."""
    repository = write_repository(tmp_path_factory.mktemp("parity") / "models")
    with (
        running_triton(peers, repository, auto_complete=False) as triton,
        running_server(loopback_config(repository)) as ours,
    ):
        yield {
            "triton": (triton.http_url, triton.grpc_url),
            "ours": (ours.http_url, f"{ours.config.host}:{ours.grpc_port}"),
        }


def _http(url: str, model: str, inputs: dict[str, np.ndarray], **kwargs: object) -> dict[str, np.ndarray]:
    client = httpclient.InferenceServerClient(url)
    try:
        tensors = []
        for name, array in inputs.items():
            datatype = "BYTES" if array.dtype == np.object_ else httpclient.np_to_triton_dtype(array.dtype)
            tensor = httpclient.InferInput(name, list(array.shape), datatype)
            tensor.set_data_from_numpy(array, binary_data=True)
            tensors.append(tensor)
        result = client.infer(model, tensors, **kwargs)  # type: ignore[arg-type]
        response = result.get_response()
        return {output["name"]: result.as_numpy(output["name"]) for output in response["outputs"]}
    finally:
        client.close()


def _grpc(url: str, model: str, inputs: dict[str, np.ndarray], request_id: str = "") -> dict[str, np.ndarray]:
    client = grpcclient.InferenceServerClient(url)
    try:
        tensors = []
        for name, array in inputs.items():
            datatype = "BYTES" if array.dtype == np.object_ else grpcclient.np_to_triton_dtype(array.dtype)
            tensor = grpcclient.InferInput(name, list(array.shape), datatype)
            tensor.set_data_from_numpy(array)
            tensors.append(tensor)
        result = client.infer(model, tensors, request_id=request_id)
        return {output.name: result.as_numpy(output.name) for output in result.get_response().outputs}
    finally:
        client.close()


def _failures(
    urls: dict[str, tuple[str, str]], transport: str, model: str, inputs: dict[str, np.ndarray], request_id: str = ""
) -> dict[str, InferenceServerException]:
    """What each server answers a request that must fail, by server."""
    failures: dict[str, InferenceServerException] = {}
    for server, (http_url, grpc_url) in urls.items():
        with pytest.raises(InferenceServerException) as caught:
            if transport == "http":
                _http(http_url, model, inputs, request_id=request_id)
            else:
                _grpc(grpc_url, model, inputs, request_id=request_id)
        failures[server] = caught.value
    return failures


def _same(answers: dict[str, dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    triton, ours = answers["triton"], answers["ours"]
    assert sorted(ours) == sorted(triton)
    for name in triton:
        assert ours[name].dtype == triton[name].dtype, name
        assert ours[name].shape == triton[name].shape, name
        assert ours[name].tolist() == triton[name].tolist(), name
    return triton


A = np.array([1.5, -2.0, 3.25, 100.0], dtype=np.float32)
B = np.array([0.5, 4.0, -1.0, 0.75], dtype=np.float32)


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_add_sub_with_output_dtypes_from_the_config(urls: dict[str, tuple[str, str]], transport: str) -> None:
    call = _http if transport == "http" else _grpc
    index = 0 if transport == "http" else 1
    answer = _same({server: call(pair[index], "add_sub", {"INPUT0": A, "INPUT1": B}) for server, pair in urls.items()})
    assert answer["OUTPUT0"].tolist() == (A + B).tolist()
    assert answer["OUTPUT1"].dtype == np.int32
    assert answer["OUTPUT1"].tolist() == (A - B).astype(np.int32).tolist()


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_bytes_are_exact_through_a_python_model(urls: dict[str, tuple[str, str]], transport: str) -> None:
    elements = [b"he\x00llo", b"\xff\xfe\x00", b"", "né".encode(), b"x" * 100_000]
    text = np.array([elements], dtype=np.object_)
    call = _http if transport == "http" else _grpc
    index = 0 if transport == "http" else 1
    answer = _same({server: call(pair[index], "reverse", {"TEXT": text}) for server, pair in urls.items()})
    assert answer["REVERSED"].tolist() == [[e[::-1] for e in elements]]


def test_weights_model_batches_requests(urls: dict[str, tuple[str, str]]) -> None:
    rng = np.random.default_rng(7)
    x = rng.standard_normal((5, 8)).astype(np.float32)
    answer = _same({server: _http(pair[0], "weights", {"X": x}) for server, pair in urls.items()})
    np.testing.assert_allclose(answer["Y"], x @ WEIGHTS_ARRAY, rtol=1e-5)


def test_request_id_and_parameters_reach_the_model(urls: dict[str, tuple[str, str]]) -> None:
    answers = {
        server: _http(pair[0], "request_info", {"INPUT0": A}, request_id="req-42", parameters={"tenant": "a", "n": 3})
        for server, pair in urls.items()
    }
    answer = _same(answers)
    info = json.loads(answer["INFO"][0])
    assert info == {"id": "req-42", "parameters": {"tenant": "a", "n": 3}}


def test_bls_and_an_ensemble_of_python_steps(urls: dict[str, tuple[str, str]]) -> None:
    bls = _same({server: _http(pair[0], "bls", {"INPUT0": A}) for server, pair in urls.items()})
    assert bls["OUTPUT0"].tolist() == (A * 2 * 10).tolist()
    ensemble = _same({server: _http(pair[0], "add_then_bls", {"A": A, "B": B}) for server, pair in urls.items()})
    assert ensemble["RESULT"].tolist() == ((A + B) * 2 * 10).tolist()


@pytest.mark.parametrize("model", ["error_response", "raises"])
@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_model_errors_reach_the_client_alike(urls: dict[str, tuple[str, str]], model: str, transport: str) -> None:
    failures = _failures(urls, transport, model, {"INPUT0": A})
    assert failures["ours"].status() == failures["triton"].status()
    expected = "value out of range: 7" if model == "error_response" else "weights are not loaded"
    for failure in failures.values():
        assert expected in failure.message()
    if model == "raises":
        # The instance's name as Triton gives it: a config without instance_group has one group
        # named after the model, and its instance 0 is `raises_0`.
        for failure in failures.values():
            assert failure.message().startswith("Failed to process the request(s) for model 'raises_0', message: ")


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_an_output_of_another_shape_than_the_config_says_reaches_the_client(
    urls: dict[str, tuple[str, str]], transport: str
) -> None:
    # Triton 2.51 does not hold a python model's outputs to the config's dims: the client gets the
    # shape the model made.
    call = _http if transport == "http" else _grpc
    answers = {
        server: call(pair[0 if transport == "http" else 1], "wrong_shape", {"INPUT0": A})
        for server, pair in urls.items()
    }
    assert _same(answers)["OUTPUT0"].shape == (3,)


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_tensors_pass_through_dlpack_alike(urls: dict[str, tuple[str, str]], transport: str) -> None:
    call = _http if transport == "http" else _grpc
    index = 0 if transport == "http" else 1
    answer = _same({server: call(pair[index], "dlpack", {"INPUT0": A}) for server, pair in urls.items()})
    assert answer["OUTPUT0"].tolist() == (A * 2).tolist()
    assert answer["SAME"].tolist() == A.tolist()
    facts = json.loads(answer["INFO"][0])
    assert facts["is_cpu"] == [True, True, True] and facts["device"] == [1, 0]
    assert facts["shape"] == [4]
    assert "not contiguous" in facts["refusals"][0]
    assert "Tensor must be a DLPack capsule" in facts["refusals"][1]
    assert facts["refusals"][2:] == [
        "Tensor name cannot be an empty string.",
        "DLPack does not have support for string tensors.",
    ]


def test_a_bls_request_takes_its_options_as_tritons_does(urls: dict[str, tuple[str, str]]) -> None:
    answer = _same({server: _http(pair[0], "bls_options", {"INPUT0": A}) for server, pair in urls.items()})
    assert answer["OUTPUT0"].tolist() == (A + A).tolist()
    assert json.loads(answer["INFO"][0]) == {
        "trace_context": None,
        "flags": 0,
        "memory_types": [0, 1],
        "float_correlation_id": "Correlation ID must be integer or string",
        "is_cpu": True,
    }


BAD_REQUESTS = [  # (model, inputs, request id): each refused before it reaches the model
    ("weights", {"X": np.zeros((2, 8), np.float64)}, ""),  # data-type
    ("weights", {"X": np.zeros((17, 8), np.float32)}, "req-7"),  # batch size over max_batch_size
    ("weights", {"X": np.zeros((2, 5), np.float32)}, ""),  # shape, with the batch note
    ("add_sub", {"INPUT0": np.zeros(8, np.float32), "INPUT1": B}, "req-8"),  # shape, no batching
    ("add_sub", {"INPUT0": A}, ""),  # an input missing
]


@pytest.mark.parametrize("transport", ["http", "grpc"])
@pytest.mark.parametrize("case", range(len(BAD_REQUESTS)))
def test_a_refused_request_gets_tritons_words(urls: dict[str, tuple[str, str]], transport: str, case: int) -> None:
    model, inputs, request_id = BAD_REQUESTS[case]
    failures = _failures(urls, transport, model, inputs, request_id)
    assert failures["ours"].status() == failures["triton"].status()
    assert failures["ours"].message() == failures["triton"].message()
    assert failures["ours"].message().startswith(f"[request id: {request_id or '<id_unknown>'}] ")


def test_a_bls_tensor_larger_than_a_clients_may_be_goes_through(urls: dict[str, tuple[str, str]]) -> None:
    answer = _same({server: _http(pair[0], "big_bls", {"INPUT0": A[:1]}) for server, pair in urls.items()})
    assert answer["SAME"].tolist() == [True]


@pytest.mark.parametrize("sequence_id", [0, 5])
def test_an_ensembles_response_carries_the_requests_sequence_as_tritons_does(
    urls: dict[str, tuple[str, str]], sequence_id: int
) -> None:
    seen: dict[str, tuple[object, object]] = {}
    for server, (http_url, grpc_url) in urls.items():
        http = httpclient.InferenceServerClient(http_url)
        grpc = grpcclient.InferenceServerClient(grpc_url)
        try:
            answers = []
            for module, client in ((httpclient, http), (grpcclient, grpc)):
                tensors = [module.InferInput("A", [4], "FP32"), module.InferInput("B", [4], "FP32")]
                tensors[0].set_data_from_numpy(A)
                tensors[1].set_data_from_numpy(B)
                answers.append(client.infer("add_then_bls", tensors, sequence_id=sequence_id, sequence_start=True))
            grpc_parameters = answers[1].get_response().parameters
            seen[server] = (
                answers[0].get_response().get("parameters"),
                {key: str(value).strip() for key, value in grpc_parameters.items()},
            )
        finally:
            http.close()
            grpc.close()
    assert seen["ours"] == seen["triton"]
    # tritonclient sends the sequence flags only with a sequence id: without one, the flags are False.
    started = sequence_id != 0
    assert seen["ours"][0] == {"sequence_id": sequence_id, "sequence_start": started, "sequence_end": False}


@pytest.mark.parametrize("model", ["raises_deep", "raises_deep_async"])
def test_an_errors_traceback_lists_the_frames_tritons_does(urls: dict[str, tuple[str, str]], model: str) -> None:
    # The standard library's line numbers are those of each server's Python.
    messages = {
        server: re.sub(r"<frozen os>\(\d+\)", "<frozen os>(N)", failure.message())
        for server, failure in _failures(urls, "http", model, {"INPUT0": A}).items()
    }
    assert messages["ours"] == messages["triton"]
    frames = messages["ours"].split("At:\n", 1)[1]
    assert frames.startswith("  <frozen os>(N): __getitem__\n") and "(7): lookup\n" in frames
    assert ("execute" in frames) == (model == "raises_deep")
