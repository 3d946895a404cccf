"""Streamed requests, every response timed: samples, the load generator on virtual time, the level's
figures, the metric catalogue and CSVs; and the shared-memory plan and flags. No sockets."""

from __future__ import annotations

import json

import numpy as np
import pytest

from perfkit.analysis import stats
from perfkit.analysis.metrics import metric
from perfkit.errors import PerfkitError
from perfkit.load.generator import FakeClock, LoadGenerator
from perfkit.load.samples import SampleArrays, SampleBuffer
from perfkit.load.schedule import ClosedLoop
from perfkit.report.export import render_pa_csv, render_profile_export, render_summary_table
from perfkit.report.tidy import render_tidy_csv
from perfkit.results.model import ResourceUsage, SweepResult, sweep_from_json, sweep_to_json
from perfkit.sweep.spec import DataPathSpec
from perfkit.target import TargetSpec
from perfkit.wire import shared_memory
from perfkit.wire.client import make_client
from tests.fakes import FakeOutcome, FakePrepared
from v2kit import codec as v2
from v2kit.grpc_proto import request_to_proto

MS = 1_000_000


class FakeStreamingClient:
    """Each request: `responses` responses, the first `first_ns` after the send, then one every
    `gap_ns`; its final flag comes `final_ns` after the last (alone, as Triton's empty final)."""

    def __init__(self, clock: FakeClock, responses: int, first_ns: int, gap_ns: int, final_ns: int = MS) -> None:
        self.clock, self.responses = clock, responses
        self.first_ns, self.gap_ns, self.final_ns = first_ns, gap_ns, final_ns

    async def send(self, prepared: FakePrepared) -> FakeOutcome:
        start = self.clock.now_ns()
        times = tuple(start + self.first_ns + k * self.gap_ns for k in range(self.responses))
        await self.clock.sleep_until((times[-1] if times else start) + self.final_ns)
        return FakeOutcome("", 10, response_ns=times)


def test_streamed_samples_keep_their_gaps_through_select_concat_and_round_trips() -> None:
    buffer = SampleBuffer()
    buffer.record(0, 0, 5)  # a unary request: no gaps, responses -1
    buffer.record_streamed(0, 10, 99, "", 1, 2, 0, 0, [20, 25, 35])  # gaps 5, 10; done at its last response
    buffer.record_streamed(0, 40, 60, "", 1, 2, 0, 0, [])  # a final flag alone: done when it came
    buffer.record_streamed(0, 70, 90, "", 1, 2, 0, 0, [80, 81])  # gap 1
    s = buffer.arrays()
    assert s.responses.tolist() == [-1, 3, 0, 2]
    assert s.first_ns.tolist() == [0, 20, 0, 80]
    assert s.done_ns.tolist() == [5, 35, 60, 81]
    assert s.gaps_ns.tolist() == [5, 10, 1]
    picked = s.select(np.array([True, False, True, True]))
    assert picked.gaps_ns.tolist() == [1]
    assert buffer.arrays(2).gaps_ns.tolist() == [1]  # the gaps of the requests from index 2 on
    both = SampleArrays.concat([s.select(np.array([False, True, False, False])), picked])
    assert both.gaps_ns.tolist() == [5, 10, 1]
    again = SampleBuffer()
    for sample in s.samples():
        again.add(sample)
    assert again.arrays().gaps_ns.tolist() == [5, 10, 1]
    assert [x.gaps_ns for x in s.samples()] == [(), (5, 10), (), (1,)]


async def test_every_response_is_timed_on_virtual_time() -> None:
    clock = FakeClock()
    client = FakeStreamingClient(clock, responses=4, first_ns=3 * MS, gap_ns=2 * MS)
    buffer = SampleBuffer()
    gen = LoadGenerator(client, [FakePrepared("a")], buffer, clock)
    gen.start(ClosedLoop(2))
    await clock.sleep_until(1000 * MS)
    await gen.stop()
    s = buffer.arrays()
    # Each request: responses at +3, +5, +7, +9 ms, its final flag alone at +10 ms; done at +9 ms.
    assert np.all(s.done_ns - s.sent_ns == 9 * MS)
    assert np.all(s.first_ns - s.sent_ns == 3 * MS)
    assert set(s.gaps_ns.tolist()) == {2 * MS}
    window = stats.window_result(s, 0, 1000 * MS, 1, None)
    level = stats.level_result(mode="concurrency", level=2, batch_size=1, windows=[window], samples=s, server=None,
                               resources=ResourceUsage(), stable=True)  # fmt: skip
    r = level.responses
    assert r is not None
    assert r.responses_per_request == 4.0
    assert r.response_count == 4 * level.ok_count
    # Two streams, a request every 10 ms on each: 200 requests/s, 800 responses/s.
    assert r.throughput_response_per_s == pytest.approx(4 * level.throughput_infer_per_s)
    assert level.throughput_infer_per_s == pytest.approx(200, rel=0.02)
    assert r.first_response.p50_us == 3000 and r.gap.p99_us == 2000
    assert level.latency.p50_us == 9000  # perf_analyzer's latency: to the last response
    assert metric("first_response_p50_ms").value(level) == 3.0
    assert metric("response_gap_p50_ms").value(level) == 2.0
    assert metric("responses_per_request").value(level) == 4.0
    result = SweepResult("m", "", "u", "grpc", "concurrency", (level,), {})
    assert sweep_from_json(sweep_to_json(result)) == result
    tidy = render_tidy_csv(result).splitlines()
    row = dict(zip(tidy[0].split(","), tidy[1].split(",")))
    assert row["first_response_p50_ms"] == "3" and row["responses_per_request"] == "4"
    assert render_pa_csv([level]).splitlines()[0].startswith("Concurrency,Inferences/Second,Response Throughput,")
    table = render_summary_table([level])
    assert "resp/s  first p50 ms  gap p50 ms" in table[0] and "3.00" in table[2]
    export = json.loads(render_profile_export([("concurrency", 2, s, [])], version="v", epoch_offset_ns=0))
    first = export["experiments"][0]["requests"][0]
    assert [t - first["timestamp"] for t in first["response_timestamps"]] == [3 * MS, 5 * MS, 7 * MS, 9 * MS]


