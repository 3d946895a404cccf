"""Client CPU per request in sequence mode: perfkit next to NVIDIA's perf_analyzer, both sweeping the
python accumulator (a sequence model, `perfkit.testing.sequence_models`) on one reference server,
with the same flags (`--sequence-length 20 --input-data zero`), over HTTP and gRPC.

    PERFKIT_PEERS=DIR python bench/sequence_client.py [--concurrency 4] [--requests 4000] [--protocols http,grpc]

How: each tool runs as a child process, twice per protocol, sending `--request-count` --requests / 4
and then --requests requests, and its CPU is the RUSAGE_CHILDREN delta around each run; the server
counts the requests (statistics extension). CPU per request is the slope between the two runs,
(CPU long - CPU short) / (requests long - requests short), so the start-up cost of each tool (the
interpreter and imports for perfkit) drops out. Throughput and p50 are each tool's own figures of
the long run.
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import machine, peers_dir, perfkit_command, ratio, served_run

from perfkit.target import reference_server_process
from perfkit.testing.sequence_models import write_accumulator

MODEL = "accumulator"
TOOLS = ("perfkit", "perf_analyzer")


@dataclass(frozen=True, slots=True)
class Run:
    requests: int
    cpu_s: float
    infer_per_s: float
    p50_us: float


def run(tool: str, peers: Path, url: str, http_url: str, pid: int, protocol: str, flags: list[str], tmp: Path) -> Run:
    out = Path(tempfile.mkdtemp(dir=tmp))
    if tool == "perf_analyzer":
        command = [str(peers / "bin" / "perf_analyzer"), "-m", MODEL, "-u", url, "-i", protocol, *flags,
                   "-f", str(out / "out.csv")]  # fmt: skip
    else:
        command = perfkit_command(url, MODEL, protocol, flags, out)
        command[command.index("-f") + 1] = str(out / "out.csv")
    served = served_run(command, http_url, MODEL, pid, timeout_s=300)
    rows = list(csv.DictReader((out / "out.csv").open())) if (out / "out.csv").exists() else []
    if not rows:
        print(f"{tool} exited {served.timed.result.returncode}:\n{served.timed.result.stderr[-800:]}", file=sys.stderr)
    row = rows[0] if rows else {}
    return Run(served.server_requests, served.timed.cpu_s, float(row.get("Inferences/Second", "nan")),
               float(row.get("p50 latency", "nan")))  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--protocols", default="http,grpc")
    args = parser.parse_args(argv)
    peers = peers_dir()
    rows = []
    with tempfile.TemporaryDirectory() as tmp_text:
        tmp = Path(tmp_text)
        repository = tmp / "models"
        write_accumulator(repository, MODEL, max_batch_size=16)
        with reference_server_process(repository) as server:
            for protocol in args.protocols.split(","):
                url = server.http_url if protocol == "http" else server.grpc_url
                for tool in TOOLS:
                    runs = []
                    for count in (args.requests // 4, args.requests):
                        flags = ["--sequence-length", "20", "--input-data", "zero", "--concurrency-range",
                                 str(args.concurrency), "--request-count", str(count)]  # fmt: skip
                        runs.append(run(tool, peers, url, server.http_url, server.process.pid, protocol, flags, tmp))
                    short, long = runs
                    extra = long.requests - short.requests
                    per_request_us = (long.cpu_s - short.cpu_s) / extra * 1e6 if extra > 0 else float("nan")
                    rows.append((protocol, tool, long.infer_per_s, long.p50_us, per_request_us))
    print(f"Sequence mode, accumulator, concurrency {args.concurrency}, --sequence-length 20; {machine(peers)}\n")
    print("| protocol | tool | infer/s | p50 ms | client CPU µs/request | perfkit / perf_analyzer CPU |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for protocol, tool, infer, p50, cpu in rows:
        pa = next(r[4] for r in rows if r[0] == protocol and r[1] == "perf_analyzer")
        share = ratio(cpu, pa) if tool == "perfkit" else ""
        print(f"| {protocol} | {tool} | {infer:.0f} | {p50 / 1000:.2f} | {cpu:.0f} | {share} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
