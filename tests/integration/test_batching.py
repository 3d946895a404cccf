"""The dynamic batcher behaves as Triton documents, observed from outside through the statistics."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from reference_server.server import running_server
from tests.servers import loopback_config, write_identity_model

pytestmark = pytest.mark.integration


def infer_concurrently(url: str, model: str, count: int) -> tuple[float, list[np.ndarray]]:
    """`count` simultaneous single-row requests; each carries its own index so splits can be checked."""

    def one(i: int) -> np.ndarray:
        client = httpclient.InferenceServerClient(url)
        x = np.full((1, 4), float(i), dtype=np.float32)
        inp = httpclient.InferInput("INPUT0", [1, 4], "FP32")
        inp.set_data_from_numpy(x)
        return client.infer(model, [inp]).as_numpy("OUTPUT0")

    start = time.perf_counter()
    with ThreadPoolExecutor(count) as pool:
        results = list(pool.map(one, range(count)))
    return time.perf_counter() - start, results


def batch_sizes(url: str, model: str) -> dict[int, int]:
    stats = httpclient.InferenceServerClient(url).get_inference_statistics(model)["model_stats"][0]
    return {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}


def test_preferred_batch_and_queue_delay(repository_copy: Path) -> None:
    # A long delay: a preferred-size batch must run at once, a smaller one only when the delay expires.
    write_identity_model(
        repository_copy,
        "delayed",
        "dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 1500000 }",
    )
    config = loopback_config(repository_copy, load=("delayed",))
    with running_server(config) as server:
        url = server.http_url
        elapsed_full, results = infer_concurrently(url, "delayed", 4)
        for i, out in enumerate(results):
            np.testing.assert_array_equal(out, np.full((1, 4), float(i), dtype=np.float32))
        assert batch_sizes(url, "delayed") == {4: 1}
        elapsed_partial, _ = infer_concurrently(url, "delayed", 2)
        assert batch_sizes(url, "delayed") == {4: 1, 2: 1}
        # Wide margins: the partial batch waited for the 1.5 s delay, the preferred one did not.
        assert elapsed_partial >= 1.2
        assert elapsed_full < elapsed_partial


def test_no_dynamic_batching_runs_one_request_at_a_time(repository_copy: Path) -> None:
    write_identity_model(repository_copy, "unbatched", "")
    config = loopback_config(repository_copy, load=("unbatched",))
    with running_server(config) as server:
        _, results = infer_concurrently(server.http_url, "unbatched", 6)
        assert len(results) == 6
        assert batch_sizes(server.http_url, "unbatched") == {1: 6}
