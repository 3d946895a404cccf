"""Where one request's server time goes: calls and µs per stage, from cProfile, under perf_analyzer.

    PERFKIT_PEERS=DIR python bench/profile_request.py [--model py_identity_plain|mlp]
        [--protocol http|grpc] [--concurrency 8] [--seconds 6] [--top 25]

Starts perfkit-server (as installed: compiled, or interpreted with PERFKIT_PURE_PYTHON=1) under
cProfile, switched on (SIGUSR1) only while perf_analyzer drives it and dumped (SIGUSR2) after, so
startup is left out. The profile covers the server process's main thread (the event loop: front
ends, data plane, scheduler, the python backend's side of the stub crossing); the stub process and
the ONNX Runtime threads are not in it. Per request, divided by the requests the statistics
extension counted in that time: the calls, and the time by stage (each function's own time,
`tottime`, attributed to the stage of the file it is in). cProfile's per-call cost inflates the
µs, more for code with many small calls, so read the stages against each other and the calls as
exact. Compiled modules are invisible to cProfile (their functions are C): their time shows in
their interpreted callers' own time, and their calls are not counted.
"""

from __future__ import annotations

import argparse
import os
import pstats
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from _harness import machine, peers_dir, success_count
from compiled import identity_repository

from perfkit.target import _stop, _wait_for_listeners
from v2kit.demo import ensure_demo_repository

#: The server under cProfile: on at SIGUSR1, off and written to argv[1] at SIGUSR2.
_PROFILED_SERVER = """
import cProfile, signal, sys
profile, out = cProfile.Profile(), sys.argv.pop(1)
signal.signal(signal.SIGUSR1, lambda *_: profile.enable())
def dump(*_):
    profile.disable()
    profile.dump_stats(out)
signal.signal(signal.SIGUSR2, dump)
from reference_server.__main__ import main
sys.exit(main())
"""

#: Stages by where a function's file is, first match wins; the rest is "other".
STAGES = (
    ("http front end", "reference_server/frontends/http/"),
    ("grpc front end", "reference_server/frontends/grpc/"),
    ("front end (shared)", "reference_server/frontends/"),
    ("h2 engine", "v2kit/h2/"),
    ("codec, tensors", "v2kit/codec"),
    ("codec, tensors", "v2kit/tensors"),
    ("data plane", "reference_server/core/"),
    ("scheduler", "reference_server/scheduling/"),
    ("python backend crossing", "reference_server/backends/python/"),
    ("onnx backend", "reference_server/backends/"),
    ("asyncio", "asyncio/"),
    ("uvloop", "uvloop"),
    ("numpy", "numpy/"),
    ("builtins", "~"),
)


def stage_of(filename: str) -> str:
    return next((stage for stage, part in STAGES if part in filename), "other")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="py_identity_plain", help="py_identity_plain or a demo model (mlp)")
    parser.add_argument("--protocol", default="http", choices=("http", "grpc"))
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--top", type=int, default=25, help="functions listed by own time")
    args = parser.parse_args()
    peers = peers_dir()
    with tempfile.TemporaryDirectory() as scratch:
        if args.model == "py_identity_plain":
            repository = identity_repository(Path(scratch) / "models")
        else:
            repository = ensure_demo_repository()
        out = Path(scratch) / "server.prof"
        log_path = Path(scratch) / "server.log"
        command = [
            sys.executable, "-c", _PROFILED_SERVER, str(out), "--model-repository", str(repository),
            "--host", "127.0.0.1", "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0",
            "--model-control-mode", "explicit", "--load-model", args.model,
        ]  # fmt: skip
        with log_path.open("w") as log:
            process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True)
        try:
            ports = _wait_for_listeners(process, log_path, 180)
            http_url, grpc_url = f"127.0.0.1:{ports['HTTPService']}", f"127.0.0.1:{ports['GRPCInferenceService']}"
            load = [
                str(peers / "bin" / "perf_analyzer"), "-m", args.model, "-i", args.protocol,
                "-u", http_url if args.protocol == "http" else grpc_url,
                "--concurrency-range", str(args.concurrency), "-p", str(int(args.seconds * 1000)),
                "-s", "1000", "--max-trials", "3",
            ]  # fmt: skip
            analyzer = subprocess.Popen(load, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(2.0)  # past the warm-up: connections made, model warm
            before = success_count(http_url, args.model)
            os.kill(process.pid, signal.SIGUSR1)
            time.sleep(args.seconds)
            os.kill(process.pid, signal.SIGUSR2)
            requests = success_count(http_url, args.model) - before
            analyzer.terminate()
            analyzer.wait()
            deadline = time.monotonic() + 30
            while not out.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(0.5)  # the dump is written in one go; let it finish
            stats = pstats.Stats(str(out))
        finally:
            _stop(process, 60)
    report(stats, requests, args)


def report(stats: pstats.Stats, requests: int, args: argparse.Namespace) -> None:
    raw = stats.stats  # type: ignore[attr-defined]  # {(file, line, name): (cc, nc, tt, ct, callers)}
    by_stage: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for (filename, _, _), (_, calls, own_s, _, _) in raw.items():
        cell = by_stage[stage_of(filename)]
        cell[0] += calls
        cell[1] += own_s
    total_calls = sum(c for c, _ in by_stage.values())
    total_s = sum(s for _, s in by_stage.values())
    print(f"{machine()}; {args.model} over {args.protocol}, c={args.concurrency}, {requests} requests profiled\n")
    print(f"calls per request: {total_calls / requests:.0f}; profiled µs per request: {total_s / requests * 1e6:.0f}\n")
    print("| stage | calls/req | µs/req (own time) | share |")
    print("|---|---|---|---|")
    for stage, (calls, own_s) in sorted(by_stage.items(), key=lambda item: -item[1][1]):
        print(f"| {stage} | {calls / requests:.1f} | {own_s / requests * 1e6:.1f} | {own_s / total_s:.0%} |")
    print(f"\ntop {args.top} functions by own time (calls/req, µs/req):")
    rows = sorted(raw.items(), key=lambda item: -item[1][2])[: args.top]
    for (filename, line, name), (_, calls, own_s, _, _) in rows:
        where = filename.split("/work/")[-1].split("site-packages/")[-1]
        print(f"  {calls / requests:6.1f} {own_s / requests * 1e6:7.1f}  {where}:{line} {name}")


if __name__ == "__main__":
    main()
