"""A sequence model (Triton's sequence batcher): the reference server next to real Triton 2.51 on the
same model folder, both measured by real perf_analyzer with `--sequence-length`.

    PERFKIT_PEERS=DIR python bench/sequence_vs_triton.py [-i http|grpc] [--streaming]
        [--concurrency 1,4,16] [--window-ms 2000] [--sequence-length 20] [--stability 25]

The model is the python-backend accumulator of `perfkit.testing.sequence_models` (INT32 [1]; START,
END, READY and a UINT64 CORRID filled in by the batcher; the model keeps a total per CORRID), with
max_batch_size 16 and the direct strategy: 16 sequence slots on one instance, so every concurrency up
to 16 holds one slot per concurrent sequence. perf_analyzer sends zeros (`--input-data zero`) so the
totals cannot overflow. Per concurrency: infer/s, p50 and p99 (perf_analyzer's CSV), the server's
request time per request (statistics extension) and the server's CPU per request (process and python
stubs). Goal: ours no worse than Triton's.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import Endpoint, both_servers, machine, peers_dir, perf_analyzer, ratio, server_times, tree_cpu_s

from perfkit.testing.sequence_models import write_accumulator

SERVERS = ("ours", "triton")
MODEL = "accumulator"


def measure(
    peers: Path, endpoint: Endpoint, protocol: str, streaming: bool, concurrency: int, window_ms: int, length: int,
    tmp: Path, stability: int = 25,
) -> dict[str, float]:  # fmt: skip
    url = endpoint.http_url if protocol == "http" else endpoint.grpc_url
    args = ["-i", protocol, *(["--streaming"] if streaming else []), "--sequence-length", str(length),
            "--input-data", "zero", "--concurrency-range", str(concurrency), "-p", str(window_ms), "-s",
            str(stability), "-r", "10"]  # fmt: skip
    before = server_times(endpoint.http_url, MODEL)
    cpu_before = tree_cpu_s(endpoint.pid)
    (row,) = perf_analyzer(peers, MODEL, url, tmp / "pa.csv", args, attempts=3)
    cpu_s = tree_cpu_s(endpoint.pid) - cpu_before
    times = server_times(endpoint.http_url, MODEL) - before
    count = times.success_count or 1
    return {
        "infer_per_s": float(row["Inferences/Second"]),
        "p50_us": float(row["p50 latency"]),
        "p99_us": float(row["p99 latency"]),
        "request_us": times.per_request_us("request_ns"),
        "cpu_us": cpu_s / count * 1e6,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-i", "--protocol", choices=("http", "grpc"), default="grpc")
    parser.add_argument("--streaming", action="store_true", help="perf_analyzer --streaming (gRPC only)")
    parser.add_argument("--concurrency", default="1,4,16", help="comma-separated levels")
    parser.add_argument("--window-ms", type=int, default=2000, help="perf_analyzer -p")
    parser.add_argument("--sequence-length", type=int, default=20)
    parser.add_argument("--stability", type=int, default=25, help="perf_analyzer -s (percent); more on a busy machine")
    args = parser.parse_args(argv)
    if args.streaming and args.protocol != "grpc":
        parser.error("--streaming needs -i grpc")
    peers = peers_dir()
    levels = [int(c) for c in args.concurrency.split(",")]
    results: dict[tuple[str, int], dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        repository = tmp / "repository"
        write_accumulator(repository, MODEL, max_batch_size=16)
        with both_servers(peers, repository, repository) as endpoints:
            for server in SERVERS:  # warm-up: stubs, connections
                measure(peers, endpoints[server], args.protocol, args.streaming, max(levels), 500, 5, tmp)
            for step, concurrency in enumerate(levels):
                # Alternate which server goes first, so that neither always follows the same one.
                for server in SERVERS if step % 2 == 0 else SERVERS[::-1]:
                    print(f"measuring: {server} c={concurrency} ...", file=sys.stderr, flush=True)
                    results[(server, concurrency)] = measure(
                        peers, endpoints[server], args.protocol, args.streaming, concurrency, args.window_ms,
                        args.sequence_length, tmp, args.stability,
                    )  # fmt: skip
    mode = f"-i {args.protocol}" + (" --streaming" if args.streaming else "")
    lines = [
        f"python-backend accumulator (sequence_batching direct, max_batch_size 16), reference server vs Triton "
        f"2.51, same model folder, perf_analyzer {mode} --sequence-length {args.sequence_length} "
        f"-p {args.window_ms} -s {args.stability} -r 10; {machine(peers)}",
        "",
        "| concurrency | infer/s ours | infer/s Triton | p50 us ours | p50 us Triton | p99 us ours | p99 us Triton "
        "| request us/req ours | request us/req Triton | server CPU us/req ours | server CPU us/req Triton "
        "| CPU ratio (<= 1) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for concurrency in levels:
        ours, triton = results[("ours", concurrency)], results[("triton", concurrency)]
        lines.append(
            f"| {concurrency} | {ours['infer_per_s']:.0f} | {triton['infer_per_s']:.0f} | {ours['p50_us']:.0f} | "
            f"{triton['p50_us']:.0f} | {ours['p99_us']:.0f} | {triton['p99_us']:.0f} | {ours['request_us']:.0f} | "
            f"{triton['request_us']:.0f} | {ours['cpu_us']:.0f} | {triton['cpu_us']:.0f} | "
            f"{ratio(ours['cpu_us'], triton['cpu_us'])} |"
        )
    print()
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
