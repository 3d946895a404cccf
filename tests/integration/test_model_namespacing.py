"""--model-namespacing true with two repositories that hold models of the same name: both load, a
request naming the name alone gets Triton's ambiguity error (HTTP 400, gRPC INVALID_ARGUMENT), an
ensemble's step takes its own repository's model, the index lists each copy, per-model metrics
carry a `namespace` label, load/unload by name act on every copy, and poll mode follows a name that
gains and loses a second repository; the same as tritonserver 2.51 (the peers tests)."""

from __future__ import annotations

import os
import shutil
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from reference_server.config import config_from_args
from reference_server.server import running_server
from tests.integration.test_model_repositories import _model
from tests.servers import running_triton

pytestmark = pytest.mark.integration

ENSEMBLE = """\
name: "{name}"
platform: "ensemble"
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] }} ]
ensemble_scheduling {{ step [ {{
  model_name: "{step}" model_version: -1
  input_map {{ key: "INPUT0" value: "INPUT0" }} output_map {{ key: "OUTPUT0" value: "OUTPUT0" }}
}} ] }}
"""

AMBIGUOUS = (
    "There are 2 identifiers of model 'twice' in global map, model namespace must be provided to resolve ambiguity."
)


def _ensemble(root: Path, name: str, step: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(ENSEMBLE.format(name=name, step=step))


@pytest.fixture(scope="module")
def repositories(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    first, second = tmp_path_factory.mktemp("first"), tmp_path_factory.mktemp("second")
    _model(first, "twice", 5.0)  # in both repositories
    _model(second, "twice", 7.0)
    _model(first, "solo", 2.0)
    _ensemble(first, "ens", "twice")  # its own repository's 'twice': 5
    _ensemble(second, "ensc", "twice")  # its own repository's 'twice': 7
    _ensemble(second, "ensb", "solo")  # the only 'solo', in the other repository
    return first, second


@contextmanager
def _ours(args: list[str]) -> Iterator[tuple[str, str, str]]:
    config = config_from_args([*args, "--http-port=0", "--grpc-port=0", "--metrics-port=0"])
    with running_server(config) as server:
        yield f"127.0.0.1:{server.http_port}", f"127.0.0.1:{server.grpc_port}", f"127.0.0.1:{server.metrics_port}"


@contextmanager
def _triton(args: list[str], first: Path) -> Iterator[tuple[str, str, str]]:
    peers = os.environ.get("PERFKIT_PEERS")
    if not peers:
        pytest.skip("PERFKIT_PEERS is not set: no tritonserver 2.51 to compare with")
    with running_triton(Path(peers), first, extra_args=args, auto_complete=False) as triton:
        yield triton.http_url, triton.grpc_url, f"127.0.0.1:{triton.metrics_port}"


def _args(first: Path, second: Path, *more: str) -> list[str]:
    return ["--model-repository", str(first), "--model-repository", str(second), "--model-namespacing=true", *more]


def _error(exc: InferenceServerException) -> tuple[str, str]:
    return str(exc.status()), exc.message() or ""


class _Clients:
    def __init__(self, urls: tuple[str, str, str]) -> None:
        self.http = httpclient.InferenceServerClient(urls[0])
        self.grpc = grpcclient.InferenceServerClient(urls[1])
        self.metrics_url = f"http://{urls[2]}/metrics"

    def close(self) -> None:
        self.http.close()
        self.grpc.close()

    def infer(self, name: str) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for kind, module, client in (("http", httpclient, self.http), ("grpc", grpcclient, self.grpc)):
            tensor = module.InferInput("INPUT0", [1], "FP32")
            tensor.set_data_from_numpy(np.ones((1,), np.float32))
            try:
                seen[kind] = client.infer(name, [tensor]).as_numpy("OUTPUT0").tolist()
            except InferenceServerException as exc:
                seen[kind] = _error(exc)
        return seen

    def index(self) -> list[tuple[str, str]]:
        """(name, state) of each entry, in the server's order (Triton's: by repository, then name)."""
        return [(m["name"], m.get("state", "")) for m in self.http.get_model_repository_index()]

    def attempt(self, call: Any) -> Any:
        try:
            return call()
        except InferenceServerException as exc:
            return _error(exc)

    def success_counts(self) -> list[str]:
        text = urllib.request.urlopen(self.metrics_url, timeout=10).read().decode()
        return sorted(line for line in text.splitlines() if line.startswith("nv_inference_request_success{"))


def _observe_all_loaded(urls: tuple[str, str, str]) -> dict[str, Any]:
    clients = _Clients(urls)
    try:
        seen: dict[str, Any] = {name: clients.infer(name) for name in ("twice", "solo", "ens", "ensb", "ensc")}
        seen["index"] = clients.index()
        seen["ready"] = (clients.http.is_model_ready("twice"), clients.grpc.is_model_ready("twice"))
        seen["metadata"] = (
            clients.attempt(lambda: clients.http.get_model_metadata("twice")),
            clients.attempt(lambda: clients.grpc.get_model_metadata("twice")),
        )
        seen["config"] = clients.attempt(lambda: clients.http.get_model_config("twice"))
        seen["statistics"] = (
            clients.attempt(lambda: clients.http.get_inference_statistics("twice")),
            clients.attempt(lambda: clients.grpc.get_inference_statistics("twice")),
        )
        seen["solo statistics"] = clients.http.get_inference_statistics("solo")["model_stats"][0]["name"]
        seen["metrics"] = clients.success_counts()
        return seen
    finally:
        clients.close()


def _all_loaded_expected(first: Path, second: Path) -> dict[str, Any]:
    ambiguous = {"http": ("400", AMBIGUOUS), "grpc": ("StatusCode.INVALID_ARGUMENT", AMBIGUOUS)}
    not_available = "requested model 'twice' is not available"

    def success(model: str, root: Path, count: int) -> str:
        return f'nv_inference_request_success{{model="{model}",namespace="{root}",version="1"}} {count}'

    return {
        "twice": ambiguous,
        "solo": {"http": [2.0], "grpc": [2.0]},
        "ens": {"http": [5.0], "grpc": [5.0]},
        "ensb": {"http": [2.0], "grpc": [2.0]},
        "ensc": {"http": [7.0], "grpc": [7.0]},
        "index": [
            ("ens", "READY"),
            ("solo", "READY"),
            ("twice", "READY"),
            ("ensb", "READY"),
            ("ensc", "READY"),
            ("twice", "READY"),
        ],  # fmt: skip
        "ready": (False, False),
        "metadata": (("400", AMBIGUOUS), ("StatusCode.INVALID_ARGUMENT", AMBIGUOUS)),
        "config": ("400", AMBIGUOUS),
        "statistics": (("400", not_available), ("StatusCode.INVALID_ARGUMENT", not_available)),
        "solo statistics": "solo",
        "metrics": sorted(
            [
                success("ens", first, 2),
                success("solo", first, 4),
                success("twice", first, 2),
                success("ensb", second, 2),
                success("ensc", second, 2),
                success("twice", second, 2),
            ]
        ),  # fmt: skip
    }


def _observe_model_control(urls: tuple[str, str, str]) -> dict[str, Any]:
    clients = _Clients(urls)
    try:
        seen: dict[str, Any] = {"before": clients.infer("twice"), "index before": clients.index()}
        clients.http.load_model("twice")  # every repository's 'twice'
        seen["loaded"] = clients.infer("twice")
        seen["index loaded"] = clients.index()
        clients.http.load_model("ens")
        seen["ens"] = clients.infer("ens")
        clients.http.unload_model("twice")  # every repository's 'twice'
        seen["unloaded"] = clients.infer("twice")
        return seen
    finally:
        clients.close()


def _model_control_expected() -> dict[str, Any]:
    unknown = "Request for unknown model: 'twice' is not found"
    gone = "Identifier of model 'twice' is not found in global map"
    return {
        "before": {"http": ("400", unknown), "grpc": ("StatusCode.INVALID_ARGUMENT", unknown)},
        "index before": [("ens", ""), ("solo", "READY"), ("twice", ""), ("ensb", ""), ("ensc", ""), ("twice", "")],
        "loaded": {"http": ("400", AMBIGUOUS), "grpc": ("StatusCode.INVALID_ARGUMENT", AMBIGUOUS)},
        "index loaded": [
            ("ens", ""),
            ("solo", "READY"),
            ("twice", "READY"),
            ("ensb", ""),
            ("ensc", ""),
            ("twice", "READY"),
        ],
        "ens": {"http": [5.0], "grpc": [5.0]},
        "unloaded": {"http": ("404", gone), "grpc": ("StatusCode.NOT_FOUND", gone)},
    }


def _run(server: AbstractContextManager[tuple[str, str, str]], observe: Any) -> Any:
    with server as urls:
        return observe(urls)


def test_models_of_one_name_in_two_repositories_all_load(repositories: tuple[Path, Path]) -> None:
    first, second = repositories
    seen = _run(_ours(_args(first, second)), _observe_all_loaded)
    assert seen == _all_loaded_expected(first, second)


def test_load_and_unload_by_name_act_on_every_repository(repositories: tuple[Path, Path]) -> None:
    first, second = repositories
    args = _args(first, second, "--model-control-mode=explicit", "--load-model=solo")
    assert _run(_ours(args), _observe_model_control) == _model_control_expected()


@pytest.mark.peers
def test_models_of_one_name_as_tritonserver_loads_them(repositories: tuple[Path, Path]) -> None:
    first, second = repositories
    seen = _run(_triton(_args(first, second)[2:], first), _observe_all_loaded)
    assert seen == _all_loaded_expected(first, second)


@pytest.mark.peers
def test_load_and_unload_by_name_as_tritonserver_does(repositories: tuple[Path, Path]) -> None:
    first, second = repositories
    args = _args(first, second, "--model-control-mode=explicit", "--load-model=solo")[2:]
    assert _run(_triton(args, first), _observe_model_control) == _model_control_expected()


def _wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.05)


def _observe_polling(urls: tuple[str, str, str], first: Path, second: Path) -> dict[str, Any]:
    """Poll mode: a second 'twice' appears in the other repository, then goes away."""
    clients = _Clients(urls)
    try:
        steps = clients.http.get_model_config("ens")["ensemble_scheduling"]["step"]
        seen: dict[str, Any] = {"ens step": [(s["model_name"], s.get("model_namespace")) for s in steps]}
        staging = second.parent / f"{second.name}-staging"
        _model(staging, "twice", 7.0)
        (staging / "twice").rename(second / "twice")
        _wait_for(lambda: clients.index().count(("twice", "READY")) == 2, "the second 'twice' to load")
        seen["added"] = (clients.attempt(lambda: clients.http.get_model_metadata("twice")), clients.infer("ens"))
        shutil.rmtree(second / "twice")
        # Triton's index drops the copy a moment before its name resolves again: wait for both.
        _wait_for(
            lambda: (
                clients.index().count(("twice", "READY")) == 1
                and isinstance(clients.attempt(lambda: clients.http.get_model_metadata("twice")), dict)
            ),
            "the second 'twice' to unload",
        )
        seen["removed"] = (clients.http.get_model_metadata("twice")["name"], clients.infer("ens"), clients.index())
        return seen
    finally:
        clients.close()


def _polling_expected(first: Path) -> dict[str, Any]:
    return {
        "ens step": [("twice", str(first))],
        "added": (("400", AMBIGUOUS), {"http": [5.0], "grpc": [5.0]}),
        "removed": (
            "twice",
            {"http": [5.0], "grpc": [5.0]},
            [("ens", "READY"), ("solo", "READY"), ("twice", "READY"), ("ensb", "READY")],
        ),
    }


@pytest.fixture
def polled(tmp_path: Path) -> tuple[Path, Path]:
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    _model(first, "twice", 5.0)
    _model(first, "solo", 2.0)
    _ensemble(first, "ens", "twice")
    _ensemble(second, "ensb", "solo")
    return first, second


def test_poll_mode_follows_a_name_that_gains_and_loses_a_repository(polled: tuple[Path, Path]) -> None:
    first, second = polled
    config = config_from_args(
        [*_args(first, second, "--model-control-mode=poll"), "--http-port=0", "--grpc-port=0", "--metrics-port=0"]
    )
    with running_server(replace(config, repository_poll_secs=0.2)) as server:
        urls = (f"127.0.0.1:{server.http_port}", f"127.0.0.1:{server.grpc_port}", f"127.0.0.1:{server.metrics_port}")
        assert _observe_polling(urls, first, second) == _polling_expected(first)


@pytest.mark.peers
def test_poll_mode_as_tritonserver_follows_it(polled: tuple[Path, Path]) -> None:
    first, second = polled
    args = _args(first, second, "--model-control-mode=poll", "--repository-poll-secs=1")[2:]
    with _triton(args, first) as urls:
        assert _observe_polling(urls, first, second) == _polling_expected(first)
