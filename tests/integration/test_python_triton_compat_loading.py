"""Python models load and answer as on Triton 2.51: the same model folders on real tritonserver and on
the reference server, with tritonclient over HTTP and gRPC, give the same answers.

- A folder holding only `1/model.py` is a python model completed by its `auto_complete_config`; with
  auto-complete off (`--disable-auto-complete-config`) it fails to poll, and `--model-config-name`
  picks `configs/NAME.pbtxt` over config.pbtxt.
- An `auto_complete_config` that raises or returns something else fails the load in Triton's words;
  the server goes on serving the others.
- An output leaves with the datatype the model made (INT64 for a TYPE_INT32 output, FP16 for
  TYPE_FP32; from our response cache too), and Python ints in a STRING output become their `str()`;
  FP16 asked for as JSON, and an ensemble step given such an output, fail as on Triton.
- A raw binary request (Inference-Header-Content-Length: 0) to a batched BYTES model is one element
  of shape [1, 1].
- An error raised in `execute`, and the stub's checks of what `execute` returns, name the instance
  (`inst_0_0`) in Triton's words; a load override that leaves no version answers "load failed for
  model".
"""

from __future__ import annotations

import json
import queue
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from google.protobuf import json_format
from tritonclient.utils import InferenceServerException

from reference_server.server import running_server
from tests.servers import loopback_config, running_triton

pytestmark = [pytest.mark.integration, pytest.mark.peers]

AUTO = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.add_input({"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]})
        auto_complete_model_config.add_output({"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]})
        auto_complete_model_config.set_max_batch_size(8)
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x * 2)]))
        return responses
