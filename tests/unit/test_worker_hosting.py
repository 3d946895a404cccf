"""Which models the front-end workers run themselves, each worker's share of the instances, and the
statistics a worker publishes for the core to sum (`workers/hosting.py`, `scheduling/stats.py`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from reference_server.config import ServerConfig
from reference_server.core.tracing import Tracing
from reference_server.scheduling.stats import ModelStats, counters_length
from reference_server.workers.hosting import WorkerHosting, share, why_not_hosted
from reference_server.workers.local_models import names_shared_memory
from v2kit import codec as v2

PLAIN = 'name: "m" backend: "onnxruntime" max_batch_size: 8 instance_group [ { count: 4 kind: KIND_CPU } ]'


@dataclass
class _Version:
    config: mc.ModelConfig
    decoupled: bool = False


def _version(extra: str = "", base: str = PLAIN) -> _Version:
    return _Version(text_format.Parse(f"{base} {extra}", mc.ModelConfig()))


@pytest.mark.parametrize(("count", "workers"), [(4, 2), (5, 2), (7, 3), (8, 8), (9, 4)])
def test_the_shares_add_up_to_the_count_and_differ_by_one_at_most(count: int, workers: int) -> None:
    shares = [share(count, workers, index) for index in range(workers)]
    assert sum(shares) == count
    assert max(shares) - min(shares) <= 1
    assert min(shares) >= 1


def test_a_plain_onnxruntime_model_with_an_instance_per_worker_is_hosted() -> None:
    assert why_not_hosted([_version()], 4) is None
    assert why_not_hosted([_version("dynamic_batching { max_queue_delay_microseconds: 100 }")], 2) is None


@pytest.mark.parametrize(
    ("version", "reason"),
    [
        (_version(base=PLAIN.replace('backend: "onnxruntime"', 'backend: "python"')), "onnxruntime"),
        (_version("sequence_batching { }"), "server-wide"),
        (_version("response_cache { enable: true }"), "cache"),
        (_version("dynamic_batching { priority_levels: 2 default_priority_level: 1 }"), "queue policies"),
        (_version("dynamic_batching { default_queue_policy { max_queue_size: 4 } }"), "queue policies"),
        (_version(base=PLAIN.replace("KIND_CPU", "KIND_GPU")), "plain CPU"),
        (_version(base=PLAIN.replace("count: 4", "count: 1")), "1 instances for 2 workers"),
        (_version("instance_group [ { count: 2 kind: KIND_CPU } ]"), "more than one"),
        (_Version(_version().config, decoupled=True), "server-wide"),
    ],
)
def test_what_keeps_a_model_in_the_core(version: _Version, reason: str) -> None:
    why = why_not_hosted([version], 2)
    assert why is not None and reason in why


def test_poll_mode_and_the_rate_limiter_keep_every_model_in_the_core(tmp_path: Path) -> None:
    class _Plane:
        stats_of = None
        tracing = Tracing()

    def enabled(**overrides: object) -> bool:
        config = ServerConfig(model_repository=tmp_path, **{"frontend_workers": 2, **overrides})  # type: ignore[arg-type]
        return WorkerHosting(_Plane(), config).enabled  # type: ignore[arg-type]

    assert enabled()
    assert not enabled(model_control_mode="poll")
    assert not enabled(rate_limit="execution_count")
    assert not enabled(worker_instances=False)
    assert not enabled(frontend_workers=1)


def _counted(successes: int, batch_sizes: list[int], failures: int = 0) -> ModelStats:
    stats = ModelStats()
    for index in range(successes):
        stats.record_success(1000 + index, 10, 20, 30, 40)
    for size in batch_sizes:
        stats.record_execution(size, 2, 3, 4)
    for _ in range(failures):
        stats.record_failure(500, "BACKEND")
    stats.pending = 3
    return stats


def test_published_statistics_read_back_as_they_were_counted() -> None:
    stats = _counted(5, [1, 4, 4], failures=2)
    counters = np.zeros(counters_length(8), dtype=np.int64)
    stats.publish(counters)
    read = ModelStats.from_counters(counters)
    assert read.to_dict("m", "1") == stats.to_dict("m", "1")
    assert read.pending == 3


def test_statistics_merged_over_processes_are_the_sums() -> None:
    core, worker = _counted(2, [2]), _counted(3, [1, 2], failures=1)
    merged = ModelStats.merged([core, worker]).to_dict("m", "1")
    assert merged["inference_stats"]["success"] == {"count": 5, "ns": 2001 + 3003}
    assert merged["inference_stats"]["fail"]["count"] == 1
    assert merged["inference_count"] == 5
    assert merged["execution_count"] == 3
    assert {b["batch_size"]: b["compute_infer"]["count"] for b in merged["batch_stats"]} == {1: 1, 2: 2}
    assert ModelStats.merged([core, worker]).pending == 6
    assert ModelStats.merged([core, worker]).load_id == core.load_id


def test_a_request_naming_shared_memory_is_told_apart() -> None:
    plain = v2.InferRequest(model_name="m", inputs=[v2.InferTensor("IN", "FP32", [1], [1.0])])
    assert not names_shared_memory(plain)
    shared = v2.InferRequest(
        model_name="m",
        inputs=[v2.InferTensor("IN", "FP32", [1], None, parameters={"shared_memory_region": "r"})],
    )
    assert names_shared_memory(shared)
    output = v2.InferRequest(
        model_name="m",
        inputs=[v2.InferTensor("IN", "FP32", [1], [1.0])],
        outputs=[v2.RequestedOutput("OUT", parameters={"shared_memory_region": "r"})],
    )
    assert names_shared_memory(output)


def test_publishing_without_batches_leaves_the_batch_counters_as_they_were() -> None:
    stats = _counted(1, [2])
    counters = np.zeros(counters_length(8), dtype=np.int64)
    stats.publish(counters)
    stats.record_execution(4, 1, 1, 1)
    stats.record_success(10, 1, 1, 1, 1)
    stats.publish(counters, batches=False)
    read = ModelStats.from_counters(counters)
    assert read.success_count == 2 and read.execution_count == 2  # the per-request counters: current
    assert [b["batch_size"] for b in read.to_dict("m", "1")["batch_stats"]] == [2]  # the rows: as before
    stats.publish(counters)
    assert [b["batch_size"] for b in ModelStats.from_counters(counters).to_dict("m", "1")["batch_stats"]] == [2, 4]
