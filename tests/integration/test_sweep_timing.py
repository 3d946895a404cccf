"""perfkit sweep measures latencies that are known in advance, on the real tritonserver: a sleeper
with a fixed service time, and a staller that pauses periodically, swept open loop so that
coordinated omission shows.

The staller (one instance, 5 ms per request, but the first request of every 2 s period takes
400 ms) at 20 req/s: the requests that arrive during a stall queue behind it, about a fifth of all
requests (the stalled one and the ~8 that arrive in its 400 ms, of ~40 per period; with a stall
every second it would be nearly half, and the median would sit on the edge of the stalls). A client that keeps its schedule measures them from their intended send time, so the
corrected p99 is close to the stall; the median request never meets a stall and stays small.
perfkit's figures are printed (`pytest -s`). On a quiet 2-core VM whose idle CPUs are slow to wake:
p50 7.8-8.5 ms, p99 406-411 ms from the actual send, 2-5 % of sends more than 1 ms late (largest
lag 8-14 ms) in a quiet spell; while the host woke its CPUs more slowly, p50 9-15 ms and 9-25 % late
(largest lag 18-44 ms). perf_analyzer on the same server: p50 10.7-16 ms, p99 421 ms, 14-21 % of
its requests delayed. (On a machine that wakes promptly: p50 6.8 ms and 1 % late.)

That the client kept its schedule (next to no late send) is a property of the client and of the
machine: when other processes take more than BUSY_MACHINE_SHARE of the CPUs and the schedule was
missed twice, the test is skipped with the figures rather than failed.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from perfkit.results.model import LevelResult, read_sweep
from perfkit.testing import TritonProcess, write_sleeper, write_staller
from tests.integration.test_perf_analyzer import run_perf_analyzer
from tests.integration.test_sweep_vs_perf_analyzer import BUSY_MACHINE_SHARE, OtherLoad
from tests.servers import running_triton

pytestmark = [pytest.mark.integration, pytest.mark.peers]

SLEEPER_MS = 20.0
STALLER_MS = 5.0
STALL_MS = 400.0
STALL_EVERY_S = 2.0
RATE = 20  # requests per second: 10 % of the staller's capacity outside the stalls
SHAPE = ("--shape", "INPUT0:16")  # the models' input is FP32 [-1]
# Three 2 s windows in any case: -s 1000 accepts the level however the stalls fall in the windows.
STALLER_WINDOWS = ("-p", "2000", "-s", "1000", "-r", "3")
# Sends more than 1 ms late (perfkit's and perf_analyzer's tolerance): about 1 % on an idle machine
# that wakes promptly, 2-25 % on a VM whose idle CPUs take up to ms to wake, as the host allows
# (perf_analyzer there: 15-21 % of its requests delayed, counting only sends its thread was already
# behind for, not a late wake). Past the bound, perf_analyzer runs the same schedule on the same
# server: perfkit is held to what the machine allowed it, within PEER_MARGIN_PCT points. A client
# that waited for the server would be late for every send queued behind a stall, by up to the stall
# (400 ms): the lag bound below (a quarter of a stall; a slow host's wakes and a window's figures
# made lags of up to 44 ms) is what tells them apart.
MAX_DELAYED_PCT = 25.0
PEER_MARGIN_PCT = 10.0
MAX_LAG_SHARE_OF_STALL = 0.25


@pytest.fixture(scope="module")
def triton(peers: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonProcess]:
    repo = tmp_path_factory.mktemp("triton-timing") / "models"
    write_sleeper(repo, "sleeper", service_ms=SLEEPER_MS)
    write_staller(repo, "staller", service_ms=STALLER_MS, stall_ms=STALL_MS, stall_every_s=STALL_EVERY_S)
    with running_triton(peers, repo, auto_complete=False) as server:
        yield server


def sweep(url: str, model: str, tmp_path: Path, *args: str) -> LevelResult:
    """One level of `perfkit sweep` as a separate process; its JSON result."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    report_dir = tmp_path / "reports"
    command = [
        sys.executable, "-m", "perfkit", "sweep", "-u", url, "-m", model, *SHAPE, *args,
        "--report-dir", str(report_dir), "-f", str(tmp_path / "perfkit.csv"), "--quiet", "--no-report",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=90, check=False)
    # 3: the level did not stabilise; it is still measured and reported.
    assert result.returncode in (0, 3), f"perfkit sweep exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    (json_path,) = report_dir.glob("sweep-*.json")
    (level,) = read_sweep(json_path).levels
    return level


