"""Sequence models: ids, lengths and flags as perf_analyzer assigns them, and the load generator's
sequence slots on virtual time (perfkit.load.sequences)."""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from perfkit.analysis import stats
from perfkit.cli import main
from perfkit.errors import PerfkitError
from perfkit.load.generator import FakeClock, LoadGenerator
from perfkit.load.inputs import parse_request_parameter
from perfkit.load.samples import SampleBuffer
from perfkit.load.schedule import ClosedLoop, OpenLoop
from perfkit.load.sequences import SequenceLoad, SequenceManager, SequenceSpec, parse_id_range
from perfkit.load.validation import batch_expected, read_validation_data
from perfkit.report.export import render_profile_export, render_summary_table
from perfkit.report.html import render_html
from perfkit.results.files import ReportItem
from perfkit.results.model import LatencyStats, ResourceUsage
from perfkit.wire.client import make_client, output_mismatch
from tests.fakes import FakeClient, FakePrepared
from tests.synthetic import make_level, make_sweep
from v2kit import codec as v2
from v2kit.grpc_proto import parameters_from_proto, request_from_proto

MS = 1_000_000


def _walk(manager: SequenceManager, slot: int, requests: int) -> list[tuple[int, int, bool, bool]]:
    out = []
    for _ in range(requests):
        live, step, start, end = manager.next_step(slot)
        out.append((live.sequence_id, step, start, end))
    return out


def test_ids_count_up_from_the_start_and_wrap_within_the_range() -> None:
    spec = SequenceSpec(True, length=2, length_specified=True, length_variation_pct=0, start_id=10, id_range=3)
    manager = SequenceManager(spec, [1])
    manager.reset(1)
    steps = _walk(manager, 0, 10)
    assert [s[0] for s in steps] == [10, 10, 11, 11, 12, 12, 10, 10, 11, 11]
    assert [(s[2], s[3]) for s in steps[:4]] == [(True, False), (False, True)] * 2


def test_an_id_still_live_in_another_slot_is_not_taken_twice() -> None:
    # Range 2, two slots: slot 0 ends first and the next id (10) is slot 1's, so slot 0 keeps its own.
    spec = SequenceSpec(True, length=1, length_specified=True, length_variation_pct=0, start_id=9, id_range=2)
    manager = SequenceManager(spec, [1])
    manager.reset(2)
    first = manager.next_step(0)[0].sequence_id
    manager.slots[1] = manager.begin(1)
    assert (first, manager.slots[1].sequence_id) == (9, 10)
    assert manager.next_step(0)[0].sequence_id == 9


def test_lengths_vary_within_the_variation_truncated_and_at_least_one() -> None:
    spec = SequenceSpec(True, length=20, length_specified=True, length_variation_pct=20)
    manager = SequenceManager(spec, [1], seed=3)
    manager.reset(1)
    lengths = [manager.begin(0).length for _ in range(2000)]
    assert min(lengths) >= 16 and max(lengths) <= 24
    # int() truncates towards zero: ±4 only at the very ends of the draw, as in perf_analyzer
    assert set(lengths) == set(range(17, 24))
    short = SequenceManager(SequenceSpec(True, length=1, length_variation_pct=500), [1])
    short.reset(1)
    assert min(short.begin(0).length for _ in range(200)) == 1


def test_streams_give_the_lengths_and_steps_unless_the_length_is_given() -> None:
    manager = SequenceManager(SequenceSpec(True), [3, 5], seed=1, from_data=True)
    manager.reset(1)
    sequences: list[tuple[int, list[int]]] = []
    for _ in range(200):
        live, step, start, _ = manager.next_step(0)
        if start:
            sequences.append((live.stream, []))
        sequences[-1][1].append(step)
    for stream, steps in sequences[:-1]:
        assert steps == list(range([3, 5][stream]))
    assert {stream for stream, _ in sequences} == {0, 1}
    fixed = SequenceManager(
        SequenceSpec(True, length=7, length_specified=True, length_variation_pct=0), [3], from_data=True
    )
    fixed.reset(1)
    assert [s[1] for s in _walk(fixed, 0, 7)] == [0, 1, 2, 0, 1, 2, 0]  # step k: k % stream length


