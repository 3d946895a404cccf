"""`perfkit sweep` on sequence models served by the reference server: sequences from `--input-data`
streams whose `validation_data` holds the accumulator's running totals and the START/END flags the
model saw, so a wrong id, a missing flag or mixed sequences show up as validation errors; a wrong
expectation counts as a "validation mismatch"; a sequence model swept without the sequence flags is
refused with exit code 2 and the flag to add."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from perfkit.cli import main
from perfkit.results.model import LevelResult, read_sweep
from reference_server.server import running_server
from tests.sequence_models import ENSEMBLE_CONFIG, write_accumulator
from tests.servers import loopback_config

pytestmark = pytest.mark.integration

#: Two streams; each expected answer is the running total and the (START, END, READY) the model saw.
STREAMS = {
    "data": [[{"INPUT": [1]}, {"INPUT": [2]}, {"INPUT": [3]}], [{"INPUT": [10]}, {"INPUT": [20]}]],
    "validation_data": [
        [{"OUTPUT": [1], "CONTROLS": [1, 0, 1]}, {"OUTPUT": [3], "CONTROLS": [0, 0, 1]},
         {"OUTPUT": [6], "CONTROLS": [0, 1, 1]}],
        [{"OUTPUT": [10], "CONTROLS": [1, 0, 1]}, {"OUTPUT": [30], "CONTROLS": [0, 1, 1]}],
    ],
}  # fmt: skip
WINDOWS = ["-p", "250", "-s", "60", "-r", "4", "--quiet", "--no-report"]


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    repository = tmp_path_factory.mktemp("sequence_sweep") / "models"
    write_accumulator(repository, "accumulator")
    (repository / "sequence_ensemble" / "1").mkdir(parents=True)
    (repository / "sequence_ensemble" / "config.pbtxt").write_text(ENSEMBLE_CONFIG)
    with running_server(loopback_config(repository)) as server:
        yield {"http": f"127.0.0.1:{server.http_port}", "grpc": f"127.0.0.1:{server.grpc_port}"}


def sweep(urls: dict[str, str], tmp_path: Path, protocol: str, *flags: str) -> tuple[int, LevelResult | None]:
    code = main(["sweep", "-u", urls[protocol], "-i", protocol, "--report-dir", str(tmp_path), *WINDOWS, *flags])
    files = sorted(tmp_path.glob("sweep-*.json"))
    return code, (read_sweep(files[-1]).levels[0] if files else None)


def data_file(tmp_path: Path, doc: dict[str, Any]) -> str:
    path = tmp_path / "streams.json"
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.mark.parametrize(
    ("protocol", "load"),
    [("http", ["--concurrency-range", "3"]), ("grpc", ["--request-rate-range", "150", "--serial-sequences"])],
)
def test_streams_run_as_sequences_with_the_answers_expected(
    urls: dict[str, str], tmp_path: Path, protocol: str, load: list[str]
) -> None:
    code, level = sweep(urls, tmp_path, protocol, "-m", "accumulator", *load,
                        "--input-data", data_file(tmp_path, STREAMS))  # fmt: skip
    assert code in (0, 3) and level is not None  # 3: unstable on a busy machine, which is not the point here
    assert level.error_count == 0 and level.ok_count > 20, level.errors
    assert level.sequence_latency is not None and level.sequence_count > 5
    # Each sequence is a whole stream (3 or 2 steps, drawn at random): requests per sequence in between.
    assert 2.0 <= level.ok_count / level.sequence_count <= 3.0
    assert level.sequence_latency.p50_us > level.latency.p50_us


def test_a_wrong_expectation_is_a_validation_mismatch(urls: dict[str, str], tmp_path: Path) -> None:
    doc = json.loads(json.dumps(STREAMS))
    doc["validation_data"][1][1]["OUTPUT"] = [31]  # the second stream's total is 30
    code, level = sweep(urls, tmp_path, "grpc", "-m", "accumulator", "--concurrency-range", "2",
                        "--input-data", data_file(tmp_path, doc))  # fmt: skip
    assert code == 4 and level is not None
    assert set(level.errors) == {"validation mismatch"} and level.ok_count > 0


@pytest.mark.parametrize(
    ("model", "named"), [("accumulator", "sequence model"), ("sequence_ensemble", "'accumulator'")]
)
def test_a_sequence_model_without_sequence_flags_is_refused(
    urls: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str], model: str, named: str
) -> None:
    code, level = sweep(urls, tmp_path, "http", "-m", model)
    assert code == 2 and level is None
    err = capsys.readouterr().err
    assert named in err and "--sequence-length" in err


def test_sequence_flags_with_a_batch_are_refused(
    urls: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _ = sweep(urls, tmp_path, "http", "-m", "accumulator", "--sequence-length", "5", "-b", "2")
    assert code == 2 and "do not support batching" in capsys.readouterr().err


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_probe_sends_a_sequence_model_one_request_sequences(
    urls: dict[str, str], protocol: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Without an id and START the sequence batcher refuses the request; each probe request is a
    # sequence of its own, so all of them succeed.
    assert main(["probe", "-u", urls[protocol], "-i", protocol, "-m", "accumulator", "-n", "3"]) == 0, (
        capsys.readouterr()
    )
