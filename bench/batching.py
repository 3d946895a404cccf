"""Does dynamic batching pay on the reference server? Real perf_analyzer measures the demo MLP with
batching off/on and 1/2 instances, each variant loaded into one running server through the
repository load API with a config override.

    PERFKIT_PEERS=DIR python bench/batching.py [--concurrency 8] [--window-ms 3000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import get_json, load_model, peers_dir, perf_analyzer

from perfkit.target import reference_server_process
from v2kit.demo import build_demo_repository

VARIANTS = [
    ("no batching, 1 instance", 1, False),
    ("dynamic batching, 1 instance", 1, True),
    ("no batching, 2 instances", 2, False),
    ("dynamic batching, 2 instances", 2, True),
]


def variant_config(base: dict[str, object], instances: int, batching: bool) -> dict[str, object]:
    config = {k: v for k, v in base.items() if k not in ("dynamic_batching", "instance_group")}
    config["instance_group"] = [{"count": instances, "kind": "KIND_CPU"}]
    if batching:
        config["dynamic_batching"] = {}
    return config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--window-ms", type=int, default=3000)
    args = parser.parse_args(argv)
    peers = peers_dir()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        repository = build_demo_repository(Path(tmp) / "models")
        with reference_server_process(
            repository, ("--model-control-mode", "explicit", "--load-model", "mlp")
        ) as server:
            base = get_json(f"http://{server.http_url}/v2/models/mlp/config")
            assert isinstance(base, dict)
            for label, instances, batching in VARIANTS:
                load_model(server.http_url, "mlp", variant_config(base, instances, batching))
                print(f"measuring: {label} ...", file=sys.stderr, flush=True)
                (row,) = perf_analyzer(
                    peers,
                    "mlp",
                    server.http_url,
                    Path(tmp) / "pa.csv",
                    ["--concurrency-range", str(args.concurrency), "-p", str(args.window_ms), "-s", "15", "-r", "10"],
                )
                rows.append((label, row))
    baseline = float(rows[0][1]["Inferences/Second"])
    print(f"\nreference server, demo MLP (256-1024-1024-10, fp32), perf_analyzer concurrency {args.concurrency}\n")
    print("| variant | infer/s | vs no batching, 1 inst | p50 ms | p99 ms | server queue us | compute infer us |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, row in rows:
        throughput = float(row["Inferences/Second"])
        print(
            f"| {label} | {throughput:.0f} | {throughput / baseline:.2f}x | {int(row['p50 latency']) / 1000:.2f} "
            f"| {int(row['p99 latency']) / 1000:.2f} | {row['Server Queue']} | {row['Server Compute Infer']} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
