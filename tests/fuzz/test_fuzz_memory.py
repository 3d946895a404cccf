"""Malformed traffic does not make the server grow: the same corpus of bad requests, sent round after
round to a server in its own process, leaves its resident memory flat after the first round."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import psutil
import pytest
from tritonclient.grpc import service_pb2 as pb

from perfkit.target import ServerProcess, reference_server_process
from tests.fuzz.wire import RawHttp

pytestmark = [pytest.mark.integration, pytest.mark.fuzz]

ROUNDS = 10
#: Growth allowed between the end of the first round and the end of the last. Anything that kept
#: each bad request (a buffer, a traceback, a task) would add far more over ~3,400 requests.
MAX_GROWTH_MB = 8.0


def _http_corpus(rng: np.random.Generator) -> list[tuple[bytes, bytes, dict[str, bytes]]]:
    good = json.dumps(
        {
            "inputs": [
                {"name": "INPUT0", "datatype": "FP32", "shape": [1, 256], "parameters": {"binary_data_size": 1024}}
            ]
        }
    ).encode()
    body = good + rng.random(256, dtype=np.float32).tobytes()
    header = {"Inference-Header-Content-Length": str(len(good)).encode()}
    corpus = []
    for cut in range(0, len(body), 23):  # truncated everywhere, header lies included
        corpus.append((b"/v2/models/mlp/infer", body[:cut], header))
    for lie in (b"-1", b"99999999", b"abc", b"0", str(len(body) + 1).encode()):
        corpus.append((b"/v2/models/mlp/infer", body, {"Inference-Header-Content-Length": lie}))
    for _ in range(120):
        corpus.append((b"/v2/models/mlp/infer", rng.bytes(int(rng.integers(0, 4096))), {}))
    for shape in ([1, 2**62], [-1, 256], [2**31, 2**31], [65, 256], [1, 255]):
        doc = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": shape, "data": [0.5] * 256}]}
        corpus.append((b"/v2/models/mlp/infer", json.dumps(doc).encode(), {}))
    for trick in (b"%2e%2e", b"..%2fmodels", b"a" * 2000, b"%ff%fe", b"%2fetc%2fpasswd"):
        corpus.append((b"/v2/models/" + trick + b"/infer", body, header))
    return corpus


def _grpc_corpus(rng: np.random.Generator) -> list[bytes]:
    good = pb.ModelInferRequest(model_name="mlp")
    good.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 256])
    good.raw_input_contents.append(bytes(1024))
    raw = good.SerializeToString()
    corpus = [raw[:cut] for cut in range(0, len(raw), 37)]
    corpus += [rng.bytes(int(rng.integers(0, 4096))) for _ in range(120)]
    for shape in ([1, 2**62], [-1, 256], [1, 255]):
        bad = pb.ModelInferRequest()
        bad.CopyFrom(good)
        del bad.inputs[0].shape[:]
        bad.inputs[0].shape.extend(shape)
        corpus.append(bad.SerializeToString())
    return corpus


@pytest.fixture(scope="module")
def server(demo_repository: Path) -> Iterator[ServerProcess]:
    with reference_server_process(demo_repository) as running:
        yield running


def test_bad_requests_leave_server_memory_flat(server: ServerProcess) -> None:
    rng = np.random.default_rng(5)
    http_corpus, grpc_corpus = _http_corpus(rng), _grpc_corpus(rng)
    process = psutil.Process(server.process.pid)
    http = RawHttp(server.ports["HTTPService"])
    rss_mb = []
    with grpc.insecure_channel(server.grpc_url) as channel:
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        for _ in range(ROUNDS):
            for path, body, headers in http_corpus:
                status, _, _ = http.request("POST", path, body, headers)
                assert status < 500
            for payload in grpc_corpus:
                with pytest.raises(grpc.RpcError) as caught:
                    infer(payload, timeout=30)
                assert caught.value.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND)
            rss_mb.append(process.memory_info().rss / 2**20)
    http.close()
    print("server RSS per round (MiB):", [round(m, 1) for m in rss_mb])
    assert rss_mb[-1] - rss_mb[0] < MAX_GROWTH_MB, [round(m, 1) for m in rss_mb]
