"""The compiled request path next to the same code interpreted and real Triton, in one run.

    PERFKIT_PEERS=DIR python bench/compiled.py [--protocols http,grpc] [--concurrency 8] [--rounds 3]
        [--window-ms 2000]

Three servers on the python-backend identity of bench/python_backend_vs_triton.py
(`py_identity_plain`: pb_utils copies INPUT0 to OUTPUT0, FP32 [16], no dynamic batching, one stub
process), the issue's figure: this install's perfkit-server as built
(`compiled`: `pip install -e .`, docs/compiled.md), the same install with PERFKIT_PURE_PYTHON=1
(`interpreted`: v2kit/compiled.py imports the sources), and tritonserver. NVIDIA's perf_analyzer
drives each at each concurrency, in an order that rotates every round. Per run: infer/s, and the
server's CPU per request counted both ways: the server process alone, and its process tree (the
python stub included); user + system CPU over the run, divided by the requests its statistics
extension counted. The table gives medians over the rounds with their
min-max, and each of ours as a ratio to Triton's median.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

from _harness import machine, peers_dir, perf_analyzer, process_cpu_s, success_count, tree_cpu_s
from python_backend_vs_triton import _IDENTITY_PY, _identity_config

from perfkit.target import reference_server_process
from perfkit.testing.triton import triton_server
from v2kit.compiled import PURE_PYTHON

SERVERS = ("compiled", "interpreted", "triton")
MODEL = "py_identity_plain"


def identity_repository(dest: Path) -> Path:
    """The python-backend identity alone, as bench/python_backend_vs_triton.py writes it."""
    (dest / MODEL / "1").mkdir(parents=True)
    (dest / MODEL / "1" / "model.py").write_text(_IDENTITY_PY)
    (dest / MODEL / "config.pbtxt").write_text(_identity_config(MODEL, 16, batching=False))
    return dest


@contextlib.contextmanager
def interpreted_env() -> Iterator[None]:
    """PERFKIT_PURE_PYTHON=1 for the server started inside (it reads it at import)."""
    before = os.environ.get(PURE_PYTHON)
    os.environ[PURE_PYTHON] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ[PURE_PYTHON]
        else:
            os.environ[PURE_PYTHON] = before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--protocols", default="http,grpc")
    parser.add_argument("--concurrency", default="8")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window-ms", type=int, default=2000)
    args = parser.parse_args()
    peers = peers_dir()
    levels = [int(c) for c in args.concurrency.split(",")]
    runs: dict[tuple[str, str, int], list[tuple[float, float, float]]] = defaultdict(list)
    print(machine(peers), file=sys.stderr)
    with tempfile.TemporaryDirectory() as scratch, contextlib.ExitStack() as stack:
        repository = identity_repository(Path(scratch) / "models")
        compiled = stack.enter_context(reference_server_process(repository))
        with interpreted_env():
            interpreted = stack.enter_context(reference_server_process(repository))
        triton = stack.enter_context(triton_server(peers, repository))
        endpoints = {
            "compiled": (compiled.http_url, compiled.grpc_url, compiled.process.pid),
            "interpreted": (interpreted.http_url, interpreted.grpc_url, interpreted.process.pid),
            "triton": (triton.http_url, triton.grpc_url, triton.process.pid),
        }
        for index in range(args.rounds):
            order = SERVERS[index % 3 :] + SERVERS[: index % 3]
            for protocol in args.protocols.split(","):
                for level in levels:
                    for server in order:
                        http_url, grpc_url, pid = endpoints[server]
                        before = success_count(http_url, MODEL)
                        cpu_before, tree_before = process_cpu_s(pid), tree_cpu_s(pid)
                        # -s 1000: any three windows do; CPU per request needs no stable latency.
                        pa = [
                            "-i", protocol, "--concurrency-range", str(level), "-p", str(args.window_ms),
                            "-s", "1000",
                        ]  # fmt: skip
                        rows = perf_analyzer(peers, MODEL, http_url if protocol == "http" else grpc_url,
                                             Path(scratch) / "pa.csv", pa)  # fmt: skip
                        requests = success_count(http_url, MODEL) - before
                        cpu_us = (process_cpu_s(pid) - cpu_before) / requests * 1e6
                        tree_us = (tree_cpu_s(pid) - tree_before) / requests * 1e6
                        infer_s = float(rows[-1]["Inferences/Second"])
                        runs[(server, protocol, level)].append((infer_s, cpu_us, tree_us))
                        print(f"round {index + 1} {server} {protocol} c{level}: {infer_s:.0f} infer/s, "
                              f"{cpu_us:.0f} µs/req, tree {tree_us:.0f}", file=sys.stderr)  # fmt: skip
    print(f"{machine(peers)}; {args.rounds} rounds, medians (min-max); ratios to Triton's median\n")
    print("| protocol | c | server | infer/s | server CPU µs/req | vs Triton | process tree µs/req | vs Triton |")
    print("|---|---|---|---|---|---|---|---|")
    for protocol in args.protocols.split(","):
        for level in levels:
            peer = [statistics.median(r[i] for r in runs[("triton", protocol, level)]) for i in range(3)]
            for server in SERVERS:
                columns = [[r[i] for r in runs[(server, protocol, level)]] for i in range(3)]
                cells = [f"{statistics.median(c):.0f} ({min(c):.0f}-{max(c):.0f})" for c in columns]
                ratios = [f"{statistics.median(columns[i]) / peer[i]:.2f}" for i in (1, 2)]
                print(
                    f"| {protocol} | {level} | {server} | {cells[0]} | {cells[1]} | {ratios[0]} | {cells[2]} | {ratios[1]} |"
                )


if __name__ == "__main__":
    main()
