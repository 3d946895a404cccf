"""Throughput by cores: the reference server, as one process and with front-end workers, next to
real Triton 2.51, each pinned to 1, 2, 4, ... CPUs, on the same ONNX MLP, measured by perf_analyzer.

    PERFKIT_PEERS=DIR python bench/cores.py [--cores 1,2,4,8] [--client-cpus 8-15]
        [-i http,grpc] [--concurrency 64] [--window-ms 1000] [--queue-delay-us 100] [--csv FILE]

For each core count K the servers are started one at a time, each with every process and thread
(our front-end workers, Triton's stubs) pinned to CPUs 0..K-1, while perf_analyzer and this script
run on --client-cpus only, so that the load generator never takes a server's core. Each server
gets the models of bench/server_vs_triton.py (`mlp_plain`, and `mlp_batching` with dynamic
batching), both with K KIND_CPU instances of one intra-op thread each, so that the instances alone
could use every core: Triton runs K stub processes, ours K sessions, on threads of its core process
or divided among its front-end workers. Ours is measured as one process (`--frontend-workers 1`)
and with K front-end workers (`--workers`), its instances in the workers (`--worker-instances
true`, the default) or all in the core process (`workers-core`).

Columns: perf_analyzer's infer/s and p50 at --concurrency, the server's CPU per request (its
process and children, over the whole perf_analyzer run, and its main process alone: where ours
schedules and runs every request, the bound of the worker layout), the ratio to Triton on the same cores,
and the gain over the same server on one core. Rows are also appended to --csv as they are made,
so that a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import Endpoint, machine, peers_dir, pin_tree
from server_vs_triton import VARIANTS, Settings, measure, write_repositories

from perfkit.target import reference_server_process
from perfkit.testing.triton import triton_server


@dataclass(frozen=True, slots=True)
class Row:
    cores: int
    server: str
    protocol: str
    model: str
    infer_per_s: float
    p50_us: float
    cpu_us: float  # the server's processes and threads, all of them
    main_cpu_us: float  # its main process alone: ours' core (models, batchers), Triton's tritonserver


def parse_cpus(text: str) -> list[int]:
    """`0-3,8` -> [0, 1, 2, 3, 8]."""
    cpus: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        cpus += range(int(first), int(last or first) + 1)
    return cpus


@dataclass(frozen=True, slots=True)
class Server:
    kind: str  # process, workers, workers-core or triton, as --servers names them
    frontend_workers: int = 1  # ours only

    @property
    def label(self) -> str:
        if self.kind == "triton":
            return "triton"
        if self.kind == "process":
            return "ours, 1 process"
        where = ", instances in core" if self.kind == "workers-core" else ""
        return f"ours, {self.frontend_workers} workers{where}"


def servers_for(cores: int, workers: list[int] | None, kinds: list[str]) -> list[Server]:
    """Of `kinds`: ours as one process, ours with each of `workers` front-end workers (default: one
    per core), and Triton."""
    counts = workers if workers is not None else ([cores] if cores > 1 else [])
    every = [
        Server("process"),
        *(Server(kind, n) for kind in ("workers", "workers-core") for n in counts if n > 1),
        Server("triton"),
    ]
    return [server for server in every if server.kind in kinds]


@contextlib.contextmanager
def started(server: Server, peers: Path, ours: Path, triton: Path, cpus: Sequence[int]) -> Iterator[Endpoint]:
    if server.kind == "triton":
        with triton_server(peers, triton) as process:
            endpoint = Endpoint(process.http_url, process.grpc_url, process.process.pid)
            pin_tree(endpoint.pid, cpus)
            yield endpoint
        return
    flags = ["--frontend-workers", str(server.frontend_workers)]
    if server.kind == "workers-core":
        flags += ["--worker-instances", "false"]
    with reference_server_process(ours, flags) as ours_process:
        endpoint = Endpoint(ours_process.http_url, ours_process.grpc_url, ours_process.process.pid)
        pin_tree(endpoint.pid, cpus)
        yield endpoint


def measure_server(
    server: Server,
    cores: int,
    peers: Path,
    ours: Path,
    triton: Path,
    protocols: list[str],
    args: argparse.Namespace,
    tmp: Path,
) -> list[Row]:
    rows: list[Row] = []
    with started(server, peers, ours, triton, list(range(cores))) as endpoint:
        name = "triton" if server.kind == "triton" else "ours"
        for model in VARIANTS:  # warm-up: sessions, stubs, connections
            measure(peers, endpoint, name, model, "http", args.concurrency, 300, tmp)
        for protocol in protocols:
            for model in VARIANTS:
                main_before = _own_cpu_s(endpoint.pid)
                run = measure(peers, endpoint, name, model, protocol, args.concurrency, args.window_ms, tmp)
                main_us = (_own_cpu_s(endpoint.pid) - main_before) / max(1, run.times.success_count) * 1e6
                row = Row(cores, server.label, protocol, model, run.infer_per_s, run.p50_us, run.cpu_us, main_us)
                print(f"  {row}", file=sys.stderr, flush=True)
                rows.append(row)
                if args.csv:
                    new = not args.csv.exists()
                    with args.csv.open("a", newline="") as handle:
                        writer = csv.DictWriter(handle, fieldnames=list(asdict(row)))
                        if new:
                            writer.writeheader()
                        writer.writerow(asdict(row))
    return rows


def _own_cpu_s(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def render(rows: list[Row]) -> str:
    by_key = {(r.cores, r.server, r.protocol, r.model): r for r in rows}
    one_core = {(r.server.split(",")[0], r.protocol, r.model): r.infer_per_s for r in rows if r.cores == 1}
    lines = [
        "| protocol | model | cores | server | infer/s | ratio to Triton | gain over 1 core | p50 us "
        "| server CPU us/req | of it, main process |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        triton = by_key.get((r.cores, "triton", r.protocol, r.model))
        base = one_core.get((r.server.split(",")[0], r.protocol, r.model))
        versus = f"{r.infer_per_s / triton.infer_per_s:.2f}" if triton and r.server != "triton" else ""
        gain = f"{r.infer_per_s / base:.2f}" if base else ""
        lines.append(
            f"| {r.protocol} | {r.model} | {r.cores} | {r.server} | {r.infer_per_s:.0f} | {versus} | {gain} "
            f"| {r.p50_us:.0f} | {r.cpu_us:.0f} | {r.main_cpu_us:.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cores", default="1,2", help="comma-separated core counts; servers get CPUs 0..K-1")
    parser.add_argument("--client-cpus", help="CPUs for perf_analyzer (default: every CPU no server gets)")
    parser.add_argument("-i", "--protocols", default="http,grpc")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--window-ms", type=int, default=1000, help="perf_analyzer -p")
    parser.add_argument("--max-batch-size", type=int, default=64)
    parser.add_argument("--queue-delay-us", type=int, default=100)
    parser.add_argument(
        "--servers",
        default="process,workers,triton",
        help="which of: process (ours, one), workers (ours, instances in the workers), workers-core (ours, "
        "instances in the core process), triton",
    )
    parser.add_argument("--workers", help="comma-separated front-end worker counts for ours (default: the cores)")
    parser.add_argument("--csv", type=Path, help="append each row here as it is measured")
    args = parser.parse_args(argv)
    core_counts = [int(c) for c in args.cores.split(",")]
    everything = sorted(os.sched_getaffinity(0))
    client_cpus = parse_cpus(args.client_cpus) if args.client_cpus else everything[max(core_counts) :]
    if not client_cpus:
        parser.error(f"no CPU left for perf_analyzer beside {max(core_counts)} server cores: give --client-cpus")
    os.sched_setaffinity(0, client_cpus)  # perf_analyzer inherits it; each server is pinned on its own
    peers = peers_dir()
    protocols = args.protocols.split(",")
    workers = [int(n) for n in args.workers.split(",")] if args.workers else None
    rows: list[Row] = []
    for cores in core_counts:
        settings = Settings(args.max_batch_size, cores, args.queue_delay_us, 1, 0)
        with tempfile.TemporaryDirectory() as tmp_name:
            tmp = Path(tmp_name)
            ours, triton = write_repositories(tmp, settings)
            for server in servers_for(cores, workers, args.servers.split(",")):
                print(f"{cores} cores: starting {server.label}", file=sys.stderr, flush=True)
                try:
                    rows += measure_server(server, cores, peers, ours, triton, protocols, args, tmp)
                except RuntimeError as exc:  # a peer that cannot start or answer here: the other rows still count
                    print(f"{cores} cores, {server.label}: skipped: {exc}", file=sys.stderr, flush=True)
    print()
    print(f"concurrency {args.concurrency}; perf_analyzer on CPUs {client_cpus}; {machine(peers)}")
    print()
    print(render(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
