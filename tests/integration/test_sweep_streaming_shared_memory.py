"""`perfkit sweep --streaming` and `--shared-memory system` against the reference server and the real
tritonserver (python-backend decoupled models, tests/decoupled_models.py), and beside NVIDIA's
perf_analyzer on the same server in the same test.

Which figures correspond in streaming mode: perf_analyzer's latency is from the send to the last
response that carried outputs (its final flag may come after it, alone), and so is perfkit's
`p50_ms`; its "Response Throughput" is perfkit's `throughput_response_per_s`. perf_analyzer has no
first-response or inter-response figure: perfkit's `first_response_*` and `response_gap_*` are
checked against the model's own pacing instead. The models here are paced by sleeps (a decoupled
model sending 4 responses 5 ms apart; an identity sleeping 10 ms), one instance each, so the server's
service time, not either client's CPU, sets the figures, and the two tools must agree within 10 %.
"""

from __future__ import annotations

import asyncio
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from perfkit.cli import main
from perfkit.testing import write_sleeper
from perfkit.testing.canned_server import canned_server_process
from perfkit.wire.client import make_client
from reference_server.server import running_server
from tests.decoupled_models import write_paced
from tests.integration.test_sweep_vs_perf_analyzer import BUSY_MACHINE_SHARE, OtherLoad
from tests.servers import loopback_config, running_triton
from v2kit import codec as v2

pytestmark = [pytest.mark.integration]

WINDOWS = ("-p", "500", "-s", "50", "-r", "8")  # beside perf_analyzer: stable enough for both
SHORT = ("-p", "150", "-s", "50", "-r", "3")  # perfkit alone: the figures are checked loosely
PACED = ("-m", "paced", "--shape", "IN:1", "--input-data", "zero")
SLEEPER = ("-m", "sleeper", "--shape", "INPUT0:4096")
AGREEMENT = 0.10  # perfkit and perf_analyzer: throughput and p50 within 10 %


@dataclass(frozen=True, slots=True)
class Endpoints:
    http: str
    grpc: str


def _repository(root: Path) -> Path:
    write_paced(root, "paced", responses=4, gap_ms=5)
    write_paced(root, "stalled", responses=1, gap_ms=0, final=False)
    write_paced(root, "mute", responses=0, gap_ms=0, final=False)
    write_sleeper(root, "sleeper", service_ms=10)
    return root


@pytest.fixture(scope="module")
def ours(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoints]:
    repository = _repository(tmp_path_factory.mktemp("ours") / "models")
    with running_server(loopback_config(repository)) as server:
        yield Endpoints(f"127.0.0.1:{server.http_port}", f"127.0.0.1:{server.grpc_port}")


@pytest.fixture(scope="module")
def triton(peers: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoints]:
    repository = _repository(tmp_path_factory.mktemp("triton") / "models")
    for unused in ("stalled", "mute"):  # Triton would hold their requests until it stops
        shutil.rmtree(repository / unused)
    with running_triton(peers, repository, auto_complete=False) as server:
        yield Endpoints(server.http_url, server.grpc_url)


def tidy_row(report_dir: Path) -> dict[str, str]:
    (path,) = report_dir.glob("*_long.csv")
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))[-1]


def our_regions(http: str) -> list[str]:
    with urllib.request.urlopen(f"http://{http}/v2/systemsharedmemory/status", timeout=5) as answer:
        status = json.load(answer)
    return [region["name"] for region in status if region["name"].startswith("perfkit_")]


def shm_files(pid: int) -> list[str]:
    return [name for name in os.listdir("/dev/shm") if name.startswith(f"perfkit_{pid}_")]


# --- streaming ----------------------------------------------------------------------------------------


