"""Where does one request's client CPU go? The load generator in-process against a reference server
(a separate process, the demo `identity`, FP32 [1, 256]: perf_analyzer's request in bench/client.py), concurrency 8, HTTP then gRPC: CPU µs per
request unprofiled, then under cProfile the calls per request and each function's own µs per
request (cProfile's inflate; read them as shares), grouped by module.

    python bench/client_profile.py [--seconds 3] [--protocols http,grpc] [--concurrency 8] [--top 25]

Run it compiled and with PERFKIT_PURE_PYTHON=1: cProfile sees no calls inside compiled modules
(their functions call each other natively), so the compiled profile shows what is left interpreted.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from perfkit.load.generator import LoadGenerator, RealClock
from perfkit.load.samples import SampleBuffer
from perfkit.load.schedule import ClosedLoop
from perfkit.target import reference_server_process
from perfkit.wire.client import make_client
from v2kit import codec as v2
from v2kit.compiled import describe
from v2kit.demo import build_demo_repository
from v2kit.runtime.eventloop import run


async def _load(
    url: str, protocol: str, concurrency: int, seconds: float, profiler: cProfile.Profile | None
) -> tuple[int, float]:
    """Requests completed and process CPU seconds over `seconds` of load (after a warm-up)."""
    client = make_client(url, protocol)
    request = v2.InferRequest(
        "identity", inputs=[v2.InferTensor("INPUT0", "FP32", [1, 256], np.zeros((1, 256), np.float32))]
    )
    prepared = client.prepare(request)
    buffer = SampleBuffer()
    generator = LoadGenerator(client, [prepared], buffer, RealClock())
    generator.start(ClosedLoop(concurrency))
    await asyncio.sleep(0.5)  # connections open, caches warm
    before, cpu = len(buffer), time.process_time()
    if profiler is not None:
        profiler.enable()
    await asyncio.sleep(seconds)
    if profiler is not None:
        profiler.disable()
    requests, cpu = len(buffer) - before, time.process_time() - cpu
    await generator.stop()
    failures = dict(client.failures.counts)  # type: ignore[attr-defined]  # both clients keep a FailureLog
    if failures:
        raise SystemExit(f"{protocol}: requests failed: {failures} (is the reference server's demo identity there?)")
    await client.close()
    return requests, cpu


def _stage(filename: str) -> str:
    for root in ("perfkit", "v2kit", "asyncio", "uvloop", "httptools", "hpack", "json"):
        marker = f"/{root}/"
        if marker in filename:
            return root + "/" + filename.split(marker, 1)[1]
    return filename.rsplit("/", 1)[-1] if filename != "~" else "builtins"


def _print_profile(profiler: cProfile.Profile, requests: int, top: int) -> None:
    stats = pstats.Stats(profiler)
    rows = []
    total_calls = 0
    for (filename, line, name), (_, ncalls, tottime, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        total_calls += ncalls
        rows.append((tottime, ncalls, f"{_stage(filename)}:{line}({name})"))
    rows.sort(reverse=True)
    print(f"calls per request (profiled functions): {total_calls / requests:.1f}")
    print("| function | calls/req | own µs/req (profiled) |")
    print("|---|---:|---:|")
    for tottime, ncalls, where in rows[:top]:
        print(f"| `{where}` | {ncalls / requests:.2f} | {tottime * 1e6 / requests:.1f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--protocols", default="http,grpc")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    print(f"perfkit {describe(['perfkit', 'v2kit'])}")
    with (
        tempfile.TemporaryDirectory() as tmp,
        reference_server_process(build_demo_repository(Path(tmp) / "m")) as server,
    ):
        for protocol in args.protocols.split(","):
            url = server.http_url if protocol == "http" else server.grpc_url
            requests, cpu = run(_load(url, protocol, args.concurrency, args.seconds, None))
            print(f"\n## {protocol}, concurrency {args.concurrency}: {requests / args.seconds:.0f} infer/s, "
                  f"client CPU {cpu * 1e6 / requests:.1f} µs/request (unprofiled)")  # fmt: skip
            profiler = cProfile.Profile()
            requests, cpu = run(_load(url, protocol, args.concurrency, args.seconds, profiler))
            _print_profile(profiler, requests, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
