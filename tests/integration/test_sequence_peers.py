"""Sequences against the real peers: the same python-backend accumulator folders served by real
tritonserver 2.51 and by the reference server answer the same request sequences alike (totals, the
control values the model saw, and the errors for hostile sequences), and NVIDIA's perf_analyzer drives
the sequence model with `--sequence-length` over HTTP and over a gRPC stream."""

from __future__ import annotations

import csv
import json
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from perfkit.cli import main
from perfkit.results.model import LevelResult, read_sweep
from reference_server.server import running_server
from tests.integration.test_sequence_sweep import STREAMS
from tests.integration.test_sweep_vs_perf_analyzer import BUSY_MACHINE_SHARE, OtherLoad
from tests.sequence_models import CORRELATION, ENSEMBLE_CONFIG, write_accumulator
from tests.servers import loopback_config, running_triton

pytestmark = [pytest.mark.integration, pytest.mark.peers]

Urls = dict[str, tuple[str, str]]  # server -> (http, grpc)
SLOW_MS = 4.0  # the service time of accumulator_slow: the server, not a client, sets the pace

#: A sequence model without control inputs: what its python model reads of each request.
CORRELATION_CONFIG = """\
name: "correlation"
backend: "python"
max_batch_size: 4
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "SEEN" data_type: TYPE_STRING dims: [ 1 ] } ]
sequence_batching { }
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


@pytest.fixture(scope="module")
def urls(peers: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Urls]:
    repository = tmp_path_factory.mktemp("sequence_peers") / "models"
    write_accumulator(repository, "accumulator")
    write_accumulator(repository, "accumulator_slow", delay_ms=SLOW_MS)
    folder = repository / "correlation"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(CORRELATION)
    (folder / "config.pbtxt").write_text(CORRELATION_CONFIG)
    plain = repository / "correlation_plain"
    (plain / "1").mkdir(parents=True)
    (plain / "1" / "model.py").write_text(CORRELATION)
    plain_config = CORRELATION_CONFIG.replace('"correlation"', '"correlation_plain"')
    (plain / "config.pbtxt").write_text(plain_config.replace("sequence_batching { }", "dynamic_batching { }"))
    (repository / "sequence_ensemble" / "1").mkdir(parents=True)
    (repository / "sequence_ensemble" / "config.pbtxt").write_text(ENSEMBLE_CONFIG)
    with (
        running_triton(peers, repository, auto_complete=False) as triton,
        running_server(loopback_config(repository)) as ours,
    ):
        yield {
            "triton": (triton.http_url.removeprefix("http://"), triton.grpc_url),
            "ours": (f"127.0.0.1:{ours.http_port}", f"127.0.0.1:{ours.grpc_port}"),
        }


def _session(url: str, transport: str, model: str, steps: list[tuple[Any, int, bool, bool]]) -> list[Any]:
    """Each step (sequence id, value, start, end) in order; its (total, controls) or its error."""
    module: Any = httpclient if transport == "http" else grpcclient
    client = module.InferenceServerClient(url)
    answers: list[Any] = []
    try:
        for sequence_id, value, start, end in steps:
            tensor = module.InferInput("INPUT", [1, 1], "INT32")
            tensor.set_data_from_numpy(np.array([[value]], dtype=np.int32))
            try:
                result = client.infer(model, [tensor], sequence_id=sequence_id, sequence_start=start, sequence_end=end)
            except InferenceServerException as exc:
                answers.append(("error", exc.status(), exc.message()))
            else:
                answers.append((int(result.as_numpy("OUTPUT")[0, 0]), result.as_numpy("CONTROLS")[0].tolist()))
    finally:
        client.close()
    return answers


HOSTILE = [
    (5, 1, False, False),  # never started
    (6, 2, False, True),  # END without START
    (7, 3, True, False),
    (8, 10, True, False),
    (7, 4, False, False),  # interleaved with another sequence
    (8, 20, False, True),
    (7, 5, True, False),  # START on a live sequence: restarted
    (7, 6, False, True),
    (7, 1, False, False),  # after its END
    (8, 1, False, False),
    (2**62 + 3, 9, True, True),
]


@pytest.mark.parametrize(
    ("transport", "model"), [("http", "accumulator"), ("grpc", "accumulator"), ("grpc", "sequence_ensemble")]
)
def test_same_sequences_same_answers_as_triton(urls: Urls, transport: str, model: str) -> None:
    index = 0 if transport == "http" else 1
    answers = {server: _session(pair[index], transport, model, HOSTILE) for server, pair in urls.items()}
    assert answers["ours"] == answers["triton"]
    # and the answers are the ones expected, not just alike
    totals = [a[0] for a in answers["ours"]]
    assert totals == ["error", "error", 3, 10, 7, 30, 5, 11, "error", "error", 9]
    assert answers["ours"][2][1] == [1, 0, 1] and answers["ours"][5][1] == [0, 1, 1]


@pytest.mark.parametrize("flags", [[], ["-i", "grpc", "--streaming"]], ids=["http", "grpc-streaming"])
def test_perf_analyzer_sequence_length(peers: Path, urls: Urls, flags: list[str], tmp_path: Path) -> None:
    url = urls["ours"][1 if flags else 0]
    out = tmp_path / "pa.csv"
    result = subprocess.run(
        [str(peers / "bin" / "perf_analyzer"), *flags, "-m", "accumulator", "-u", url, "--sequence-length", "5", "--input-data", "zero",
         "--concurrency-range", "4", "-p", "200", "-s", "1000", "-r", "6", "-f", str(out)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Inference count" in result.stdout
    stats = httpclient.InferenceServerClient(urls["ours"][0]).get_inference_statistics("accumulator")
    model = stats["model_stats"][0]
    assert int(model["inference_stats"]["success"]["count"]) > 0
    assert "fail" not in model["inference_stats"] or int(model["inference_stats"]["fail"]["count"]) == 0


@pytest.mark.parametrize("model", ["correlation", "correlation_plain"])
def test_a_python_model_reads_the_same_correlation_id_and_flags(urls: Urls, model: str) -> None:
    # correlation_plain has no sequence batcher: Triton still hands the model the request's id and flags.
    def seen(url: str, sequence_id: int | str, start: bool, end: bool) -> Any:
        client = grpcclient.InferenceServerClient(url)
        tensor = grpcclient.InferInput("INPUT", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[1]], dtype=np.int32))
        try:
            result = client.infer(
                model, [tensor], sequence_id=sequence_id, sequence_start=start, sequence_end=end,
                parameters={"custom": "x"},
            )  # fmt: skip
        finally:
            client.close()
        return result.as_numpy("SEEN")[0, 0]

    steps = [("s-1", True, False), ("s-1", False, False), ("s-1", False, True), (2**62, True, True)]
    answers = {server: [seen(pair[1], *step) for step in steps] for server, pair in urls.items()}
    assert answers["ours"] == answers["triton"], answers


def test_metadata_and_config_leave_the_controls_out_alike(urls: Urls) -> None:
    seen = {}
    for server, (http_url, _) in urls.items():
        client = httpclient.InferenceServerClient(http_url)
        metadata, config = client.get_model_metadata("accumulator"), client.get_model_config("accumulator")
        extensions = client.get_server_metadata()["extensions"]
        client.close()
        seen[server] = (
            [(t["name"], t["datatype"], t["shape"]) for t in metadata["inputs"] + metadata["outputs"]],
            [t["name"] for t in config["input"]],
            config["sequence_batching"]["max_sequence_idle_microseconds"],
            [c["name"] for c in config["sequence_batching"]["control_input"]],
            "sequence" in extensions,
        )
    assert seen["ours"] == seen["triton"]
    assert seen["ours"][1] == ["INPUT"] and seen["ours"][4]


@pytest.mark.parametrize(
    "parameters",
    [
        {"sequence_id": -1, "sequence_start": True},
        {"sequence_id": 1.5, "sequence_start": True},
        {"sequence_id": 9, "sequence_start": "yes"},
        {"sequence_id": "x" * 129, "sequence_start": True},
    ],
    ids=["negative", "float", "start-not-bool", "id-too-long"],
)
def test_bad_sequence_parameters_over_http_alike(urls: Urls, parameters: dict[str, Any]) -> None:
    body = json.dumps({
        "inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [1, 1], "data": [1]}],
        "parameters": parameters,
    }).encode()  # fmt: skip
    answers = {}
    for server, (http_url, _) in urls.items():
        request = urllib.request.Request(f"http://{http_url}/v2/models/accumulator/infer", data=body, method="POST")
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(request, timeout=30)
        answers[server] = (info.value.code, json.loads(info.value.read())["error"])
    # Triton's words first; its status is 500 (INTERNAL) for a parameter it cannot parse, where ours
    # is 400, as for any request the client got wrong.
    assert answers["ours"][1].split(":")[0] == answers["triton"][1].split(":")[0], answers
    triton_status = answers["triton"][0]
    assert answers["ours"][0] == (400 if triton_status == 500 else triton_status), answers


def _pa_figures(csv_path: Path) -> tuple[float, float]:
    """(throughput, p50 µs) of perf_analyzer's one level."""
    with csv_path.open() as f:
        row = next(csv.DictReader(f))
    return float(row["Inferences/Second"]), float(row["p50 latency"])