@pytest.mark.parametrize(
    ("text", "expected"),
    [("5", (5, 2**32 - 1)), ("5:9", (5, 4)), ("x", None), ("0:3", None), ("4:4", None), ("1:2:3", None)],
)
def test_id_range_flag(text: str, expected: tuple[int, int] | None) -> None:
    if expected is None:
        with pytest.raises(PerfkitError, match="--sequence-id-range"):
            parse_id_range(text)
    else:
        assert parse_id_range(text) == expected


def test_fewer_ids_than_live_sequences_is_refused() -> None:
    with pytest.raises(PerfkitError, match="ids would collide"):
        SequenceSpec(True, id_range=3).check_slots(4, "--concurrency-range")


def test_request_parameter_flag() -> None:
    assert parse_request_parameter("max_tokens:256:int") == ("max_tokens", 256)
    assert parse_request_parameter("stream:TRUE:Bool") == ("stream", True)
    assert parse_request_parameter("url:http://x:string") == ("url", "http://x")
    for bad, words in [("a:1", "NAME:VALUE:TYPE"), ("a:x:int", "not an integer"), ("a:1:float", "bool, int or string"),
                       ("sequence_id:3:int", "sequence flags"), ("a:yes:bool", "true or false")]:  # fmt: skip
        with pytest.raises(PerfkitError, match=words):
            parse_request_parameter(bad)


def _sequence_load(spec: SequenceSpec) -> SequenceLoad:
    def prepare(stream: int, step: int, sequence_id: int, start: bool, end: bool) -> FakePrepared:
        return FakePrepared(f"{sequence_id}:{int(start)}{int(end)}")

    return SequenceLoad(spec, SequenceManager(spec, [1]), prepare)


def _by_sequence(client: FakeClient) -> dict[str, list[tuple[int, str]]]:
    """Each sequence's requests (send time, flags), split at its START."""
    runs: dict[str, list[tuple[int, str]]] = {}
    count: dict[str, int] = defaultdict(int)
    for sent, name in client.sent:
        sid, flags = name.split(":")
        if flags[0] == "1":
            count[sid] += 1
        runs.setdefault(f"{sid}#{count[sid]}", []).append((sent, flags))
    return runs


async def test_concurrency_runs_one_request_per_slot_and_ends_every_sequence() -> None:
    clock = FakeClock()
    client = FakeClient(clock, lambda now, i: 10 * MS)
    buffer = SampleBuffer()
    spec = SequenceSpec(True, length=4, length_specified=True, length_variation_pct=0)
    gen = LoadGenerator(client, [], buffer, clock, sequences=_sequence_load(spec))
    gen.start(ClosedLoop(3))
    await clock.sleep_until(95 * MS)  # 10 rounds sent, the 10th in flight
    await gen.stop()
    assert client.max_in_flight == 3
    runs = _by_sequence(client)
    assert len(runs) == 3 * 3  # 3 slots × (2 whole sequences + the one the stop ended)
    for run in runs.values():
        flags = [f for _, f in run]
        assert flags[0][0] == "1" and flags[-1][1] == "1" and all(f == "00" for f in flags[1:-1])
        assert all(b - a == 10 * MS for (a, _), (b, _) in zip(run, run[1:]))  # one at a time
    assert sorted(len(r) for r in runs.values()) == [3] * 3 + [4] * 6  # cut at 2 + the END
    done = buffer.sequences()
    assert len(done) == 9 and done.ok.all()
    whole = done.requests == 4
    assert np.all(done.done_ns[whole] - done.first_sent_ns[whole] == 40 * MS)
    # Every request is recorded with its sequence's id, which the profile export writes as
    # perf_analyzer's does: "sequence_id" after "timestamp"; a request of no sequence has none.
    samples = buffer.arrays()
    assert samples.sequence_id is not None
    sent = sorted((int(t), int(name.split(":")[0])) for t, name in client.sent)
    assert sorted(zip(samples.sent_ns.tolist(), samples.sequence_id.tolist())) == sent
    buffer.record(0, 0, 1)
    text = render_profile_export([("concurrency", 3, buffer.arrays(), [])], version="v", epoch_offset_ns=0)
    requests = json.loads(text)["experiments"][0]["requests"]
    assert [r.get("sequence_id") for r in requests] == [*samples.sequence_id.tolist(), None]
    assert list(requests[0])[:2] == ["timestamp", "sequence_id"]


