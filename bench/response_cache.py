"""What does the response cache save? Real perf_analyzer measures the demo MLP on the reference server
three ways, all in one server started with --cache-config:

- `mlp`, no cache: the model runs every request (the same input every time);
- `mlp_cached` (the same model with `response_cache { enable: true }`), the same input every time:
  after the first request every one is a hit, answered without queueing or running;
- `mlp_cached`, a different input each request (a JSON file of --distinct inputs cycled through, more
  than the cache holds, so least-recently-used eviction makes every request a miss): the model runs
  and the cache adds its lookup and insertion.

Real Triton is not beside it: the peers' tritonserver 2.51 has no local cache library
(`--cache-config local,size=...` fails with "unable to find 'libtritoncache_local.so' for cache").

    PERFKIT_PEERS=DIR python bench/response_cache.py [--concurrency 1 8] [--window-ms 2000]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import get_json, machine, peers_dir, perf_analyzer

from perfkit.target import reference_server_process
from reference_server.core.response_cache import entry_bytes
from v2kit.demo import build_demo_repository

#: What one MLP response (10 FP32 values) costs in the cache, bookkeeping included.
RESPONSE_BYTES = entry_bytes({"OUTPUT0": np.zeros((1, 10), np.float32)})


def cached_copy(repository: Path) -> None:
    target = repository / "mlp_cached"
    shutil.copytree(repository / "mlp", target)
    config = target / "config.pbtxt"
    text = config.read_text().replace('name: "mlp"', 'name: "mlp_cached"')
    config.write_text(text + "\nresponse_cache { enable: true }\n")


def distinct_inputs(path: Path, count: int) -> None:
    rng = np.random.default_rng(7)
    data = [{"INPUT0": rng.standard_normal(256).astype(np.float32).round(4).tolist()} for _ in range(count)]
    path.write_text(json.dumps({"data": data}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--window-ms", type=int, default=2000)
    parser.add_argument("--distinct", type=int, default=1000, help="inputs cycled through for the misses")
    args = parser.parse_args(argv)
    peers = peers_dir()
    # Room for a tenth of the distinct inputs: cycling through all of them, LRU evicts each before it returns.
    cache_bytes = RESPONSE_BYTES * args.distinct // 10
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        repository = build_demo_repository(Path(tmp) / "models")
        cached_copy(repository)
        inputs = Path(tmp) / "distinct.json"
        distinct_inputs(inputs, args.distinct)
        extra = ("--model-control-mode", "explicit", "--load-model", "mlp", "--load-model", "mlp_cached",
                 "--cache-config", f"local,size={cache_bytes}")  # fmt: skip
        with reference_server_process(repository, extra) as server:
            variants = [
                ("mlp, no cache", "mlp", []),
                ("mlp_cached, same input (hits)", "mlp_cached", []),
                ("mlp_cached, distinct inputs (misses)", "mlp_cached", ["--input-data", str(inputs)]),
            ]
            for concurrency in args.concurrency:
                for label, model, flags in variants:
                    print(f"measuring: {label}, concurrency {concurrency} ...", file=sys.stderr, flush=True)
                    (row,) = perf_analyzer(
                        peers, model, server.http_url, Path(tmp) / "pa.csv",
                        ["--concurrency-range", str(concurrency), "-p", str(args.window_ms), "-s", "40", "-r", "10",
                         *flags],
                        attempts=3,
                    )  # fmt: skip
                    rows.append((concurrency, label, row))
            stats = get_json(f"http://{server.http_url}/v2/models/mlp_cached/stats")
    assert isinstance(stats, dict)
    inference = stats["model_stats"][0]["inference_stats"]
    print(f"\n{machine(peers)}")
    print(f"reference server, demo MLP (256-1024-1024-10, fp32), HTTP, --cache-config local,size={cache_bytes}\n")
    print("| concurrency | variant | infer/s | p50 ms | p99 ms | server queue us | compute infer us "
          "| cache hit us | cache miss us |")  # fmt: skip
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for concurrency, label, row in rows:
        print(
            f"| {concurrency} | {label} | {float(row['Inferences/Second']):.0f} | {int(row['p50 latency']) / 1000:.2f} "
            f"| {int(row['p99 latency']) / 1000:.2f} | {row['Server Queue']} | {row['Server Compute Infer']} "
            f"| {row.get('Server Cache Hit', '-')} | {row.get('Server Cache Miss', '-')} |"
        )
    print(
        f"\nmlp_cached over the whole run: {inference['cache_hit']['count']} hits, "
        f"{inference['cache_miss']['count']} misses"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
