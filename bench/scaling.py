"""How do client and server cost scale with concurrency and with payload size? perfkit sweeps the demo
identity model on one reference server (the server copies the input, so its cost is transport and
codec), once per point, and the tables give client and server CPU per request and per MB moved.

    python bench/scaling.py [--concurrency 1,2,4,8,16,32,64] [--sizes-kib 1,16,256,1024,4096]
        [--size-concurrency 4] [--window-ms 1000] [--formats binary,json,grpc]

Two series (about 5 minutes with the defaults):

- concurrency: 1 KiB requests at each --concurrency level, over HTTP (binary tensors) and gRPC.
- payload: --size-concurrency requests outstanding, at each size in --sizes-kib, as HTTP with the
  binary tensor extension, HTTP with JSON tensors (`--input-tensor-format json`) and gRPC (always
  binary). A request of S bytes is the identity's FP32 input with shape [S / 4] (`--shape`), and
  the answer is as large; the identity allows any length (dims [-1]), and the server is started
  with `--http-max-input-size` 256 MiB so JSON's text form of 4 MiB of floats fits.

How each figure is measured:

- client CPU: perfkit runs as a child process, alone; its user + system CPU is the RUSAGE_CHILDREN
  delta around the run (as bench/client.py), minus the fixed cost of a run (interpreter start,
  imports, result files): per protocol, a short and a long run at concurrency 1 with 1 KiB give
  it as the intercept of CPU against requests.
- server CPU: user + system CPU of the server process over the run (psutil), per request.
- requests: the server's count (statistics extension) over the whole run.
- MB moved: tensor bytes in both directions, 2 x S per request (JSON's text is larger on the wire:
  the point is the cost per byte of data). µs/MB = CPU per request / MB per request.

"Cost grows no faster than bytes" reads as the ratio of CPU per MB at the largest size to CPU per MB
at the smallest: at most 1 means the cost per request grew no faster than the payload. Throughput
is perfkit's reported infer/s of the level (-p windows, -s 50 -r 3).
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import ServedRun, machine, perfkit_command, perfkit_levels, served_run

from perfkit.target import ServerProcess, reference_server_process
from v2kit.demo import build_demo_repository

MODEL = "identity"
KIB = 1024
MAX_INPUT_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Point:
    series: str  # "concurrency" | "payload" | "fixed"
    transport: str  # "http-binary" | "http-json" | "grpc"
    size_bytes: int
    concurrency: int
    window_ms: int
    served: ServedRun
    infer_per_s: float

    @property
    def protocol(self) -> str:
        return "grpc" if self.transport == "grpc" else "http"


def measure(
    server: ServerProcess, series: str, transport: str, size_bytes: int, concurrency: int, window_ms: int, tmp: Path
) -> Point:
    protocol = "grpc" if transport == "grpc" else "http"
    url = server.grpc_url if protocol == "grpc" else server.http_url
    args = ["--shape", f"INPUT0:{size_bytes // 4}", "--concurrency-range", str(concurrency)]
    args += ["-p", str(window_ms), "-s", "50", "-r", "3"]
    if protocol == "http":
        args += ["--input-tensor-format", transport.removeprefix("http-")]
    out = Path(tempfile.mkdtemp(dir=tmp))
    served = served_run(
        perfkit_command(url, MODEL, protocol, args, out), server.http_url, MODEL, server.process.pid, 600
    )
    levels = perfkit_levels(out)
    if not levels:
        print(f"perfkit {transport} {size_bytes} B c={concurrency} exited {served.timed.result.returncode}:\n"
              f"{served.timed.result.stderr[-1500:]}", file=sys.stderr)  # fmt: skip
    infer_per_s = float(levels[0]["throughput_infer_per_s"]) if levels else math.nan  # type: ignore[arg-type]
    return Point(series, transport, size_bytes, concurrency, window_ms, served, infer_per_s)


def fixed_cost_s(short: Point, long: Point) -> float:
    """Client CPU that does not grow with requests: the intercept of the line through two runs."""
    n_short, n_long = short.served.server_requests, long.served.server_requests
    if n_long <= n_short:
        return 0.0
    per_request = (long.served.timed.cpu_s - short.served.timed.cpu_s) / (n_long - n_short)
    return max(0.0, short.served.timed.cpu_s - per_request * n_short)


@dataclass(frozen=True, slots=True)
class Costs:
    client_us: float  # per request, fixed cost taken out
    server_us: float
    mb_per_request: float

    @property
    def client_us_per_mb(self) -> float:
        return self.client_us / self.mb_per_request

    @property
    def server_us_per_mb(self) -> float:
        return self.server_us / self.mb_per_request


def costs(point: Point, fixed: dict[str, float]) -> Costs:
    requests = point.served.server_requests
    if not requests:
        return Costs(math.nan, math.nan, 2 * point.size_bytes / 1e6)
    client = (point.served.timed.cpu_s - fixed[point.protocol]) / requests * 1e6
    return Costs(client, point.served.server_cpu_s / requests * 1e6, 2 * point.size_bytes / 1e6)


def render(points: list[Point], fixed: dict[str, float], host: str) -> str:
    lines = [
        f"perfkit on the reference server, demo `identity`, concurrency mode, -s 50 -r 3; {host}",
        "",
        "| series | transport | payload KiB | concurrency | infer/s | MB/s moved | client CPU us/req "
        "| server CPU us/req | client CPU us/MB | server CPU us/MB |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for point in points:
        if point.series == "fixed":
            continue
        cost = costs(point, fixed)
        lines.append(
            f"| {point.series} | {point.transport} | {point.size_bytes / KIB:g} | {point.concurrency} | "
            f"{point.infer_per_s:.0f} | {point.infer_per_s * cost.mb_per_request:.1f} | {cost.client_us:.0f} | "
            f"{cost.server_us:.0f} | {cost.client_us_per_mb:.0f} | {cost.server_us_per_mb:.0f} |"
        )
    lines += ["", "ratios (cost per request at the end of a series over its start; for payload, cost per MB too):", ""]
    lines += ["| series | transport | from | to | bytes x | client CPU/req x | server CPU/req x | client CPU/MB x "
              "| server CPU/MB x (<= 1: no faster than bytes) |",
              "|---|---|---|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    for series in ("concurrency", "payload"):
        for transport in dict.fromkeys(p.transport for p in points if p.series == series):
            chosen = [p for p in points if p.series == series and p.transport == transport]
            # For payload also the last step alone: at 1 KiB the fixed cost per request dominates.
            pairs = [(chosen[0], chosen[-1])]
            if series == "payload" and len(chosen) > 2:
                pairs.append((chosen[-2], chosen[-1]))
            for first, last in pairs:
                lines.append(ratio_row(series, transport, first, last, fixed))
    lines += ["", "fixed client CPU per run (start-up, result files): "
              + ", ".join(f"{p} {s * 1000:.0f} ms" for p, s in fixed.items())]  # fmt: skip
    return "\n".join(lines)


def ratio_row(series: str, transport: str, first: Point, last: Point, fixed: dict[str, float]) -> str:
    a, b = costs(first, fixed), costs(last, fixed)
    label = "c{}" if series == "concurrency" else "{} KiB"
    start = label.format(first.concurrency if series == "concurrency" else first.size_bytes // KIB)
    end = label.format(last.concurrency if series == "concurrency" else last.size_bytes // KIB)
    return (
        f"| {series} | {transport} | {start} | {end} | {last.size_bytes / first.size_bytes:g} | "
        f"{b.client_us / a.client_us:.2f} | {b.server_us / a.server_us:.2f} | "
        f"{b.client_us_per_mb / a.client_us_per_mb:.3f} | {b.server_us_per_mb / a.server_us_per_mb:.3f} |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", default="1,2,4,8,16,32,64", help="levels of the concurrency series")
    parser.add_argument("--sizes-kib", default="1,16,256,1024,4096", help="payload sizes of the payload series")
    parser.add_argument("--size-concurrency", type=int, default=4, help="concurrency of the payload series")
    parser.add_argument("--window-ms", type=int, default=1000, help="perfkit -p")
    parser.add_argument("--formats", default="binary,json,grpc", help="payload series transports")
    args = parser.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",")]
    sizes = [int(float(s) * KIB) for s in args.sizes_kib.split(",")]
    transports = ["grpc" if f == "grpc" else f"http-{f}" for f in args.formats.split(",")]
    points: list[Point] = []
    fixed: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        repository = build_demo_repository(tmp / "models")
        with reference_server_process(repository, ("--http-max-input-size", str(MAX_INPUT_BYTES))) as server:
            measure(server, "fixed", "http-binary", KIB, 8, 500, tmp)  # warm-up
            for transport in ("http-binary", "grpc"):
                print(f"fixed cost: {transport} ...", file=sys.stderr, flush=True)
                short = measure(server, "fixed", transport, KIB, 1, max(100, args.window_ms // 10), tmp)
                long = measure(server, "fixed", transport, KIB, 1, args.window_ms * 2, tmp)
                fixed["grpc" if transport == "grpc" else "http"] = fixed_cost_s(short, long)
                points += [short, long]
            for transport in ("http-binary", "grpc"):
                for concurrency in levels:
                    print(f"measuring: {transport} c={concurrency} ...", file=sys.stderr, flush=True)
                    points.append(measure(server, "concurrency", transport, KIB, concurrency, args.window_ms, tmp))
            for transport in transports:
                for size in sizes:
                    print(f"measuring: {transport} {size // KIB} KiB ...", file=sys.stderr, flush=True)
                    points.append(
                        measure(server, "payload", transport, size, args.size_concurrency, args.window_ms, tmp)
                    )
    print()
    print(render(points, fixed, machine()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