async def test_request_rate_draws_sequences_and_serial_mode_waits_for_each_answer() -> None:
    def live_overlap(client: FakeClient, latency: int) -> int:
        busy: dict[str, int] = {}
        overlap = 0
        for sent, name in client.sent:
            sid = name.split(":")[0]
            overlap += busy.get(sid, -1) > sent
            busy[sid] = sent + latency
        return overlap

    results = {}
    for serial in (False, True):
        clock = FakeClock()
        client = FakeClient(clock, lambda now, i: 25 * MS)  # longer than the 10 ms between sends
        buffer = SampleBuffer()
        spec = SequenceSpec(True, length=5, length_specified=True, length_variation_pct=0, num_of_sequences=2,
                            serial=serial)  # fmt: skip
        gen = LoadGenerator(client, [], buffer, clock, sequences=_sequence_load(spec))
        gen.start(OpenLoop(rate=100.0))
        await clock.sleep_until(1000 * MS)
        await gen.stop()
        s = buffer.arrays()
        results[serial] = (live_overlap(client, 25 * MS), float(np.mean(s.sent_ns - s.intended_ns)), len(s))
        assert {name.split(":")[0] for _, name in client.sent} <= {str(i) for i in range(1, 200)}
    assert results[False][0] > 10 and results[False][1] == 0  # sequences overlap, sends on time
    assert results[True][0] == 0 and results[True][1] > 10 * MS  # never two of one; sends wait
    assert results[True][2] < results[False][2]


def test_sequence_figures_count_in_the_window_of_their_last_answer() -> None:
    buffer = SampleBuffer()
    for i in range(10):
        buffer.record(i * MS, i * MS, i * MS + MS)
    buffer.record_sequence(0, 5 * MS, True, 3)
    buffer.record_sequence(2 * MS, 9 * MS, True, 3)
    buffer.record_sequence(3 * MS, 8 * MS, False, 3)
    buffer.record_sequence(0, 20 * MS, True, 3)  # after the window
    window = stats.window_result(buffer.arrays(), 0, 11 * MS, 1)
    level = stats.level_result(mode="concurrency", level=1, batch_size=1, windows=[window], samples=buffer.arrays(),
                               server=None, resources=ResourceUsage(), stable=True, sequences=buffer.sequences())  # fmt: skip
    assert level.sequence_count == 3
    assert level.sequence_latency is not None and level.sequence_latency.count == 2
    assert level.sequence_latency.max_us == 7000 and level.sequence_latency.min_us == 5000
    assert level.sequence_throughput_per_s == pytest.approx(2 / 0.011)


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--request-count", "5", "--concurrency-range", "1:4"], "measures one level"),
        (["--request-count", "2", "--concurrency-range", "4"], "less than the concurrency"),
        (["--sequence-id-range", "1:3", "--concurrency-range", "4"], "ids would collide"),
        (["--sequence-id-range", "5:9", "--start-sequence-id", "2"], "disagree on the first id"),
        (["--num-of-sequences", "0", "--request-rate-range", "10"], "--num-of-sequences must be at least 1"),
        (["--sequence-length", "0"], "--sequence-length must be at least 1"),
        (["--request-parameter", "max_tokens:many:int"], "not an integer"),
    ],
)
def test_bad_sequence_and_request_data_flags_exit_2_naming_the_flag(
    flags: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["sweep", "-u", "127.0.0.1:9", "-m", "m", *flags]) == 2
    assert words in capsys.readouterr().err


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize(
    ("sequence_id", "start", "end"), [(1, True, False), (2**63 - 1, False, True), (4242, True, True)]
)
def test_a_sequence_template_encodes_what_a_fresh_encoding_would(
    protocol: str, sequence_id: int, start: bool, end: bool
) -> None:
    client = make_client("127.0.0.1:9", protocol)
    data = np.array([[7]], dtype=np.int32)
    request = v2.InferRequest("m", inputs=[v2.InferTensor("INPUT", "INT32", [1, 1], data)], parameters={"k": "v"})
    prepared = client.prepare_sequence(request).make(sequence_id, start, end)
    if protocol == "http":
        head, _, body = prepared.wire.partition(b"\r\n\r\n")
        length = int(head.lower().split(b"inference-header-content-length: ")[1].split(b"\r\n")[0])
        decoded = v2.decode_infer_request(body, length, "m")
        parameters = {k: v for k, v in decoded.parameters.items() if k != "binary_data_output"}
        assert len(body) == int(head.lower().split(b"content-length: ")[-1].split(b"\r\n")[0])
    else:
        assert prepared.grpc_call is not None
        message = pb.ModelInferRequest.FromString(prepared.grpc_call.body[5:])
        parameters = parameters_from_proto(message.parameters)
        decoded = request_from_proto(message)
    assert parameters == {"k": "v", "sequence_id": sequence_id, "sequence_start": start, "sequence_end": end}
    assert decoded.inputs[0].data.tolist() == [[7]]


