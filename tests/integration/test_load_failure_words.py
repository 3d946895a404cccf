"""A model whose load fails, and the model-control calls around it, answer as on tritonserver 2.51:
the same model folders on real tritonserver and on the reference server, with tritonclient over
HTTP and gRPC (NVIDIA's model-control examples check these words).

- A python model raising in `initialize` (sys.exit too), at import, with a SyntaxError, or in
  `auto_complete_config`, or defining no TritonPythonModel: the load answers "load failed for model 'X': version 1 is at UNAVAILABLE
  state: Internal: <the Python error and its frames>;\\n" (HTTP 400, gRPC INVALID_ARGUMENT), the
  repository index lists version 1 as UNAVAILABLE with "Internal: ..." as the reason, metadata and
  config answer 404 "Request for unknown model: 'X' has no available versions", and both logs say
  "failed to load 'X' version 1: Internal: ...".
- Unloading a model that is not loaded succeeds, whether it is in the repository, failed to load,
  or does not exist at all, over HTTP, gRPC and `pb_utils.unload_model`; a model unloaded is listed
  by version ("unloaded") and answers Triton's 404.
- Every version of a load is tried and each one that fails is told; one that loaded beside them is
  dropped and listed as "unloaded".
- `auto_complete_config` is given, and `initialize(args["model_config"])` sees, the config Triton
  gives them (version_policy, optimization, instance_group filled), for a folder without
  config.pbtxt and for one with a partial one; the config endpoint answers the same config.

Remaining differences, on purpose or beyond our reach:
- An import error's importlib frames carry the line numbers of the interpreter that runs the stub
  (Triton's stub embeds Debian's Python 3.11.2, ours runs the server's 3.11): they are compared
  without the numbers.
- An error raised inside `pb_utils` (e.g. `add_input` refusing a tensor without dims): Triton lists
  the frame of its triton_python_backend_utils.py, ours leaves out the frames of our own module,
  whose path could not be Triton's anyway.
- A model that fails before its versions (a config.pbtxt that does not parse, no version folder):
  the load's answer goes on after Triton's words with ours (the file and line, the folders found),
  a config that does not parse is 400 (Triton: 500), and the index lists it with its state and
  reason (Triton: the name alone, or not at all without a version folder), which is where a client
  can read why.
- The peers' tritonserver bundles no onnxruntime backend, so an ONNX file that is not a model is
  checked on our server only, against the onnxruntime backend's words ("onnx runtime error 7: ...",
  an Internal status, from its RETURN_IF_ORT_ERROR).
"""

from __future__ import annotations

import itertools
import json
import logging
import re
import time
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

INIT_RAISES = """\
class TritonPythonModel:
    def initialize(self, args):
        raise ValueError("init boom")

    def execute(self, requests):
        return []
"""

IMPORT_RAISES = 'raise RuntimeError("import boom")\n'

SYNTAX_ERROR = """\
class TritonPythonModel:
    def execute(self, requests)
        return []
"""

NO_CLASS = "X = 1\n"

INIT_EXITS = """\
import sys


class TritonPythonModel:
    def initialize(self, args):
        sys.exit(3)

    def execute(self, requests):
        return []
"""

AUTO_COMPLETE_RAISES = """\
class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        raise ValueError("no shapes known")

    def execute(self, requests):
        return []
"""

# Writes what auto_complete_config and initialize are given into the model folder.
RECORDS = """\
import json
import os


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        with open(os.path.join(os.path.dirname(os.path.dirname(__file__)), "seen.json"), "w") as seen:
            json.dump(config.as_dict(), seen)
        return config

    def initialize(self, args):
        with open(os.path.join(os.path.dirname(os.path.dirname(__file__)), "init.json"), "w") as seen:
            seen.write(args["model_config"])

    def execute(self, requests):
        return []
"""

PARTIAL_CONFIG = """\
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""

OK = """\
class TritonPythonModel:
    def execute(self, requests):
        return []