"""

AUTO_DECOUPLED = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.add_input({"name": "IN", "data_type": "TYPE_INT32", "dims": [1]})
        auto_complete_model_config.add_output({"name": "OUT", "data_type": "TYPE_INT32", "dims": [1]})
        auto_complete_model_config.set_model_transaction_policy(dict(decoupled=True))
        return auto_complete_model_config

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

RECORDS_AUTO_COMPLETE_INPUT = """\
import json
import os

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        with open(os.path.join(os.path.dirname(__file__), "..", "seen.json"), "w") as seen:
            json.dump(config.as_dict(), seen)
        config.add_input({"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]})
        config.add_output({"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]})
        return config

    def execute(self, requests):
        return []
"""

ECHO = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]
            )
            for r in requests
        ]
"""

AUTO_COMPLETE_RAISES = """\
class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        raise ValueError("no shapes known")

    def execute(self, requests):
        return []
"""

AUTO_COMPLETE_RETURNS_NONE = """\
class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        return None

    def execute(self, requests):
        return []
"""

AUTO_COMPLETE_NO_DIMS = """\
class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.add_input({"name": "INPUT0", "data_type": "TYPE_FP32"})
        return config

    def execute(self, requests):
        return []
"""

OTHER_DTYPES = """\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        outputs = [
            pb_utils.Tensor("I32", np.array([0, 1], dtype=np.int64)),
            pb_utils.Tensor("F32", np.array([1.5, 2.5], dtype=np.float16)),
            pb_utils.Tensor("S", np.array([1, 22], dtype=np.object_)),
        ]
        return [pb_utils.InferenceResponse(outputs) for _ in requests]
"""

OTHER_DTYPES_CONFIG = """\
backend: "python"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [
  { name: "I32" data_type: TYPE_INT32 dims: [ 2 ] },
  { name: "F32" data_type: TYPE_FP32 dims: [ 2 ] },
  { name: "S" data_type: TYPE_STRING dims: [ 2 ] }
]
"""

CONSUME_INT32 = """\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        outputs = [pb_utils.Tensor("Y", np.array([1], dtype=np.int32))]
        return [pb_utils.InferenceResponse(outputs) for _ in requests]
"""

CONSUME_INT32_CONFIG = """\
backend: "python"
input [ { name: "X" data_type: TYPE_INT32 dims: [ 2 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

CHAIN_CONFIG = """\
platform: "ensemble"
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
ensemble_scheduling { step [
  { model_name: "dtypes" model_version: -1 input_map { key: "INPUT0" value: "IN" } output_map { key: "I32" value: "MID" } },
  { model_name: "consume" model_version: -1 input_map { key: "X" value: "MID" } output_map { key: "Y" value: "OUT" } }
] }
"""

RAW_BYTES = """\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            raw = pb_utils.get_input_tensor_by_name(request, "RAW").as_numpy()
            seen = repr((raw.shape, [bytes(x) for x in raw.reshape(-1)])).encode()
            info = np.array([[seen]], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("INFO", info)]))
        return responses
"""

RAW_BYTES_CONFIG = """\
backend: "python"
max_batch_size: 4
input [ { name: "RAW" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "INFO" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

RAISES = """\
class TritonPythonModel:
    def execute(self, requests):
        raise ValueError("boom")
"""

RETURNS_A_LIST = """\
class TritonPythonModel:
    def execute(self, requests):
        return [None for _ in requests]
"""

RETURNS_INTS = """\
class TritonPythonModel:
    def execute(self, requests):
        return [7 for _ in requests]
"""

DECOUPLED_CONFIG = """\
backend: "python"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
model_transaction_policy { decoupled: true }
"""

ONE_IN_ONE_OUT = """\
backend: "python"
{batch}
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {n} ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {n} ] }} ]
{extra}
"""


def _tensors(n: int, batch: str = "", extra: str = "") -> str:
    return ONE_IN_ONE_OUT.format(n=n, batch=batch, extra=extra)


def write_repository(root: Path) -> Path:
    def model(name: str, source: str, config: str | None = None, alt: str | None = None) -> None:
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(source)
        if config is not None:
            (root / name / "config.pbtxt").write_text(config)
        if alt is not None:
            (root / name / "configs").mkdir()
            (root / name / "configs" / "alt.pbtxt").write_text(alt)

    model("auto", AUTO)
    model("auto_decoupled", AUTO_DECOUPLED)
    model("records", RECORDS_AUTO_COMPLETE_INPUT)
    model("bare", ECHO)
    model("ac_raises", AUTO_COMPLETE_RAISES)
    model("ac_none", AUTO_COMPLETE_RETURNS_NONE)
    model("ac_no_dims", AUTO_COMPLETE_NO_DIMS)
    model("dtypes", OTHER_DTYPES, OTHER_DTYPES_CONFIG)
    model("dtypes_cached", OTHER_DTYPES, OTHER_DTYPES_CONFIG + "response_cache { enable: true }\n")
    model("raw_bytes", RAW_BYTES, RAW_BYTES_CONFIG)
    model("raw_bytes_2", RAW_BYTES, RAW_BYTES_CONFIG.replace("dims: [ 1 ] } ]\noutput", "dims: [ 2 ] } ]\noutput"))
    model("consume", CONSUME_INT32, CONSUME_INT32_CONFIG)
    (root / "chain" / "1").mkdir(parents=True)
    (root / "chain" / "config.pbtxt").write_text(CHAIN_CONFIG)
    model("decoupled_list", RETURNS_A_LIST, DECOUPLED_CONFIG)
    model("returns_ints", RETURNS_INTS, _tensors(4, extra="instance_group [ { count: 1 kind: KIND_CPU } ]"))
    model("inst", RAISES, _tensors(4, extra="instance_group [ { count: 1 kind: KIND_CPU } ]"))
    # auto_complete_config here contradicts both files (dims [4] against [2], max_batch_size 8 against
    # 4 dims [3]): the model loads only where it is not called.
    model("named", AUTO, _tensors(3, "max_batch_size: 4"), alt=_tensors(2, "max_batch_size: 2"))
    model("plain", ECHO, _tensors(5, "max_batch_size: 4"))
    return root


#: server -> (HTTP url, gRPC url)
Urls = dict[str, tuple[str, str]]


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_repository(tmp_path_factory.mktemp("compat_loading") / "models")


@pytest.fixture(scope="module")
def ours(repository: Path) -> Iterator[tuple[str, str]]:
    """Our server in explicit model control, nothing loaded: each test loads what it uses. It has a
    response cache (the peers' tritonserver has no cache library: its `dtypes_cached` runs each time)."""
    with running_server(loopback_config(repository, load=(), response_cache_bytes=1 << 20)) as server:
        yield server.http_url, f"127.0.0.1:{server.grpc_port}"


@pytest.fixture(scope="module")
def urls(peers: Path, repository: Path, ours: tuple[str, str]) -> Iterator[Urls]:
    """Both servers in explicit model control, auto-completion on (the folders without a config)."""
    with running_triton(peers, repository, extra_args=["--model-control-mode=explicit"]) as triton:
        yield {"triton": (triton.http_url, triton.grpc_url), "ours": ours}


@pytest.fixture(scope="module")
def complete_urls(peers: Path, repository: Path, ours: tuple[str, str]) -> Iterator[Urls]:
    """The same, Triton without auto-completion, for the models whose configs are complete and which
    define no auto_complete_config: auto-completion would add a second and more to each of their
    loads there (and a reload at the next load, the completed config differing from the file)."""
    explicit = ["--model-control-mode=explicit"]
    with running_triton(peers, repository, extra_args=explicit, auto_complete=False) as triton:
        yield {"triton": (triton.http_url, triton.grpc_url), "ours": ours}


@pytest.fixture(scope="module")
def strict_urls(peers: Path, repository: Path) -> Iterator[Urls]:
    """Auto-complete off, and --model-config-name alt."""
    args = ["--model-control-mode=explicit", "--disable-auto-complete-config", "--model-config-name=alt"]
    config = loopback_config(repository, load=(), auto_complete_config=False, model_config_name="alt")
    with running_triton(peers, repository, extra_args=args) as triton, running_server(config) as ours:
        yield {"triton": (triton.http_url, triton.grpc_url), "ours": (ours.http_url, f"127.0.0.1:{ours.grpc_port}")}


def _client(transport: str, pair: tuple[str, str]) -> Any:
    return (
        httpclient.InferenceServerClient(pair[0]) if transport == "http" else grpcclient.InferenceServerClient(pair[1])
    )


def _config(client: Any, model: str) -> dict[str, Any]:
    config = client.get_model_config(model)
    if isinstance(config, dict):
        return config
    return json.loads(json_format.MessageToJson(config.config, preserving_proto_field_name=True))


def _infer(transport: str, client: Any, model: str, inputs: dict[str, np.ndarray]) -> dict[str, tuple[str, Any]]:
    """Each output's (datatype, values) as tritonclient reads them."""
    module = httpclient if transport == "http" else grpcclient
    tensors = []
    for name, array in inputs.items():
        tensor = module.InferInput(name, list(array.shape), module.np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    result = client.infer(model, tensors)
    response = result.get_response()
    outputs = (
        response["outputs"]
        if transport == "http"
        else [{"name": o.name, "datatype": o.datatype} for o in response.outputs]
    )
    return {o["name"]: (o["datatype"], result.as_numpy(o["name"]).tolist()) for o in outputs}


def _each(urls: Urls, transport: str, call: Callable[[Any], Any]) -> dict[str, Any]:
    answers = {}
    for server, pair in urls.items():
        client = _client(transport, pair)
        try:
            answers[server] = call(client)
        finally:
            client.close()
    return answers


def _failures(urls: Urls, transport: str, call: Callable[[Any], Any]) -> dict[str, InferenceServerException]:
    def failing(client: Any) -> InferenceServerException:
        with pytest.raises(InferenceServerException) as caught:
            call(client)
        return caught.value

    return _each(urls, transport, failing)


def _tensor_fields(config: dict[str, Any]) -> dict[str, Any]:
    def tensors(kind: str) -> list[tuple[str, str, list[int]]]:
        return [(t["name"], t["data_type"], [int(d) for d in t.get("dims", [])]) for t in config.get(kind, [])]

    return {
        "max_batch_size": int(config.get("max_batch_size", 0)),
        "input": tensors("input"),
        "output": tensors("output"),
        "dynamic_batching": "dynamic_batching" in config and config["dynamic_batching"] is not None,
        "backend": config.get("backend"),
        "decoupled": bool((config.get("model_transaction_policy") or {}).get("decoupled", False)),
        "instance_group": [(g["name"], g["kind"], int(g["count"])) for g in config.get("instance_group", [])],
    }


X = np.array([[1.5, -2.0, 3.25, 100.0]], dtype=np.float32)
TRANSPORTS = ["http", "grpc"]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_folder_with_only_model_py_loads_from_its_auto_complete_config(urls: Urls, transport: str) -> None:
    def load_and_run(client: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        client.load_model("auto")
        return _tensor_fields(_config(client, "auto")), _infer(transport, client, "auto", {"INPUT0": X})

    answers = _each(urls, transport, load_and_run)
    assert answers["ours"] == answers["triton"]
    config, outputs = answers["ours"]
    assert config == {
        "max_batch_size": 8,
        "input": [("INPUT0", "TYPE_FP32", [4])],
        "output": [("OUTPUT0", "TYPE_FP32", [4])],
        "dynamic_batching": True,
        "backend": "python",
        "decoupled": False,
        "instance_group": [("auto", "KIND_CPU", 1)],  # KIND_CPU where there is no GPU, as Triton shows it
    }
    assert outputs == {"OUTPUT0": ("FP32", (X * 2).tolist())}


def test_auto_complete_config_is_given_the_config_triton_gives_it(urls: Urls, repository: Path) -> None:
    seen = repository / "records" / "seen.json"
    given = {}
    for server, pair in urls.items():  # one after the other: both write the same file
        client = httpclient.InferenceServerClient(pair[0])
        client.load_model("records")
        client.close()
        fields = ("name", "backend", "platform", "default_model_filename", "max_batch_size", "input", "output")
        given[server] = {key: json.loads(seen.read_text()).get(key) for key in fields}
        seen.unlink()
    assert given["ours"] == given["triton"]
    assert given["ours"]["default_model_filename"] == "model.py"


def test_auto_complete_config_sets_the_decoupled_transaction_policy(urls: Urls) -> None:
    def load(client: Any) -> dict[str, Any]:
        client.load_model("auto_decoupled")
        return _tensor_fields(_config(client, "auto_decoupled"))

    answers = _each(urls, "grpc", load)
    assert answers["ours"] == answers["triton"]
    assert answers["ours"]["decoupled"] is True


def test_a_model_py_without_auto_complete_config_loads_without_tensors(urls: Urls) -> None:
    def load(client: Any) -> dict[str, Any]:
        client.load_model("bare")
        return _tensor_fields(_config(client, "bare"))

    answers = _each(urls, "http", load)
    assert answers["ours"] == answers["triton"]
    assert answers["ours"]["input"] == answers["ours"]["output"] == []


@pytest.mark.parametrize(
    ("model", "words"),
    [
        ("ac_raises", "ValueError: no shapes known"),
        ("ac_none", "auto_complete_config function in model 'ac_none' must return a valid pb.ModelConfig object."),
        (
            "ac_no_dims",
            "input 'INPUT0' in auto-complete-config function for model 'ac_no_dims' is missing 'dims' property",
        ),
    ],
)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_failing_auto_complete_config_fails_the_load_in_tritons_words(
    urls: Urls, transport: str, model: str, words: str
) -> None:
    _each(urls, transport, lambda client: client.load_model("plain"))
    failures = _failures(urls, transport, lambda client: client.load_model(model))
    assert failures["ours"].status() == failures["triton"].status()
    for failure in failures.values():
        assert failure.message().startswith(f"load failed for model '{model}': ")
        assert words in failure.message()
    # The others keep serving.
    ready = _each(urls, transport, lambda client: (client.is_model_ready("plain"), client.is_model_ready(model)))
    assert ready == {"triton": (True, False), "ours": (True, False)}


@pytest.mark.parametrize("model", ["dtypes", "dtypes_cached"])
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_outputs_leave_with_the_datatype_the_model_made(complete_urls: Urls, transport: str, model: str) -> None:
    def run(client: Any) -> list[dict[str, Any]]:
        client.load_model(model)
        return [_infer(transport, client, model, {"INPUT0": X[0]}) for _ in range(2)]  # a cached answer too

    answers = _each(complete_urls, transport, run)
    if model == "dtypes_cached":
        client = httpclient.InferenceServerClient(complete_urls["ours"][0])
        stats = client.get_inference_statistics(model)["model_stats"][0]["inference_stats"]
        client.close()
        assert stats["cache_hit"]["count"] >= 1  # the second answer came from our cache
    assert answers["ours"] == answers["triton"]
    assert (
        answers["ours"][0]
        == answers["ours"][1]
        == {
            "I32": ("INT64", [0, 1]),
            "F32": ("FP16", [1.5, 2.5]),
            "S": ("BYTES", [b"1", b"22"]),  # Python ints in a STRING output: their str()
        }
    )


def test_an_fp16_output_asked_for_as_json_is_refused_in_tritons_words(complete_urls: Urls) -> None:
    def run(client: Any) -> None:
        client.load_model("dtypes")
        x = httpclient.InferInput("INPUT0", [4], "FP32")
        x.set_data_from_numpy(X[0], binary_data=False)
        client.infer("dtypes", [x], outputs=[httpclient.InferRequestedOutput("F32", binary_data=False)])

    failures = _failures(complete_urls, "http", run)
    assert failures["ours"].status() == failures["triton"].status() == "400"
    words = "sending FP16 data via JSON is not supported. Please use the binary data format for output"
    for failure in failures.values():
        assert failure.message().startswith(words)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_ensemble_step_given_an_output_of_another_datatype_fails_in_tritons_words(
    complete_urls: Urls, transport: str
) -> None:
    _each(complete_urls, transport, lambda client: [client.load_model(m) for m in ("dtypes", "consume", "chain")])
    failures = _failures(complete_urls, transport, lambda client: _infer(transport, client, "chain", {"IN": X[0]}))
    assert failures["ours"].status() == failures["triton"].status()
    for failure in failures.values():
        assert failure.message().startswith("in ensemble 'chain', ")
        assert "inference input 'X' data-type is 'INT64', but model 'consume' expects 'INT32'" in failure.message()


def _post_raw(url: str, model: str, body: bytes) -> tuple[int, Any]:
    """A raw binary request (no JSON header): the status, and the INFO output's shape and values or
    the error's message."""
    request = urllib.request.Request(
        f"http://{url}/v2/models/{model}/infer",
        data=body,
        headers={"Inference-Header-Content-Length": "0", "Content-Type": "application/octet-stream"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            length = int(response.headers["Inference-Header-Content-Length"])
            result = httpclient.InferResult.from_response_body(response.read(), header_length=length)
            return response.status, (result.get_output("INFO")["shape"], result.as_numpy("INFO").tolist())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())["error"]


def test_a_raw_binary_bytes_request_to_a_batched_model_is_one_element_of_shape_1_1(complete_urls: Urls) -> None:
    body = b"\x05\x00\x00\x00hello"  # what looks like a length prefix is part of the one element
    _each(complete_urls, "http", lambda client: client.load_model("raw_bytes"))
    answers = {server: _post_raw(pair[0], "raw_bytes", body) for server, pair in complete_urls.items()}
    assert answers["ours"] == answers["triton"]
    assert answers["ours"] == (200, ([1, 1], [[repr(((1, 1), [body])).encode()]]))


def test_a_raw_binary_request_to_a_bytes_input_of_two_elements_is_refused_in_tritons_words(complete_urls: Urls) -> None:
    _each(complete_urls, "http", lambda client: client.load_model("raw_bytes_2"))
    answers = {server: _post_raw(pair[0], "raw_bytes_2", b"hello") for server, pair in complete_urls.items()}
    assert answers["ours"][0] == answers["triton"][0] == 400
    for _, message in answers.values():
        assert "For BYTE datatype raw input 'RAW', the model must have input shape [1]" in message


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_error_raised_in_execute_names_the_instance(complete_urls: Urls, transport: str) -> None:
    _each(complete_urls, transport, lambda client: client.load_model("inst"))
    failures = _failures(complete_urls, transport, lambda client: _infer(transport, client, "inst", {"INPUT0": X[0]}))
    assert failures["ours"].status() == failures["triton"].status()
    for failure in failures.values():
        # An instance_group without a name is `inst_0`, and its first instance `inst_0_0`.
        assert failure.message().startswith("Failed to process the request(s) for model 'inst_0_0', message: ")
        assert "ValueError: boom" in failure.message()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_what_execute_returns_is_checked_in_tritons_words(complete_urls: Urls, transport: str) -> None:
    _each(complete_urls, transport, lambda client: client.load_model("returns_ints"))
    failures = _failures(
        complete_urls, transport, lambda client: _infer(transport, client, "returns_ints", {"INPUT0": X[0]})
    )
    words = (
        "Failed to process the request(s) for model 'returns_ints_0_0', message: Expected an 'InferenceResponse' "
        "object in the execute function return list, found type '<class 'int'>'"
    )
    for failure in failures.values():
        assert failure.message().startswith(words)


def test_a_decoupled_execute_that_returns_a_list_names_the_instance(complete_urls: Urls) -> None:
    def stream(client: Any) -> list[str]:
        client.load_model("decoupled_list")
        answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        try:
            tensor = grpcclient.InferInput("INPUT0", [4], "FP32")
            tensor.set_data_from_numpy(X[0])
            client.async_stream_infer("decoupled_list", [tensor])
            _, error = answers.get(timeout=30)
        finally:
            client.stop_stream()
        return [error.message()]

    answers = _each(complete_urls, "grpc", stream)
    assert (
        answers["ours"]
        == answers["triton"]
        == [
            "Failed to process the request(s) for model 'decoupled_list_0_0', message: Python model "
            "'decoupled_list_0_0' is using the decoupled mode and the execute function must return None."
        ]
    )


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_load_override_that_leaves_no_version_fails_in_tritons_words(urls: Urls, transport: str) -> None:
    override = json.dumps({"backend": "python", "version_policy": {"specific": {"versions": [7]}}})
    _each(urls, transport, lambda client: client.load_model("auto"))
    failures = _failures(urls, transport, lambda client: client.load_model("auto", config=override))
    assert failures["ours"].status() == failures["triton"].status()
    words = (
        "load failed for model 'auto': at least one version must be available under the version policy of model 'auto'"
    )
    for failure in failures.values():
        assert failure.message().startswith(words)
    assert _each(urls, transport, lambda client: client.is_model_ready("auto")) == {"triton": True, "ours": True}


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_without_auto_complete_a_folder_without_config_fails_to_poll(strict_urls: Urls, transport: str) -> None:
    failures = _failures(strict_urls, transport, lambda client: client.load_model("auto"))
    triton, ours = failures["triton"], failures["ours"]
    assert triton.message() == "failed to load 'auto', failed to poll from model repository"
    # Ours adds the reason, with a client's status for a client's repository (docs/reliability.md, "Bad input").
    assert ours.message().startswith(triton.message() + ": ")
    assert "--disable-auto-complete-config" in ours.message()


def test_model_config_name_picks_configs_name_pbtxt_and_auto_complete_stays_off(strict_urls: Urls) -> None:
    def load(client: Any) -> dict[str, Any]:
        client.load_model("named")
        client.load_model("plain")
        return {model: _tensor_fields(_config(client, model)) for model in ("named", "plain")}

    answers = _each(strict_urls, "http", load)
    assert answers["ours"] == answers["triton"]
    named, plain = answers["ours"]["named"], answers["ours"]["plain"]
    assert (named["max_batch_size"], named["input"], named["dynamic_batching"]) == (
        2,
        [("INPUT0", "TYPE_FP32", [2])],
        False,
    )
    assert plain["input"] == [("INPUT0", "TYPE_FP32", [5])]  # no configs/alt.pbtxt: config.pbtxt
