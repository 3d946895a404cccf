"""The same hot paths from two source trees, side by side: did a change make the server or the client dearer?

    PERFKIT_PEERS=DIR python bench/ab_trees.py --baseline ../perfkit-old [--candidate .]
        [--protocols http,grpc] [--models identity,mlp] [--concurrency 8] [--rounds 3] [--window-ms 2000]

`--baseline` is another checkout of this repository (for example `git worktree add ../perfkit-old
COMMIT`); each tree runs with its own code (`PYTHONPATH=TREE`, working directory TREE), on this
environment's packages. The demo repository is built once and served by both.

Two tables, medians over `--rounds` alternating rounds (which tree goes first alternates too):

- Server: each tree's `python -m reference_server` on free loopback ports, measured by NVIDIA's
  perf_analyzer (the same binary for both) at each concurrency: infer/s from its CSV, and the server's
  CPU per request, which is the server process's user + system CPU over the run divided by the
  requests its statistics extension counted.
- Client: each tree's `python -m perfkit sweep` against one server (the candidate's), its CPU per
  request from RUSAGE_CHILDREN over the requests the server counted. This includes the fixed start-up
  cost of a run, the same kind for both trees, so compare the two, not the absolute figure.

A ratio is candidate / baseline: for infer/s above 1 is better, for CPU per request below 1 is better.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from _harness import machine, peers_dir, perf_analyzer, ratio, served_run, success_count, tree_cpu_s

from v2kit.demo import build_demo_repository

# The identity's input is FP32 [-1]: 1 KiB per request, as bench/client.py sends.
SHAPES = {"identity": ["--shape", "INPUT0:256"]}
_STARTED = re.compile(r"Started (HTTPService|GRPCInferenceService) at (\S+):(\d+)")


def tree_env(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(tree)}


@contextmanager
def server_of(tree: Path, repository: Path) -> Iterator[tuple[subprocess.Popen[str], dict[str, str]]]:
    """`python -m reference_server` of `tree` on free ports; yields the process and {"http"|"grpc": url}."""
    command = [
        sys.executable, "-m", "reference_server", "--model-repository", str(repository),
        "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0",
    ]  # fmt: skip
    process = subprocess.Popen(
        command, cwd=tree, env=tree_env(tree), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    urls: dict[str, str] = {}
    assert process.stdout is not None
    for line in process.stdout:
        found = _STARTED.search(line)
        if found:
            urls["http" if found.group(1) == "HTTPService" else "grpc"] = f"{found.group(2)}:{found.group(3)}"
        if len(urls) == 2:
            break
    else:
        raise RuntimeError(f"the server of {tree} exited before it listened ({process.wait()})")
    try:
        yield process, urls
    finally:
        process.terminate()
        process.wait(timeout=60)


def server_round(
    peers: Path, process: subprocess.Popen[str], urls: dict[str, str], model: str, protocol: str, level: int, window_ms: int
) -> tuple[float, float]:
    """(infer/s, server CPU µs per request) of one perf_analyzer run."""
    requests_before = success_count(urls["http"], model)
    cpu_before = tree_cpu_s(process.pid)
    with tempfile.TemporaryDirectory() as scratch:
        rows = perf_analyzer(
            peers, model, urls[protocol], Path(scratch) / "pa.csv",
            ["-i", protocol, "--concurrency-range", str(level), "-p", str(window_ms), "-s", "25", "-r", "10",
             *SHAPES.get(model, [])],
            attempts=3,
        )  # fmt: skip
    cpu_s = tree_cpu_s(process.pid) - cpu_before
    requests = success_count(urls["http"], model) - requests_before
    return float(rows[-1]["Inferences/Second"]), cpu_s / requests * 1e6


def client_round(tree: Path, urls: dict[str, str], pid: int, model: str, protocol: str, level: int, window_ms: int) -> float:
    """The CPU µs per request of `tree`'s perfkit sweeping one level."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch)
        # `env -C` so that each tree's own packages come first: `python -m` puts the working directory on sys.path.
        command = [
            "env", "-C", str(tree), f"PYTHONPATH={tree}",
            sys.executable, "-m", "perfkit", "sweep", "-m", model, "-u", urls[protocol], "-i", protocol,
            "--concurrency-range", str(level), "-p", str(window_ms), "-f", str(out / "perfkit.csv"),
            "--report-dir", str(out / "reports"), "--quiet", "--no-report", *SHAPES.get(model, []),
        ]  # fmt: skip
        run = served_run(command, urls["http"], model, pid, timeout_s=600)
    if run.timed.result.returncode not in (0, 3):  # 3: measured, but some window never met the stability rule
        raise RuntimeError(f"perfkit of {tree} failed:\n{run.timed.result.stdout}\n{run.timed.result.stderr}")
    return run.timed.cpu_s / run.server_requests * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path, required=True, help="another checkout of this repository")
    parser.add_argument("--candidate", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--protocols", default="http,grpc")
    parser.add_argument("--models", default="identity,mlp")
    parser.add_argument("--concurrency", default="8")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window-ms", type=int, default=2000)
    args = parser.parse_args()
    peers = peers_dir()
    trees = {"baseline": args.baseline.resolve(), "candidate": args.candidate.resolve()}
    protocols = args.protocols.split(",")
    models = args.models.split(",")
    levels = [int(c) for c in args.concurrency.split(",")]
    server: dict[tuple[str, str, int, str], list[tuple[float, float]]] = defaultdict(list)
    client: dict[tuple[str, str, int, str], list[float]] = defaultdict(list)
    print(machine(peers), file=sys.stderr)
    with tempfile.TemporaryDirectory() as scratch:
        repository = build_demo_repository(Path(scratch) / "models")
        with server_of(trees["baseline"], repository) as old, server_of(trees["candidate"], repository) as new:
            running = {"baseline": old, "candidate": new}
            for index in range(args.rounds):
                order = ["baseline", "candidate"] if index % 2 == 0 else ["candidate", "baseline"]
                for protocol in protocols:
                    for model in models:
                        for level in levels:
                            for name in order:
                                process, urls = running[name]
                                figures = server_round(peers, process, urls, model, protocol, level, args.window_ms)
                                server[(protocol, model, level, name)].append(figures)
                                cpu = client_round(trees[name], new[1], new[0].pid, model, protocol, level, args.window_ms)
                                client[(protocol, model, level, name)].append(cpu)
                                print(f"round {index + 1} {name} {protocol} {model} c{level}: "
                                      f"server {figures[0]:.0f} infer/s, {figures[1]:.0f} µs/req; client {cpu:.0f} µs/req",
                                      file=sys.stderr)  # fmt: skip
    print("| protocol | model | c | server infer/s, baseline → candidate | ratio "
          "| server CPU µs/req, baseline → candidate | ratio | client CPU µs/req, baseline → candidate | ratio |")
    print("|---|---|---:|---|---:|---|---:|---|---:|")
    for protocol in protocols:
        for model in models:
            for level in levels:
                old_rate, new_rate = (statistics.median(f[0] for f in server[(protocol, model, level, n)]) for n in trees)
                old_cpu, new_cpu = (statistics.median(f[1] for f in server[(protocol, model, level, n)]) for n in trees)
                old_client, new_client = (statistics.median(client[(protocol, model, level, n)]) for n in trees)
                print(f"| {protocol} | {model} | {level} | {old_rate:.0f} → {new_rate:.0f} | {ratio(new_rate, old_rate)} "
                      f"| {old_cpu:.0f} → {new_cpu:.0f} | {ratio(new_cpu, old_cpu)} "
                      f"| {old_client:.0f} → {new_client:.0f} | {ratio(new_client, old_client)} |")  # fmt: skip


if __name__ == "__main__":
    main()