def test_a_level_that_was_not_streamed_has_no_response_figures() -> None:
    buffer = SampleBuffer()
    for k in range(10):
        buffer.record(k * MS, k * MS, k * MS + 500_000)
    s = buffer.arrays()
    window = stats.window_result(s, 0, 10 * MS, 1, None)
    level = stats.level_result(mode="concurrency", level=1, batch_size=1, windows=[window], samples=s, server=None,
                               resources=ResourceUsage(), stable=True)  # fmt: skip
    assert level.responses is None
    assert metric("first_response_p99_ms").value(level) is None
    assert "Response Throughput" not in render_pa_csv([level])


def test_streaming_asks_for_the_empty_final_response() -> None:
    client = make_client("127.0.0.1:1", "grpc", streaming=True)
    request = v2.InferRequest("m", inputs=[v2.InferTensor("IN", "INT32", [2], np.zeros(2, np.int32))])
    prepared = client.prepare(request)
    assert prepared.stream_message[:5] == b"\x00" + len(prepared.payload).to_bytes(4, "big")
    sent = request_to_proto(request).FromString(prepared.payload)
    assert sent.parameters["triton_enable_empty_final_response"].bool_param


# --- flags -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "protocol", "workers", "words"),
    [
        (DataPathSpec(streaming=True), "http", 1, "--streaming is for -i grpc"),
        (DataPathSpec(output_shared_memory_size=0), "http", 1, "--output-shared-memory-size"),
        (DataPathSpec(shared_memory="system"), "http", 2, "drop --workers"),
    ],
)
def test_data_path_flags_are_checked(path: DataPathSpec, protocol: str, workers: int, words: str) -> None:
    with pytest.raises(PerfkitError, match=words) as caught:
        path.validate(TargetSpec(url="x:1", protocol=protocol), workers)
    assert caught.value.exit_code == 2


def test_cuda_shared_memory_says_why_it_cannot_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shared_memory.cuda, "unavailable_reason", lambda: "no GPU: NVML (pynvml) sees none")
    message = shared_memory.cuda_unsupported()
    assert message is not None and message.startswith("--shared-memory cuda: no GPU")
    assert "--shared-memory system" in message
    with pytest.raises(PerfkitError, match="--shared-memory cuda: no GPU") as caught:
        DataPathSpec(shared_memory="cuda").validate(TargetSpec(url="x:1", protocol="grpc"), 1)
    assert caught.value.exit_code == 2


# --- the shared-memory plan ---------------------------------------------------------------------------


def test_regions_follow_perf_analyzers_layout() -> None:
    requests = [
        v2.InferRequest("m", inputs=[
            v2.InferTensor("A", "FP32", [1, 3], np.full((1, 3), k, np.float32)),
            v2.InferTensor("B", "BYTES", [1], np.array([b"xy"], dtype=object)),
        ])
        for k in range(2)
    ]  # fmt: skip
    plan = shared_memory.plan_regions(requests, ["Y", "Z"], output_size=64, batch_size=2, prefix="p")
    sizes = {r.name: (r.byte_size, r.data) for r in plan.regions}
    assert sizes["p_out0"] == (128, None) and sizes["p_out1"] == (128, None)  # one per output, size x batch
    assert sizes["p_in0_1"] == (12, np.full(3, 1, np.float32).tobytes())  # one per input per step
    assert sizes["p_in1_0"] == (6, b"\x02\x00\x00\x00xy")  # BYTES, length-prefixed
    assert len(plan.regions) == 2 + 2 * 2
    second = plan.requests[1]
    assert second.inputs[0].parameters == {
        "shared_memory_region": "p_in0_1", "shared_memory_offset": 0, "shared_memory_byte_size": 12,
    }  # fmt: skip
    assert [(o.name, o.parameters["shared_memory_region"]) for o in second.outputs or ()] == [
        ("Y", "p_out0"), ("Z", "p_out1"),
    ]  # fmt: skip
    body, _ = v2.encode_infer_request(second)
    assert b"xy" not in body and len(body) < 600  # the data stays in the regions
    assert b"binary_data" not in body  # Triton refuses it beside shared_memory_region
    assert not request_to_proto(second).raw_input_contents


def test_a_server_without_the_extension_is_refused_naming_the_fix() -> None:
    with pytest.raises(PerfkitError, match="drop --shared-memory") as caught:
        shared_memory.check_extension({"extensions": ["statistics"]}, "h:1")
    assert "statistics" in str(caught.value) and caught.value.exit_code == 2
    shared_memory.check_extension({"extensions": ["system_shared_memory"]}, "h:1")