def test_a_streamed_sweep_times_every_response(ours: Endpoints, tmp_path: Path) -> None:
    argv = ["sweep", "-u", ours.grpc, "-i", "grpc", "--streaming", *PACED, "--concurrency-range", "1", *SHORT,
            "--report-dir", str(tmp_path), "--quiet", "--no-report"]  # fmt: skip
    assert main(argv) in (0, 3)
    row = tidy_row(tmp_path)
    assert row["errors"] == "" and float(row["responses_per_request"]) == 4
    assert float(row["throughput_response_per_s"]) == pytest.approx(4 * float(row["throughput_infer_per_s"]))
    # The model sleeps 5 ms between its responses; the first comes before any sleep.
    assert 4.5 <= float(row["response_gap_p50_ms"]) < 25
    assert float(row["first_response_p50_ms"]) + 3 * 4.5 <= float(row["p50_ms"])
    (pa_csv,) = (p for p in tmp_path.glob("sweep-*.csv") if not p.stem.endswith("_long"))
    assert pa_csv.read_text().startswith("Concurrency,Inferences/Second,Response Throughput,")


def test_a_request_without_its_final_flag_is_a_counted_error_not_a_hang(ours: Endpoints) -> None:
    async def scenario() -> list[tuple[str, int, float]]:
        client = make_client(ours.grpc, "grpc", request_timeout_s=0.4, streaming=True)
        seen = []
        try:
            for model in ("stalled", "mute", "paced"):
                tensor = v2.InferTensor("IN", "INT32", [1], np.zeros(1, np.int32))
                prepared = client.prepare(v2.InferRequest(model, inputs=[tensor]))
                start = time.monotonic()
                outcome = await client.send(prepared)
                seen.append((outcome.error, len(outcome.response_ns or ()), time.monotonic() - start))
        finally:
            await client.close()
        return seen

    (stalled, mute, paced) = asyncio.run(scenario())
    assert stalled[:2] == ("no final response", 1) and mute[:2] == ("timeout", 0)
    assert all(0.35 < took < 3.0 for _, _, took in (stalled, mute))
    assert paced[:2] == ("", 4)  # the client goes on, on a new stream


# --- shared memory -----------------------------------------------------------------------------------


def test_shared_memory_regions_are_registered_reused_and_unregistered(ours: Endpoints, tmp_path: Path) -> None:
    figures = {}
    for protocol, mode in (("http", "none"), ("http", "system"), ("grpc", "system")):
        out = tmp_path / f"{protocol}-{mode}"
        url = ours.http if protocol == "http" else ours.grpc
        argv = ["sweep", "-u", url, "-i", protocol, *SLEEPER, "--shared-memory", mode, "--concurrency-range", "2",
                *SHORT, "--report-dir", str(out), "--quiet", "--no-report"]  # fmt: skip
        assert main(argv) in (0, 3)
        figures[protocol, mode] = row = tidy_row(out)
        assert row["errors"] == ""
        assert our_regions(ours.http) == [] and shm_files(os.getpid()) == []
    plain = figures["http", "none"]
    for key in (("http", "system"), ("grpc", "system")):
        # The data stays in the regions: the request on the wire is far smaller than the 16 KiB tensor.
        assert float(figures[key]["bytes_out_per_request"]) < 1000 < 16384 < float(plain["bytes_out_per_request"])
        assert float(figures[key]["bytes_in_per_request"]) < 1000  # and so do the outputs
        ratio = float(figures[key]["throughput_infer_per_s"]) / float(plain["throughput_infer_per_s"])
        # Comparable figures: the same columns, and throughput of the same order. The bound is wide
        # for the reason test_sweep_vs_perf_analyzer gives: on a small shared machine the two runs
        # meet different loads (0.64-1.0 seen under a load average of 9 on 2 cores); the tight
        # agreement is checked beside perf_analyzer on tritonserver below.
        assert 0.5 < ratio < 2.0, figures


def test_an_interrupted_sweep_unregisters_its_regions(ours: Endpoints, tmp_path: Path) -> None:
    command = [sys.executable, "-m", "perfkit", "sweep", "-u", ours.http, *SLEEPER, "--shared-memory", "system",
               "-p", "20000", "--report-dir", str(tmp_path), "--quiet", "--no-report"]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not our_regions(ours.http):
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()
            time.sleep(0.05)
        assert shm_files(process.pid)
        time.sleep(0.3)  # measuring, with the regions in use
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 130, err
    assert our_regions(ours.http) == [] and shm_files(process.pid) == []