def _sequence_pair(peers: Path, url: str, tmp_path: Path) -> tuple[tuple[float, float], LevelResult | None, str]:
    """perf_analyzer, then perfkit, with the same flags: (throughput, p50) ratios perfkit/perf_analyzer,
    perfkit's level, and why there is no comparison ("" when there is one)."""
    common = ["-m", "accumulator_slow", "-u", url, "--sequence-length", "10", "--concurrency-range", "2",
              "-p", "600", "-s", "25", "-r", "8"]  # fmt: skip
    tmp_path.mkdir()
    pa_csv = tmp_path / "pa.csv"
    pa = subprocess.run([str(peers / "bin" / "perf_analyzer"), *common, "-f", str(pa_csv)],
                        capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    if pa.returncode == 2:
        return (0.0, 0.0), None, "perf_analyzer found no stable measurement"
    assert pa.returncode == 0, pa.stdout + pa.stderr
    out = tmp_path / "perfkit"
    assert main(["sweep", *common, "--quiet", "--no-report", "--report-dir", str(out)]) in (0, 3)
    level = read_sweep(next(out.glob("sweep-*.json"))).levels[0]
    pa_throughput, pa_p50_us = _pa_figures(pa_csv)
    return (level.throughput_infer_per_s / pa_throughput, level.latency.p50_us / pa_p50_us), level, ""


def test_sequence_sweep_agrees_with_perf_analyzer(peers: Path, urls: Urls, tmp_path: Path) -> None:
    # Both tools in turn on the same tritonserver model, with the same sequence and window flags.
    # The model sleeps SLOW_MS per execution, so its pace, not a client's CPU, sets the figures:
    # throughput and p50 agree within 10 %. As in test_sweep_vs_perf_analyzer, a pair that disagrees
    # twice while other processes took more than BUSY_MACHINE_SHARE of the CPUs is skipped.
    for attempt in (1, 2):
        with OtherLoad() as other:
            ratios, level, missing = _sequence_pair(peers, urls["triton"][0], tmp_path / str(attempt))
        print(f"perfkit/perf_analyzer: throughput {ratios[0]:.3f}, p50 {ratios[1]:.3f}; other load {other.share:.0%}")
        if not missing and all(0.9 <= r <= 1.1 for r in ratios):
            break
    else:
        if other.share > BUSY_MACHINE_SHARE:
            pytest.skip(f"{missing or ratios} while other processes took {other.share:.0%} of the CPUs")
    assert not missing and 0.9 <= ratios[0] <= 1.1 and 0.9 <= ratios[1] <= 1.1, (ratios, missing)
    assert level is not None and level.error_count == 0 and level.sequence_latency is not None
    # Sequences of 10 ± 20 %: about 10 requests each, one at a time, so about 10 latencies long.
    assert 8 <= level.ok_count / level.sequence_count <= 12
    assert 7 * level.latency.mean_us <= level.sequence_latency.mean_us <= 14 * level.latency.mean_us


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_sweep_sequences_are_answered_as_expected_by_triton(urls: Urls, tmp_path: Path, protocol: str) -> None:
    # perfkit writes each request's id and flags into a request encoded once (padded JSON number,
    # fixed-width varint): real Triton must read them as tritonclient's, which validation_data checks.
    data = tmp_path / "streams.json"
    data.write_text(json.dumps(STREAMS))
    url = urls["triton"][0 if protocol == "http" else 1]
    code = main(["sweep", "-m", "accumulator", "-u", url, "-i", protocol, "--concurrency-range", "2",
                 "--input-data", str(data), "--request-count", "60", "--start-sequence-id", str(2**40),
                 "--quiet", "--no-report", "--report-dir", str(tmp_path)])  # fmt: skip
    level = read_sweep(next(tmp_path.glob("sweep-*.json"))).levels[0]
    # Every answer as validation_data says (a wrong one is an error, exit 4); 60 requests are too
    # few to be a valid measurement, which ends the sweep 3 and is not what this test is about.
    assert (code, level.request_count, level.errors) == (3, 60, {})
    assert _failed_checks(level) <= {"sample_count", "duration"}
    assert level.sequence_count >= 20


def test_request_parameters_reach_the_model_on_both_servers(urls: Urls, tmp_path: Path) -> None:
    # correlation_plain answers what its python model read of each request: id, flags, parameters
    # (one parameter: Triton hands a request's parameters over in no fixed order).
    seen = json.dumps([0, 0, {"custom": "x y"}])
    data = tmp_path / "data.json"
    data.write_text(json.dumps({"data": [{"INPUT": [1]}], "validation_data": [{"SEEN": [seen]}]}))
    for server, (_, grpc_url) in urls.items():
        out = tmp_path / server
        code = main(["sweep", "-m", "correlation_plain", "-u", grpc_url, "-i", "grpc", "--input-data", str(data),
                     "--request-parameter", "custom:x y:string",
                     "--request-count", "20", "--quiet", "--no-report", "--report-dir", str(out)])  # fmt: skip
        level = read_sweep(next(out.glob("sweep-*.json"))).levels[0]
        # Answered as validation_data says; too few requests to be valid (exit 3), as above.
        assert (code, level.request_count, level.errors) == (3, 20, {}), server
        assert _failed_checks(level) <= {"sample_count", "duration"}, server


def _failed_checks(level: LevelResult) -> set[str]:
    return {check.name for check in level.checks if not check.passed}
