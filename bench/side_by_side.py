"""Two trees' reference servers side by side on one python-backend model, requests alternated.

    python bench/side_by_side.py --baseline ../perfkit-old [--model py_identity_plain] [--concurrency 1]
        [--blocks 30] [--requests 1000]

On a machine whose load comes and goes (other work), perf_analyzer's runs of one tree and then the
other differ by tens of percent for reasons of their own. Here both servers (`python -m
reference_server` from this tree and from `--baseline`, each on its own packages path, on the same
model folder as `python_backend_vs_triton.py` writes it) run at once, and a closed loop of
`--concurrency` keep-alive HTTP/1.1 connections sends the same binary request to one and then the
other, in blocks of `--requests`, which server goes first alternating. Per block: the median latency
(client-side) and the server's CPU per request, of its process alone and with its stub processes. The output is
the medians over the blocks and of the paired ratios, this tree over the baseline, with their
interquartile range.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import process_cpu_s, tree_cpu_s
from python_backend_vs_triton import write_repository

from v2kit.demo import build_demo_repository

ROOT = Path(__file__).resolve().parent.parent
ELEMENTS = 16


def start(tree: Path, repository: Path, port: int) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "reference_server", "--model-repository", str(repository), "--host",
               "127.0.0.1", "--http-port", str(port), "--grpc-port", str(port + 1), "--metrics-port", str(port + 2)]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(tree))
    return subprocess.Popen(command, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def connect(port: int, timeout_s: float = 120.0) -> socket.socket:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            sock = socket.create_connection(("127.0.0.1", port))
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def infer_request(model: str) -> bytes:
    header = json.dumps({
        "inputs": [{"name": "INPUT0", "shape": [1, ELEMENTS], "datatype": "FP32",
                    "parameters": {"binary_data_size": 4 * ELEMENTS}}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
    }).encode()  # fmt: skip
    body = header + np.arange(ELEMENTS, dtype=np.float32).tobytes()
    head = (
        f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
        f"Inference-Header-Content-Length: {len(header)}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def closed_loop(socks: list[socket.socket], request: bytes, total: int) -> list[int]:
    """`total` requests, one outstanding per socket; each one's latency in ns."""
    selector = selectors.DefaultSelector()
    buffers: dict[socket.socket, bytes] = {}
    started: dict[socket.socket, int] = {}
    latencies: list[int] = []
    sent = 0
    for sock in socks:
        selector.register(sock, selectors.EVENT_READ)
        buffers[sock], started[sock] = b"", time.perf_counter_ns()
        sock.sendall(request)
        sent += 1
    while len(latencies) < total:
        for key, _ in selector.select():
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            data = buffers[sock] + sock.recv(65536)
            end = data.find(b"\r\n\r\n")
            if end < 0:
                buffers[sock] = data
                continue
            head = data[:end].decode("latin-1")
            if not head.startswith("HTTP/1.1 200"):
                raise RuntimeError(f"the server answered {head!r}")
            length = int(next(line for line in head.split("\r\n") if line.lower().startswith("content-length:"))[15:])
            if len(data) < end + 4 + length:
                buffers[sock] = data
                continue
            buffers[sock] = data[end + 4 + length :]
            latencies.append(time.perf_counter_ns() - started[sock])
            if sent < total:
                started[sock] = time.perf_counter_ns()
                sock.sendall(request)
                sent += 1
    for sock in socks:
        selector.unregister(sock)
    return latencies


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path, required=True, help="the other checkout")
    parser.add_argument("--model", default="py_identity_plain", help="a model of python_backend_vs_triton.py")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--blocks", type=int, default=30, help="blocks per server")
    parser.add_argument("--requests", type=int, default=1000, help="requests per block (CPU is read in 10 ms ticks)")
    args = parser.parse_args(argv)
    trees = {"baseline": args.baseline.resolve(), "candidate": ROOT}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        mlp_onnx = build_demo_repository(tmp / "demo") / "mlp" / "1" / "model.onnx"
        repository = write_repository(tmp / "repository", ELEMENTS, mlp_onnx)
        servers = {name: start(tree, repository, 19400 + 10 * i) for i, (name, tree) in enumerate(trees.items())}
        try:
            request = infer_request(args.model)
            socks = {name: [connect(19400 + 10 * i) for _ in range(args.concurrency)] for i, name in enumerate(trees)}
            for name in trees:  # warm-up
                closed_loop(socks[name], request, 500)
            latency: dict[str, list[float]] = {name: [] for name in trees}
            cpu: dict[str, list[float]] = {name: [] for name in trees}
            own: dict[str, list[float]] = {name: [] for name in trees}
            for block in range(args.blocks):
                for name in trees if block % 2 == 0 else list(trees)[::-1]:
                    before, own_before = tree_cpu_s(servers[name].pid), process_cpu_s(servers[name].pid)
                    times = closed_loop(socks[name], request, args.requests)
                    cpu[name].append((tree_cpu_s(servers[name].pid) - before) / args.requests * 1e6)
                    own[name].append((process_cpu_s(servers[name].pid) - own_before) / args.requests * 1e6)
                    latency[name].append(statistics.median(times) / 1000)
        finally:
            for process in servers.values():
                process.terminate()
            for process in servers.values():
                process.wait(30)
    print(f"{args.model}, concurrency {args.concurrency}, {args.blocks} blocks of {args.requests} requests per server")
    for name, tree in trees.items():
        print(
            f"{name} ({tree}): p50 {statistics.median(latency[name]):.0f} us, "
            f"server CPU {statistics.median(own[name]):.0f} us/req, with its stubs {statistics.median(cpu[name]):.0f}"
        )
    for what, series in (("p50", latency), ("server CPU", own), ("server and stubs CPU", cpu)):
        ratios = [c / b for c, b in zip(series["candidate"], series["baseline"])]
        q1, q3 = np.percentile(ratios, [25, 75])
        print(f"{what} candidate/baseline, paired by block: {statistics.median(ratios):.3f} (IQR {q1:.3f}-{q3:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