def test_shared_memory_on_a_server_without_the_extension_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with canned_server_process() as url:
        argv = ["sweep", "-u", url, "--shared-memory", "system", "--report-dir", str(tmp_path), "--quiet"]
        assert main(argv) == 2
    err = capsys.readouterr().err
    assert "does not offer Triton's system shared memory extension" in err and "drop --shared-memory" in err
    assert main(["sweep", "-u", "127.0.0.1:1", "--shared-memory", "cuda"]) == 2
    assert "--shared-memory cuda: " in capsys.readouterr().err


# --- beside perf_analyzer -------------------------------------------------------------------------------


def _perf_analyzer(
    peers: Path, url: str, protocol: str, extra: tuple[str, ...], model: tuple[str, ...]
) -> dict[str, float]:
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"pa-{os.getpid()}-{time.monotonic_ns()}.csv"
    command = [str(peers / "bin" / "perf_analyzer"), "-u", url, "-i", protocol, *model, *extra,
               "--concurrency-range", "2", *WINDOWS, "-f", str(out)]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=90, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    with out.open(newline="") as handle:
        row = next(csv.DictReader(handle))
    out.unlink()
    return {name: float(value) for name, value in row.items()}


def _perfkit(url: str, protocol: str, extra: tuple[str, ...], model: tuple[str, ...], out: Path) -> dict[str, str]:
    command = [sys.executable, "-m", "perfkit", "sweep", "-u", url, "-i", protocol, *model, *extra,
               "--concurrency-range", "2", *WINDOWS, "--report-dir", str(out), "--quiet", "--no-report"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=90, check=False)
    assert result.returncode in (0, 3), result.stdout + result.stderr
    return tidy_row(out)


@pytest.mark.peers
@pytest.mark.parametrize(
    ("mode", "protocol", "extra", "model"),
    [("streaming", "grpc", ("--streaming",), PACED), ("shared memory", "http", ("--shared-memory", "system"), SLEEPER)],
)
def test_perfkit_agrees_with_perf_analyzer_on_tritonserver(
    mode: str, protocol: str, extra: tuple[str, ...], model: tuple[str, ...], triton: Endpoints, tmp_path: Path,
    peers: Path,
) -> None:  # fmt: skip
    url = triton.grpc if protocol == "grpc" else triton.http
    # A second try when they disagree: on a small shared machine a burst of other work stretches the
    # model's sleeps during one tool's run (both directions were seen), as in test_sweep_vs_perf_analyzer.
    for attempt in (1, 2):
        with OtherLoad() as other:
            failure = _compare(peers, url, protocol, extra, model, mode, tmp_path / f"try{attempt}")
        if not failure:
            break
    else:
        if other.share > BUSY_MACHINE_SHARE:
            pytest.skip(f"{failure}; other processes took {other.share:.0%} of the CPUs: no verdict on a busy machine")
        pytest.fail(f"{failure}, twice; other processes took {other.share:.0%} of the CPUs")
    assert our_regions(triton.http) == []


def _compare(
    peers: Path, url: str, protocol: str, extra: tuple[str, ...], model: tuple[str, ...], mode: str, out: Path
) -> str:
    """Run perf_analyzer, then perfkit; "" when their figures agree, else how they differ."""
    pa = _perf_analyzer(peers, url, protocol, extra, model)
    ours_row = _perfkit(url, protocol, extra, model, out)
    pairs = {
        "throughput": (float(ours_row["throughput_infer_per_s"]), pa["Inferences/Second"]),
        "p50 (to the last response)": (float(ours_row["p50_ms"]) * 1000, pa["p50 latency"]),
    }
    if mode == "streaming":
        pairs["responses/s"] = (float(ours_row["throughput_response_per_s"]), pa["Response Throughput"])
    print(
        f"tritonserver {mode}: "
        + "; ".join(f"{k} perfkit {a:.1f} perf_analyzer {b:.1f}" for k, (a, b) in pairs.items())
    )
    apart = [f"{name}: perfkit {a:.1f}, perf_analyzer {b:.1f}" for name, (a, b) in pairs.items()
             if abs(a - b) > AGREEMENT * b]  # fmt: skip
    return "; ".join(apart) + f" (more than {AGREEMENT:.0%} apart)" if apart else ""