def test_sleeper_latency_is_its_service_time(triton: TritonProcess, tmp_path: Path) -> None:
    # Half-second windows: 25 requests each, at 20 ms apiece, steady enough for -s 25.
    level = sweep(triton.http_url, "sleeper", tmp_path, "--concurrency-range", "1", "-p", "500", "-s", "25", "-r", "6")
    service_us = SLEEPER_MS * 1000
    print(
        f"sleeper {SLEEPER_MS:.0f} ms, concurrency 1: p50 {level.latency.p50_us / 1000:.2f} ms, "
        f"p99 {level.latency.p99_us / 1000:.2f} ms, {level.throughput_infer_per_s:.1f} infer/s, "
        f"server compute infer {level.server.compute_infer_us / 1000 if level.server else float('nan'):.2f} ms"
    )
    assert level.error_count == 0
    # The sleep is a floor; above it, Triton's python backend and the client add about 1-3 ms here.
    assert service_us <= level.latency.p50_us <= service_us + 15_000, level.latency
    assert level.server is not None
    assert 0.95 * service_us <= level.server.compute_infer_us <= 1.5 * service_us, level.server
    # Closed loop at concurrency 1: one request at a time, each taking the service time at least.
    assert level.throughput_infer_per_s <= 1e6 / service_us


def schedule_kept(level: LevelResult) -> bool:
    """Next to no send left more than 1 ms late, and none waited for the server (the largest lag is
    far below a stall)."""
    return level.delayed_pct <= MAX_DELAYED_PCT and level.max_send_lag_us < MAX_LAG_SHARE_OF_STALL * STALL_MS * 1000


def perf_analyzer_delayed_pct(peers: Path, url: str, *args: str) -> float:
    """The share of requests perf_analyzer says it sent late on the same load (0 when it says none)."""
    result = run_perf_analyzer(peers, "-u", url, "-m", "staller", *SHAPE, *args, timeout=90)
    assert result.returncode == 0, result.stdout + result.stderr
    found = re.search(r"([0-9.]+)% of the requests were delayed", result.stdout)
    return float(found.group(1)) if found else 0.0


def test_staller_latency_from_intended_send_sees_the_stalls(triton: TritonProcess, peers: Path, tmp_path: Path) -> None:
    load = ("--request-rate-range", str(RATE), "--request-distribution", "poisson")
    with OtherLoad() as other:
        level = sweep(triton.http_url, "staller", tmp_path / "try1", *load, *STALLER_WINDOWS)
    if not schedule_kept(level):
        # A burst of other work on a small shared machine can keep any client from its schedule
        # for tens of ms; one more try before calling the schedule missed.
        with OtherLoad() as other:
            level = sweep(triton.http_url, "staller", tmp_path / "try2", *load, *STALLER_WINDOWS)
    stall_us = STALL_MS * 1000

    print(
        f"\nstaller {STALLER_MS:.0f} ms + {STALL_MS:.0f} ms stall every {STALL_EVERY_S:.0f} s, {RATE} req/s poisson:\n"
        f"  perfkit from intended send: p50 {level.latency_from_intended.p50_us / 1000:.1f} ms, "
        f"p99 {level.latency_from_intended.p99_us / 1000:.1f} ms\n"
        f"  perfkit from actual send:   p50 {level.latency.p50_us / 1000:.1f} ms, "
        f"p99 {level.latency.p99_us / 1000:.1f} ms; delayed {level.delayed_pct:.1f} % "
        f"(largest lag {level.max_send_lag_us / 1000:.1f} ms), "
        f"{level.request_count} requests"
    )

    assert level.error_count == 0
    # Every request that met a stall counts its wait, from when it should have been sent.
    assert level.latency_from_intended.p99_us >= 0.5 * stall_us, level.latency_from_intended
    assert level.latency_from_intended.p50_us <= level.latency_from_intended.p99_us
    # Most requests never meet a stall: the median stays far below it.
    assert level.latency.p50_us < 0.25 * stall_us, level.latency
    # Throughput follows the schedule (open loop), not the server's pauses.
    assert 0.5 * RATE <= level.throughput_infer_per_s <= 1.5 * RATE, level.throughput_infer_per_s
    # The client kept its schedule through the stalls.
    if not schedule_kept(level) and other.share > BUSY_MACHINE_SHARE:
        pytest.skip(
            f"{level.delayed_pct:.1f} % of sends late, largest lag {level.max_send_lag_us / 1000:.0f} ms, while other "
            f"processes took {other.share:.0%} of the CPUs: no verdict on the schedule on a busy machine"
        )
    if level.delayed_pct > MAX_DELAYED_PCT:
        peer_pct = perf_analyzer_delayed_pct(peers, triton.http_url, *load, *STALLER_WINDOWS)
        print(f"  perf_analyzer on the same load: {peer_pct:.1f} % of its requests delayed")
        assert level.delayed_pct <= peer_pct + PEER_MARGIN_PCT, (
            f"{level.delayed_pct} % late, perf_analyzer {peer_pct} %; other processes: {other.share:.0%} of the CPUs"
        )
    assert level.max_send_lag_us < MAX_LAG_SHARE_OF_STALL * stall_us, (
        f"{level.max_send_lag_us} us; other processes: {other.share:.0%}"
    )