"""

# Unloads the model its NAME input names, and answers what pb_utils.unload_model said.
UNLOADER = """\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            name = pb_utils.get_input_tensor_by_name(request, "NAME").as_numpy()[0].decode()
            try:
                pb_utils.unload_model(name)
                said = "ok"
            except Exception as exc:
                said = f"{type(exc).__name__}: {exc}"
            said = np.array([said.encode()], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SAID", said)]))
        return responses
"""

UNLOADER_CONFIG = """\
backend: "python"
input [ { name: "NAME" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "SAID" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

FAILING = ["init_raises", "import_raises", "syntax_error", "ac_raises", "no_class", "init_exits"]
TRANSPORTS = ["http", "grpc"]

#: server -> (HTTP url, gRPC url)
Urls = dict[str, tuple[str, str]]


def write_repository(root: Path) -> Path:
    def model(name: str, source: str, config: str | None = None) -> None:
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(source)
        if config is not None:
            (root / name / "config.pbtxt").write_text(config)

    for name, source in zip(
        FAILING, (INIT_RAISES, IMPORT_RAISES, SYNTAX_ERROR, AUTO_COMPLETE_RAISES, NO_CLASS, INIT_EXITS)
    ):
        model(name, source)
    model("rec_none", RECORDS)
    model("rec_partial", RECORDS, PARTIAL_CONFIG)
    model("okmodel", OK)
    model("unloader", UNLOADER, UNLOADER_CONFIG)
    model("multi", OK, 'backend: "python"\nversion_policy: { all {} }\n')
    for version in (2, 3):
        (root / "multi" / str(version)).mkdir()
        (root / "multi" / str(version) / "model.py").write_text(INIT_RAISES.replace("init boom", f"v{version} boom"))
    model("badcfg", OK, 'backend: "python"\nmax_batch_size: [ oops ]\n')
    model("misnamed", OK, 'name: "other_name"\nbackend: "python"\n')
    (root / "noversion").mkdir()
    (root / "noversion" / "config.pbtxt").write_text('backend: "python"\n')
    (root / "bad_onnx" / "1").mkdir(parents=True)
    (root / "bad_onnx" / "1" / "model.onnx").write_text("not a model\n")
    return root


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_repository(tmp_path_factory.mktemp("load_failure") / "models")


@pytest.fixture(scope="module")
def servers(peers: Path, repository: Path) -> Iterator[dict[str, Any]]:
    """Both servers in explicit model control, nothing loaded: each test loads what it uses."""
    with (
        running_triton(peers, repository, extra_args=["--model-control-mode=explicit"]) as triton,
        running_server(loopback_config(repository, load=())) as ours,
    ):
        yield {"triton": triton, "ours": ours}


@pytest.fixture(scope="module")
def urls(servers: dict[str, Any]) -> Urls:
    triton, ours = servers["triton"], servers["ours"]
    return {"triton": (triton.http_url, triton.grpc_url), "ours": (ours.http_url, f"127.0.0.1:{ours.grpc_port}")}


@pytest.fixture(scope="module")
def init_raises_failed(urls: Urls) -> None:
    """`init_raises` has failed to load on both servers: loaded once for the tests that need a model in
    that state (a load that fails takes 1.7 s, and the failure stays, unloaded or not, until a load
    succeeds: `test_unloading_a_model_that_is_not_loaded_succeeds` checks that)."""
    _each(urls, "http", lambda client: _failure(lambda: client.load_model("init_raises")))


def _client(transport: str, pair: tuple[str, str]) -> Any:
    return (
        httpclient.InferenceServerClient(pair[0]) if transport == "http" else grpcclient.InferenceServerClient(pair[1])
    )


def _each(urls: Urls, transport: str, call: Callable[[Any], Any]) -> dict[str, Any]:
    answers = {}
    for server, pair in urls.items():
        client = _client(transport, pair)
        try:
            answers[server] = call(client)
        finally:
            client.close()
    return answers


def _failure(call: Callable[[], Any]) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return str(caught.value.status()), _same_lines(caught.value.message())


_IMPORTLIB_LINE = re.compile(r"(<frozen importlib\._bootstrap(?:_external)?>)\(\d+\)")


def _same_lines(text: str) -> str:
    """`text` without importlib's line numbers, which are the stub interpreter's own."""
    return _IMPORTLIB_LINE.sub(r"\1(N)", text)


def _index(client: Any) -> list[dict[str, str]]:
    index = client.get_model_repository_index()
    if not isinstance(index, list):
        index = json_format.MessageToDict(index, preserving_proto_field_name=True).get("models", [])
    return [json.loads(_same_lines(json.dumps(entry))) for entry in index]


WORDS = {
    "init_raises": "Internal: ValueError: init boom\n\nAt:\n  {dir}/init_raises/1/model.py(3): initialize\n",
    "import_raises": (
        "Internal: RuntimeError: import boom\n\nAt:\n  {dir}/import_raises/1/model.py(1): <module>\n"
        "  <frozen importlib._bootstrap>(N): _call_with_frames_removed\n"
        "  <frozen importlib._bootstrap_external>(N): exec_module\n"
        "  <frozen importlib._bootstrap>(N): _load_unlocked\n"
        "  <frozen importlib._bootstrap>(N): _find_and_load_unlocked\n"
        "  <frozen importlib._bootstrap>(N): _find_and_load\n"
    ),
    "syntax_error": "Internal: SyntaxError: expected ':' (model.py, line 2)",
    "ac_raises": "Internal: ValueError: no shapes known\n\nAt:\n  {dir}/ac_raises/1/model.py(4): auto_complete_config\n",
    # Triton's stub imports the file as `<version>.model`.
    "no_class": "Internal: AttributeError: module '1.model' has no attribute 'TritonPythonModel'",
    "init_exits": "Internal: SystemExit: 3\n\nAt:\n  {dir}/init_exits/1/model.py(6): initialize\n",
}


@pytest.mark.parametrize("model", FAILING)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_version_that_fails_to_load_answers_in_tritons_words(
    urls: Urls, repository: Path, transport: str, model: str
) -> None:
    answers = _each(urls, transport, lambda client: _failure(lambda: client.load_model(model)))
    assert answers["ours"] == answers["triton"]
    reason = WORDS[model].format(dir=repository.resolve())
    status = "400" if transport == "http" else "StatusCode.INVALID_ARGUMENT"
    assert answers["ours"] == (
        status,
        f"load failed for model '{model}': version 1 is at UNAVAILABLE state: {reason};\n",
    )

    # Its metadata and config: Triton's 404 and words; ready: no.
    def asked(client: Any) -> list[Any]:
        return [
            _failure(lambda: client.get_model_metadata(model)),
            _failure(lambda: client.get_model_config(model)),
            client.is_model_ready(model),
        ]

    answers = _each(urls, transport, asked)
    assert answers["ours"] == answers["triton"]
    words = f"Request for unknown model: '{model}' has no available versions"
    not_found = "404" if transport == "http" else "StatusCode.NOT_FOUND"
    assert answers["ours"] == [(not_found, words), (not_found, words), False]

    # The index lists the version with the reason.
    entries = _each(urls, transport, lambda client: [e for e in _index(client) if e["name"] == model])
    assert entries["ours"] == entries["triton"]
    assert entries["ours"] == [{"name": model, "version": "1", "state": "UNAVAILABLE", "reason": reason}]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_each_version_that_fails_is_told_and_the_one_that_loaded_is_unloaded(
    urls: Urls, repository: Path, transport: str
) -> None:
    answers = _each(urls, transport, lambda client: _failure(lambda: client.load_model("multi")))
    (status, triton), (our_status, ours) = answers["triton"], answers["ours"]
    assert our_status == status

    def reason(version: int) -> str:
        return f"Internal: ValueError: v{version} boom\n\nAt:\n  {repository.resolve()}/multi/{version}/model.py(3): initialize\n"

    # Triton loads the versions in parallel; the order of its list is not a promise: compared as a set.
    segments = {f"version {v} is at UNAVAILABLE state: {reason(v)};" for v in (2, 3)}
    assert ours == "load failed for model 'multi': " + "".join(sorted(segments, reverse=True)) + "\n"
    orders = {"load failed for model 'multi': " + "".join(order) + "\n" for order in itertools.permutations(segments)}
    assert triton in orders
    entries = _each(urls, transport, lambda client: [e for e in _index(client) if e["name"] == "multi"])
    failed = [{"name": "multi", "version": str(v), "state": "UNAVAILABLE", "reason": reason(v)} for v in (2, 3)]
    assert entries["triton"][1:] == entries["ours"][1:] == failed
    # Version 1 loaded and was dropped with them (Triton may still be unloading it).
    assert entries["ours"][0] == {"name": "multi", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}
    assert entries["triton"][0]["state"] in ("UNLOADING", "UNAVAILABLE")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_model_that_failed_before_its_versions_answers_tritons_404(urls: Urls, transport: str) -> None:
    def asked(client: Any) -> dict[str, tuple[str, str]]:
        answers = {}
        # A config that does not parse; one whose name is not its folder's; no version folder.
        for model in ("badcfg", "misnamed", "noversion"):
            load = _failure(lambda model=model: client.load_model(model))
            assert load[1].startswith(
                f"failed to load '{model}', failed to poll" if model != "noversion" else "load failed"
            )
            answers[model] = _failure(lambda model=model: client.get_model_metadata(model))
        return answers

    answers = _each(urls, transport, asked)
    assert answers["ours"] == answers["triton"]
    not_found = "404" if transport == "http" else "StatusCode.NOT_FOUND"
    assert answers["ours"] == {
        "badcfg": (not_found, "Request for unknown model: 'badcfg' is not found"),
        "misnamed": (not_found, "Request for unknown model: 'misnamed' is not found"),
        "noversion": (not_found, "Request for unknown model: 'noversion' has no available versions"),
    }


def test_both_logs_say_which_version_failed_and_why(
    servers: dict[str, Any], urls: Urls, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    _each(urls, "http", lambda client: _failure(lambda: client.load_model("init_raises")))
    line = "failed to load 'init_raises' version 1: Internal: ValueError: init boom"
    triton_log = Path(servers["triton"].log_path).read_text()
    assert line in triton_log and "Failed to create instance: ValueError: init boom" in triton_log
    ours = [record.getMessage() for record in caplog.records]
    assert any(message.startswith(line) for message in ours)
    assert "ERROR: Failed to create instance: ValueError: init boom\n\nAt:\n" in "\n".join(ours)
    # Where it failed, which the answer leaves out, is in our log.
    assert any("init_raises_0" in message and "model.py" in message for message in ours)


def test_the_model_ready_endpoint_answers_a_model_that_failed_in_tritons_words(
    urls: Urls, init_raises_failed: None
) -> None:
    answers = {}
    for server, (http_url, _) in urls.items():
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://{http_url}/v2/models/init_raises/ready", timeout=30)
        answers[server] = (refused.value.code, json.loads(refused.value.read()))
    assert answers["ours"] == answers["triton"] == (400, {"error": "Model version not ready"})


def test_an_onnx_file_that_is_not_a_model_fails_in_the_onnxruntime_backends_words(urls: Urls, repository: Path) -> None:
    client = httpclient.InferenceServerClient(urls["ours"][0])
    try:
        status, message = _failure(lambda: client.load_model("bad_onnx"))
        (entry,) = [e for e in _index(client) if e["name"] == "bad_onnx"]
    finally:
        client.close()
    path = repository.resolve() / "bad_onnx" / "1" / "model.onnx"
    reason = f"Internal: onnx runtime error 7: Load model from {path} failed:Protobuf parsing failed."
    assert (status, message) == (
        "400",
        f"load failed for model 'bad_onnx': version 1 is at UNAVAILABLE state: {reason};\n",
    )
    assert entry == {"name": "bad_onnx", "version": "1", "state": "UNAVAILABLE", "reason": reason}


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_unloading_a_model_that_is_not_loaded_succeeds(urls: Urls, init_raises_failed: None, transport: str) -> None:
    def unload(client: Any) -> list[dict[str, str]]:
        for name in ("okmodel", "nonexistent", "init_raises"):  # in the repository, nowhere, failed
            client.unload_model(name)
        return [e for e in _index(client) if e["name"] in ("okmodel", "init_raises")]

    answers = _each(urls, transport, unload)
    assert answers["ours"] == answers["triton"]
    assert answers["ours"][1] == {"name": "okmodel"}  # listed as before
    assert answers["ours"][0]["reason"].startswith("Internal: ValueError: init boom")  # the failure stays


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_unloaded_model_is_listed_by_version_and_answers_404(urls: Urls, transport: str) -> None:
    def unload(client: Any) -> list[Any]:
        client.load_model("okmodel")
        client.unload_model("okmodel")
        deadline = time.monotonic() + 30  # Triton unloads in the background
        while True:
            entries = [e for e in _index(client) if e["name"] == "okmodel"]
            if entries[0].get("state") != "UNLOADING" or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        return [entries, _failure(lambda: client.get_model_metadata("okmodel"))]

    answers = _each(urls, transport, unload)
    assert answers["ours"] == answers["triton"]
    not_found = "404" if transport == "http" else "StatusCode.NOT_FOUND"
    assert answers["ours"] == [
        [{"name": "okmodel", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}],
        (not_found, "Request for unknown model: 'okmodel' has no available versions"),
    ]


def test_unload_model_from_a_model_succeeds_for_a_model_that_is_not_loaded(urls: Urls) -> None:
    def unload(client: Any) -> list[str]:
        client.load_model("unloader")
        said = []
        for name in ("okmodel", "nonexistent"):
            tensor = httpclient.InferInput("NAME", [1], "BYTES")
            tensor.set_data_from_numpy(np.array([name.encode()], dtype=np.object_))
            said.append(client.infer("unloader", [tensor]).as_numpy("SAID")[0].decode())
        return said

    answers = _each(urls, "http", unload)
    assert answers["ours"] == answers["triton"] == ["ok", "ok"]


@pytest.mark.parametrize("model", ["rec_none", "rec_partial"])
def test_auto_complete_config_and_initialize_see_the_config_triton_gives_them(
    urls: Urls, repository: Path, model: str
) -> None:
    seen, init = repository / model / "seen.json", repository / model / "init.json"
    given: dict[str, dict[str, Any]] = {}
    for server, pair in urls.items():  # one after the other: both write the same files
        client = httpclient.InferenceServerClient(pair[0])
        try:
            client.load_model(model)
            config = client.get_model_config(model)
            client.unload_model(model)
        finally:
            client.close()
        given[server] = {
            "auto_complete_config": json.loads(seen.read_text()),
            "initialize": json.loads(init.read_text()),
        }
        given[server]["config endpoint"] = config
        seen.unlink()
        init.unlink()
    for what in ("auto_complete_config", "initialize", "config endpoint"):
        ours, triton = given["ours"][what], given["triton"][what]
        assert sorted(ours) == sorted(triton), what
        for key in triton:
            assert ours[key] == triton[key], (what, key)
    auto = given["ours"]["auto_complete_config"]
    assert auto["version_policy"] == {"latest": {"num_versions": 1}}
    assert auto["instance_group"][0]["name"] == model and auto["instance_group"][0]["kind"] == "KIND_CPU"
    assert auto["optimization"]["input_pinned_memory"] == {"enable": True}
