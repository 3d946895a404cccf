"""Config fuzzing: malformed and hostile config.pbtxt files each give a clear error naming the model's
files, and never take down the other models or the server.

Two parts: a table of hostile repositories loaded at server start (symlinks out of the repository,
files that are not ONNX, configs that contradict the graph, non-UTF-8, paths that leave the
version folder), and a property test that writes generated configs (structurally valid or not,
with negative and huge numbers, then possibly corrupted as text) into one model folder and loads
it through the repository API, while the demo models keep serving.

Not generated here, on purpose: huge instance counts, thread counts and warmup sizes. Those ask
the server to do a huge amount of work that the config permits; loading them would not crash
anything, just take the time and memory asked for.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import event, given
from hypothesis import strategies as st
from tritonclient.grpc import model_config_pb2 as mc

from reference_server.config import ServerConfig
from reference_server.server import ReferenceServer, running_server
from tests.fuzz.wire import RawHttp, crashes_logged, fuzz_settings
from tests.servers import loopback_config

pytestmark = [pytest.mark.integration, pytest.mark.fuzz]

MLP_REQUEST = json.dumps(
    {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 256], "data": [0.5] * 256}]}
).encode()


def _server(repository: Path, **overrides: object) -> ServerConfig:
    return loopback_config(repository, **overrides)


def _index(http: RawHttp) -> dict[str, dict[str, str]]:
    status, _, body = http.request("POST", b"/v2/repository/index", b"{}")
    assert status == 200, body
    return {entry["name"]: entry for entry in json.loads(body)}


# --- hostile repositories ----------------------------------------------------------------------------


def _identity_with(repository: Path, name: str, config: str | bytes | None) -> Path:
    folder = repository / name
    shutil.copytree(repository / "identity", folder)
    if config is None:
        (folder / "config.pbtxt").unlink()
    elif isinstance(config, bytes):
        (folder / "config.pbtxt").write_bytes(config)
    else:
        (folder / "config.pbtxt").write_text(config)
    return folder


HOSTILE_CONFIGS: dict[str, str | bytes] = {
    "negative_batch": "max_batch_size: -4",
    "wrong_rank": 'max_batch_size: 8 input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2, 2, 2 ] } ]',
    "wrong_type": 'max_batch_size: 8 input [ { name: "INPUT0" data_type: TYPE_INT8 dims: [ -1 ] } ]',
    "no_such_input": 'max_batch_size: 8 input [ { name: "NOPE" data_type: TYPE_FP32 dims: [ -1 ] } ]',
    "negative_preferred": "max_batch_size: 8 dynamic_batching { preferred_batch_size: [ -3 ] }",
    "escaping_filename": 'default_model_filename: "../../outside/1/model.onnx"',
    "absolute_filename": 'default_model_filename: "/etc/passwd"',
    "not_utf8": b'name: "not_utf8"\nmax_batch_size: 8 # \xff\xfe\n',
    "unknown_field": "max_batch_size: 8\nfavourite_colour: BLUE\n",
    "gpu_that_is_not_there": "instance_group [ { kind: KIND_GPU gpus: [ 99 ] } ]",
    "no_version_left": "version_policy { specific { versions: [ 42 ] } }",
    "warmup_outside": (
        'max_batch_size: 8 model_warmup [ { name: "w" batch_size: 1 inputs { key: "INPUT0" value: '
        '{ data_type: TYPE_FP32 dims: [ 4 ] input_data_file: "../../../outside/config.pbtxt" } } } ]'
    ),
}
#: Configs Triton loads, and so do we: a negative instance count means one instance, and a huge
#: max_batch_size is only a ceiling (the element limit still bounds each request).
ACCEPTED_CONFIGS = {
    "negative_count": "max_batch_size: 8 instance_group [ { count: -5 kind: KIND_CPU } ]",
    "huge_max_batch": "max_batch_size: 2147483647",
    "huge_dims": 'max_batch_size: 8 input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 9223372036854775807 ] } ]',
}
#: Refused with the model named, but not yet its config file (model_config.model_file words it).
NAMED_BY_MODEL_ONLY = {"escaping_filename", "absolute_filename"}


@pytest.fixture(scope="module")
def hostile_repository(demo_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hostile")
    repository = root / "models"
    shutil.copytree(demo_repository, repository)
    shutil.copytree(demo_repository / "identity", root / "outside")
    for name, text in {**HOSTILE_CONFIGS, **ACCEPTED_CONFIGS}.items():
        _identity_with(repository, name, text)
    (repository / "escapes").symlink_to(root / "outside", target_is_directory=True)
    for name, payload in {
        "not_onnx": b"\x08\x07this is not an ONNX graph",
        "empty_model": b"",
        "truncated_onnx": (demo_repository / "mlp" / "1" / "model.onnx").read_bytes()[:5000],
    }.items():
        (_identity_with(repository, name, None) / "1" / "model.onnx").write_bytes(payload)
    folder = _identity_with(repository, "config_is_a_folder", None)
    (folder / "config.pbtxt").mkdir()
    folder = _identity_with(repository, "version_is_a_file", None)
    shutil.rmtree(folder / "1")
    (folder / "1").write_bytes(b"")
    return repository


def test_each_hostile_model_fails_alone_with_its_file_named(hostile_repository: Path) -> None:
    with crashes_logged() as crashes, running_server(_server(hostile_repository)) as server:
        assert server.http_port is not None
        http = RawHttp(server.http_port)
        status, _, body = http.request("POST", b"/v2/models/mlp/infer", MLP_REQUEST)
        assert status == 200, body
        index = _index(http)
        broken = [*HOSTILE_CONFIGS, "escapes", "not_onnx", "empty_model", "truncated_onnx"]
        broken += ["config_is_a_folder", "version_is_a_file"]
        for name in broken:
            entry = index[name]
            assert entry["state"] == "UNAVAILABLE", (name, entry)
            # The reason names the model's own folder (its config, model file or version folder).
            if name in NAMED_BY_MODEL_ONLY:
                assert f"model '{name}'" in entry["reason"], (name, entry["reason"])
            else:
                assert str(hostile_repository / name) in entry["reason"], (name, entry["reason"])
            status, _, body = http.request("POST", f"/v2/models/{name}/infer".encode(), MLP_REQUEST)
            # A version that failed: Triton's 404; a model that failed before its versions: 503.
            assert status in (404, 503) and name in json.loads(body)["error"], (name, status, body)
        assert "outside" in index["escapes"]["reason"]
        for name in ACCEPTED_CONFIGS:
            assert index[name]["state"] == "READY", (name, index[name])
        assert http.request("GET", b"/v2/health/live")[0] == 200
        http.close()
    assert [r.getMessage() for r in crashes] == []


def test_an_escaping_model_filename_names_the_config_file(hostile_repository: Path) -> None:
    from reference_server.core.model_config import model_file, read_config
    from reference_server.errors import ModelConfigError

    folder = hostile_repository / "escaping_filename"
    config = read_config(folder)
    assert config is not None
    with pytest.raises(ModelConfigError, match=str(folder / "config.pbtxt")):
        model_file(folder, 1, config)


def test_a_non_integer_thread_count_names_the_config_file(tmp_path: Path) -> None:
    from reference_server.backends.onnxruntime import session_options
    from reference_server.core.model_config import parse_config_text
    from reference_server.errors import ModelConfigError

    path = tmp_path / "config.pbtxt"
    config = parse_config_text('parameters { key: "intra_op_thread_count" value: { string_value: "abc" } }', path)
    with pytest.raises(ModelConfigError, match="intra_op_thread_count"):
        session_options(config)


def test_a_huge_max_batch_size_is_bounded_by_the_element_limit(hostile_repository: Path) -> None:
    limited = _server(
        hostile_repository, model_control_mode="explicit", load_models=("huge_max_batch",), max_tensor_elements=1000
    )
    with running_server(limited) as server:
        assert server.http_port is not None
        http = RawHttp(server.http_port)
        header = json.dumps(
            {
                "inputs": [
                    {"name": "INPUT0", "datatype": "FP32", "shape": [2000, 1], "parameters": {"binary_data_size": 8000}}
                ]
            }
        ).encode()
        status, _, body = http.request(
            "POST",
            b"/v2/models/huge_max_batch/infer",
            header + bytes(8000),
            {"Inference-Header-Content-Length": str(len(header)).encode()},
        )
        assert status == 400 and "--max-tensor-elements" in json.loads(body)["error"], body
        http.close()


# --- generated configs ---------------------------------------------------------------------------------

DATA_TYPES = [*mc.DataType.keys(), "TYPE_NOPE"]
NUMBERS = st.sampled_from([-(2**31), -2, -1, 0, 1, 2, 4, 8, 16, 2**31 - 1])
DIMS = st.lists(st.sampled_from([-2, -1, 0, 1, 4, 16, 2**40, 2**63 - 1]), max_size=3)


def _tensor(draw: st.DrawFn, names: list[str]) -> str:
    parts = [
        f'name: "{draw(st.sampled_from(names))}"',
        f"data_type: {draw(st.sampled_from(DATA_TYPES))}",
        f"dims: {draw(DIMS)}",
    ]
    if draw(st.booleans()):
        parts.append(f"reshape {{ shape: {draw(DIMS)} }}")
    if draw(st.booleans()):
        parts.append(f"optional: {draw(st.sampled_from(['true', 'false']))}")
    return "{ " + " ".join(parts) + " }"


@st.composite
def config_texts(draw: st.DrawFn) -> bytes:
    lines = []
    optional = st.booleans()
    if draw(optional):
        lines.append(f'name: "{draw(st.sampled_from(["fuzzed", "other", ""]))}"')
    if draw(optional):
        lines.append(f'backend: "{draw(st.sampled_from(["onnxruntime", "python", "tensorrt", ""]))}"')
    if draw(optional):
        lines.append(f'platform: "{draw(st.sampled_from(["onnxruntime_onnx", "tensorflow_savedmodel", "x"]))}"')
    if draw(optional):
        lines.append(f"max_batch_size: {draw(NUMBERS)}")
    if draw(optional):
        tensors = [_tensor(draw, ["INPUT0", "X", ""]) for _ in range(draw(st.integers(0, 2)))]
        lines.append(f"input [ {', '.join(tensors)} ]")
    if draw(optional):
        tensors = [_tensor(draw, ["OUTPUT0", "Y"]) for _ in range(draw(st.integers(0, 2)))]
        lines.append(f"output [ {', '.join(tensors)} ]")
    if draw(optional):
        policy = (
            f"default_queue_policy {{ max_queue_size: {draw(NUMBERS)} "
            f"timeout_action: {draw(st.sampled_from(['REJECT', 'DELAY', '7']))} "
            f"default_timeout_microseconds: {draw(st.sampled_from([0, 1, 2**64 - 1]))} "
            f"allow_timeout_override: {draw(st.sampled_from(['true', 'false']))} }}"
        )
        lines.append(
            f"dynamic_batching {{ preferred_batch_size: {draw(st.lists(NUMBERS, max_size=3))} "
            f"max_queue_delay_microseconds: {draw(st.sampled_from([0, 100, 2**64 - 1]))} "
            f"preserve_ordering: {draw(st.sampled_from(['true', 'false']))} {policy if draw(optional) else ''} }}"
        )
    if draw(optional):
        groups = [
            f"{{ count: {draw(st.sampled_from([-3, 0, 1, 2]))} "
            f"kind: {draw(st.sampled_from(['KIND_CPU', 'KIND_GPU', 'KIND_AUTO', 'KIND_MODEL']))} "
            f"gpus: {draw(st.lists(st.sampled_from([-1, 0, 7]), max_size=2))} }}"
            for _ in range(draw(st.integers(0, 2)))
        ]
        lines.append(f"instance_group [ {', '.join(groups)} ]")
    if draw(optional):
        lines.append(
            draw(
                st.sampled_from(
                    [
                        "version_policy { all { } }",
                        f"version_policy {{ latest {{ num_versions: {draw(NUMBERS)} }} }}",
                        f"version_policy {{ specific {{ versions: {draw(st.lists(NUMBERS, max_size=3))} }} }}",
                    ]
                )
            )
        )
    if draw(optional):
        filename = draw(st.sampled_from(["model.onnx", "../../outside/1/model.onnx", "/etc/passwd", "", "nope.onnx"]))
        lines.append(f'default_model_filename: "{filename}"')
    if draw(optional):
        # Integers only: see test_a_non_integer_thread_count_names_the_config_file.
        value = draw(st.sampled_from(["0", "1", "-1", "2"]))
        key = draw(st.sampled_from(["intra_op_thread_count", "inter_op_thread_count", "x"]))
        lines.append(f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}')
    text = "\n".join(lines).encode()
    corruption = draw(st.sampled_from(["none", "none", "truncate", "delete", "insert"]))
    if corruption != "none" and text:
        at = draw(st.integers(0, len(text) - 1))
        if corruption == "truncate":
            text = text[:at]
        elif corruption == "delete":
            text = text[:at] + text[at + 1 :]
        else:
            text = (
                text[:at]
                + draw(st.sampled_from([b"{", b"}", b"[", b"]", b":", b'"', b"\\", b"\xff", b"\x00"]))
                + text[at:]
            )
    return text


@pytest.fixture(scope="module")
def control_server(demo_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReferenceServer]:
    root = tmp_path_factory.mktemp("configs")
    repository = root / "models"
    shutil.copytree(demo_repository, repository)
    shutil.copytree(demo_repository / "identity", root / "outside")
    _identity_with(repository, "fuzzed", None)
    with running_server(_server(repository, model_control_mode="explicit", load_models=("mlp",))) as server:
        yield server


@fuzz_settings(120)
@given(text=config_texts())
def test_a_generated_config_loads_or_is_refused_naming_its_file(control_server: ReferenceServer, text: bytes) -> None:
    folder = control_server.config.model_repository / "fuzzed"
    (folder / "config.pbtxt").write_bytes(text)
    assert control_server.http_port is not None
    http = RawHttp(control_server.http_port)
    with crashes_logged() as crashes:
        status, _, body = http.request("POST", b"/v2/repository/models/fuzzed/load", b"")
    event(f"load: HTTP {status}")
    if status != 200:
        assert status in (400, 404, 503), (status, body)
        reason = json.loads(body)["error"]
        # See NAMED_BY_MODEL_ONLY: an escaping default_model_filename names the model alone.
        assert str(folder) in reason or "default_model_filename" in reason, reason
    assert [r.getMessage() for r in crashes] == []
    status, _, body = http.request("POST", b"/v2/models/mlp/infer", MLP_REQUEST)
    assert status == 200, body
    http.close()


def test_the_control_server_is_still_whole(control_server: ReferenceServer) -> None:
    assert control_server.http_port is not None
    http = RawHttp(control_server.http_port)
    assert http.request("GET", b"/v2/health/live")[0] == 200
    assert _index(http)["mlp"]["state"] == "READY"
    assert os.path.isdir(control_server.config.model_repository)
    http.close()