def test_validation_data_is_read_as_the_bytes_the_answers_carry(tmp_path: Path) -> None:
    metadata = {"outputs": [{"name": "OUT", "datatype": "INT32"}, {"name": "S", "datatype": "BYTES"}]}
    path = tmp_path / "data.json"
    path.write_text(json.dumps({"data": [{}, {}], "validation_data": [{"OUT": [1, 2]}, {"OUT": [3, 4], "S": ["ab"]}]}))
    steps = read_validation_data(str(path), metadata, streams=False)
    assert steps == [{"OUT": np.array([1, 2], np.int32).tobytes()},
                     {"OUT": np.array([3, 4], np.int32).tobytes(), "S": b"\x02\x00\x00\x00ab"}]  # fmt: skip
    assert batch_expected(steps) == {"OUT": np.array([1, 2, 3, 4], np.int32).tobytes()}  # S: not in every step
    assert output_mismatch(steps[1], {"OUT": steps[1]["OUT"], "S": b"\x02\x00\x00\x00ab"}) == ""
    assert "data differs" in output_mismatch(steps[0], {"OUT": np.array([1, 3], np.int32).tobytes()})
    assert "missing" in output_mismatch(steps[0], {})
    for doc, words in [({"data": [{}], "validation_data": [{}, {}]}, "one entry per entry"),
                       ({"data": [{}], "validation_data": [{"NOPE": [1]}]}, "not an output")]:  # fmt: skip
        path.write_text(json.dumps(doc))
        with pytest.raises(PerfkitError, match=words):
            read_validation_data(str(path), metadata, streams=False)


@pytest.mark.usefixtures("quick_png")  # the page's text is checked, not its pictures
def test_the_summary_and_the_html_report_show_sequences_only_for_sequence_models() -> None:
    plain = make_level(1, [100.0, 100.0, 100.0])
    level = dataclasses.replace(plain, sequence_count=20, sequence_throughput_per_s=12.5,
                                sequence_latency=LatencyStats(count=20, p50_us=8000.0))  # fmt: skip
    header, _, row = render_summary_table([level])
    assert row[header.index("seq/s") :].split()[:3] == ["12.5", "8.00", "0"]  # seq/s, seq p50 ms, errors
    assert "seq/s" not in render_summary_table([plain])[0]
    html = render_html([ReportItem("s", "sweep", make_sweep([level]), "s.json")])
    assert "sequence p50 ms" in html and "8.00" in html
    assert "sequence p50 ms" not in render_html([ReportItem("s", "sweep", make_sweep([plain]), "s.json")])


async def test_sync_does_not_wait_for_a_serial_send_that_waits_for_a_slot() -> None:
    """A window's figures are taken after `sync`, which lets a send due soon go first; a serial
    sequence's send that waits for a free slot may wait an answer's time, and sync does not."""
    clock = FakeClock()
    client = FakeClient(clock, lambda now, i: 10_000 * MS)  # every answer takes 10 s
    spec = SequenceSpec(True, length=5, length_specified=True, length_variation_pct=0, num_of_sequences=1,
                        serial=True)  # fmt: skip
    gen = LoadGenerator(client, [], SampleBuffer(), clock, sequences=_sequence_load(spec))
    gen.start(OpenLoop(rate=100.0))
    await clock.sleep_until(50 * MS)  # the one slot is busy: the send due at 20 ms waits for it
    before = clock.now_ns()
    await gen.sync()
    assert clock.now_ns() == before
    await gen.stop(drain_timeout_s=0)
