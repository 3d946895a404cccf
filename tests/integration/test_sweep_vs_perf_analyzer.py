"""perfkit sweep and NVIDIA's perf_analyzer measure the same model on the same server in the same
run, and agree: over HTTP and gRPC, against the real tritonserver (the demo MLP in a python-backend
ONNX wrapper), at concurrency 1 and 4. (perf_analyzer against our reference server is
tests/integration/test_perf_analyzer.py's.)

What is compared, and how wide the margins are:
- the `-f` CSV header: perfkit's must equal perf_analyzer's for the same options, column for
  column, and both must list the same levels.
- throughput per level: perfkit/perf_analyzer within 0.5-2.0. Both clients share the machine's
  cores with the server, the two runs follow one another, and a python-backend model varies by
  tens of percent from window to window, so a tight bound would test the machine, not perfkit.
  The ratios are printed (`pytest -s`). perfkit's client spends less CPU per request than
  perf_analyzer's (bench/client.py), so on the 2-core development box the server keeps more of the
  CPU under perfkit and perfkit's throughput is usually the higher (up to about 1.4x); with other
  jobs taking half the CPUs the ratio has swung both ways, because the scheduler shares the cores
  per thread and perfkit has one event-loop thread against perf_analyzer's thread per request. So a comparison that fails twice
  while other processes took more than BUSY_MACHINE_SHARE of the CPUs is skipped, with the
  figures, rather than failed.
"""

from __future__ import annotations

import csv
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from perfkit.results.model import SweepResult, read_sweep
from perfkit.testing import write_onnx_wrapper
from tests.machine_load import BUSY_MACHINE_SHARE, OtherLoad
from tests.servers import running_triton

pytestmark = [pytest.mark.integration, pytest.mark.peers]

LEVELS = (1, 4)
# Short windows (hundreds of requests each): the stability bound is loose because this compares two
# tools, it does not judge either one's stability. Both tools get the same window options.
WINDOW_ARGS = ("-p", "300", "-s", "50", "-r", "8")
RATIO_BOUNDS = (0.5, 2.0)


@dataclass(frozen=True, slots=True)
class Target:
    http_url: str
    grpc_url: str

    def url(self, protocol: str) -> str:
        return self.http_url if protocol == "http" else self.grpc_url


@pytest.fixture(scope="module")
def triton(peers: Path, demo_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    """tritonserver serving the demo MLP, batched as the reference server's config batches it."""
    repo = tmp_path_factory.mktemp("triton-mlp") / "models"
    onnx_file = demo_repository / "mlp" / "1" / "model.onnx"
    write_onnx_wrapper(repo, "mlp", onnx_file, max_batch_size=64, dynamic_batching=True, max_queue_delay_us=100)
    with running_triton(peers, repo, auto_complete=False) as server:
        yield Target(server.http_url, server.grpc_url)


def run_perf_analyzer(peers: Path, url: str, protocol: str, out_csv: Path) -> str:
    """Run perf_analyzer; "" when it measured, else why not (it exits 2 when no level stabilised)."""
    command = [
        str(peers / "bin" / "perf_analyzer"), "-m", "mlp", "-u", url, "-i", protocol,
        "--concurrency-range", f"{LEVELS[0]}:{LEVELS[-1]}:{LEVELS[-1] - LEVELS[0]}", *WINDOW_ARGS, "-f", str(out_csv),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=90, check=False)
    if result.returncode == 2:
        return f"perf_analyzer found no stable measurement:\n{result.stdout[-600:]}"
    assert result.returncode == 0, f"perf_analyzer exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return ""


def run_perfkit(url: str, protocol: str, out_csv: Path, report_dir: Path) -> SweepResult:
    command = [
        sys.executable, "-m", "perfkit", "sweep", "-m", "mlp", "-u", url, "-i", protocol,
        "--concurrency-range", f"{LEVELS[0]}:{LEVELS[-1]}:{LEVELS[-1] - LEVELS[0]}", *WINDOW_ARGS,
        "-f", str(out_csv), "--report-dir", str(report_dir), "--quiet", "--no-report",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=90, check=False)
    # 3: a level did not stabilise within -r windows; it is still measured and reported, flagged.
    assert result.returncode in (0, 3), f"perfkit sweep exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    (json_path,) = report_dir.glob("sweep-*.json")
    return read_sweep(json_path)


def read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open(newline="") as handle:
        rows = list(csv.reader(handle))
    header, body = rows[0], rows[1:]
    return header, [dict(zip(header, row, strict=True)) for row in body]


def compare_once(peers: Path, url: str, protocol: str, out: Path, label: str) -> str:
    """Run perf_analyzer then perfkit and check what must always hold (same CSV header, every level
    measured by perfkit); "" when the throughputs agree, else why not."""
    out.mkdir()
    pa_csv, pk_csv = out / "pa.csv", out / "perfkit.csv"
    pa_failure = run_perf_analyzer(peers, url, protocol, pa_csv)
    result = run_perfkit(url, protocol, pk_csv, out / "reports")

    pk_header, pk_rows = read_csv(pk_csv)
    pk_by_level = {int(row["Concurrency"]): row for row in pk_rows}
    assert sorted(pk_by_level) == [level.level for level in result.levels] == list(LEVELS)
    if pa_failure:
        return pa_failure
    pa_header, pa_rows = read_csv(pa_csv)
    assert pk_header == pa_header
    # Rows are sorted by throughput in both files, so match them by level, not by position.
    pa_by_level = {int(row["Concurrency"]): row for row in pa_rows}
    if sorted(pa_by_level) != list(LEVELS):
        # perf_analyzer leaves out a level that did not stabilise (and exits 0 when another did).
        return f"perf_analyzer measured only concurrency {sorted(pa_by_level)}"

    ratios = {}
    for level in LEVELS:
        pa_ips = float(pa_by_level[level]["Inferences/Second"])
        pk_ips = float(pk_by_level[level]["Inferences/Second"])
        ratios[level] = round(pk_ips / pa_ips, 2)
        print(
            f"{label} concurrency {level}: perfkit {pk_ips:.0f} infer/s, perf_analyzer {pa_ips:.0f} infer/s, "
            f"ratio {ratios[level]:.2f}; p50 us perfkit {pk_by_level[level]['p50 latency']}, "
            f"perf_analyzer {pa_by_level[level]['p50 latency']}"
        )
    low, high = RATIO_BOUNDS
    if all(low <= ratio <= high for ratio in ratios.values()):
        return ""
    return f"perfkit/perf_analyzer throughput {ratios} outside {RATIO_BOUNDS}"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perfkit_agrees_with_perf_analyzer(protocol: str, peers: Path, triton: Target, tmp_path: Path) -> None:
    target = triton
    # A second try when the tools disagree or perf_analyzer cannot stabilise: a burst of other work
    # on a small shared machine starves perfkit's one event-loop thread more than perf_analyzer's
    # thread per request, and makes perf_analyzer's windows differ.
    for attempt in (1, 2):
        with OtherLoad() as other:
            failure = compare_once(
                peers, target.url(protocol), protocol, tmp_path / f"try{attempt}", f"triton/{protocol}"
            )
        if not failure:
            return
    if other.share > BUSY_MACHINE_SHARE:
        pytest.skip(f"{failure}; other processes took {other.share:.0%} of the CPUs: no verdict on a busy machine")
    pytest.fail(f"{failure}, twice; other processes took {other.share:.0%} of the CPUs")
