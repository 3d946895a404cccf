"""Does `perfkit sweep --workers N` lift a client-bound throughput? The same closed-loop level from
1 and from N load workers (Ray actors on a local runtime) against the canned server, a KServe v2
responder that costs next to nothing per request while every answer carries `--output-elements`
FP32 values as JSON, so the client, which parses each answer, is the bottleneck by design.

    .venv/bin/python bench/distributed.py [--workers 1,2] [--concurrency 8] [--output-elements 8192]
        [--repeats 3] [--window-ms 1000]

Worker counts alternate within each repeat, so slow drifts of the machine's load hit every count.
`client CPU %` is each worker's process over the level (of one core): near 100 % is client-bound.

Figures (2-core VM shared with four other engineers' test runs, load average 5-10;
`bench/distributed.py`, defaults: concurrency 8, 8192 output elements, three 1 s windows):

| repeat | workers | infer/s | 95% CI | worker CPU % | vs 1 worker |
|---|---|---|---|---|---|
| 1 | 1 | 2518 | 1920 – 3115 | in-process | 1.00 |
| 1 | 2 | 2719 | 2047 – 3392 | 36, 65 | 1.08 |
| 2 | 1 | 2141 | 862 – 3488 | in-process | 1.00 |
| 2 | 2 | 2384 | 2332 – 2436 | 44, 45 | 1.11 |
| 3 | 1 | 2044 | 887 – 3335 | in-process | 1.00 |
| 3 | 2 | 2557 | 2452 – 2663 | 42, 55 | 1.25 |

An earlier run of the same measurement a minute before gave 1.06, 1.92 and 1.87 (workers at
51-92 % of a core). A single Ray worker at concurrency 4 ran at 87 % of a core (2425 infer/s, the
in-process client 1999), two at concurrency 8 at 44 and 46 % (2423 infer/s): on two cores, the two
workers, the canned server (which writes ~40 KB per answer) and the driver share the cores, so the
gain is capped well below 2x and swings with whatever else the machine runs. That spread is why
this is a benchmark and not a test; on a machine with idle cores (or workers on other machines via
--ray-address) the workers' CPU column should read near 100.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from perfkit.load.cluster.distributed import DistributedSpec
from perfkit.measure.level import WindowSpec
from perfkit.results.model import LevelResult
from perfkit.sweep.run import run_sweep
from perfkit.sweep.spec import LoadSpec, OutputSpec, SweepSpec
from perfkit.target import TargetSpec
from perfkit.testing.canned_server import MODEL, canned_server_process


def measure(url: str, workers: int, concurrency: int, window_ms: int, report_dir: Path) -> LevelResult:
    spec = SweepSpec(
        target=TargetSpec(url=url, model=MODEL),
        load=LoadSpec("concurrency", concurrency, concurrency),
        windows=WindowSpec(interval_ms=window_ms, stability_pct=1000, max_trials=3),
        output=OutputSpec(report_dir=report_dir, html_report=False, quiet=True),
        distributed=DistributedSpec(workers=workers),
    )
    run, _ = run_sweep(spec, ["sweep", "--workers", str(workers)])
    assert run.result is not None and run.result.levels, run.result
    return run.result.levels[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", default="1,2", help="worker counts to compare, comma-separated")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--output-elements", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--window-ms", type=int, default=1000)
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.workers.split(",")]
    import ray

    # One runtime for every run (each sweep would otherwise start and stop its own).
    ray.init(
        address="local", num_cpus=max(max(counts), 2), include_dashboard=False, log_to_driver=False,
        configure_logging=False, object_store_memory=80 * 1024 * 1024,
    )  # fmt: skip
    rows = ["| repeat | workers | infer/s | 95% CI | worker CPU % | vs 1 worker |", "|---|---|---|---|---|---|"]
    try:
        with tempfile.TemporaryDirectory() as tmp, canned_server_process(args.output_elements) as url:
            for repeat in range(1, args.repeats + 1):
                base: float | None = None
                for n in counts:
                    level = measure(url, n, args.concurrency, args.window_ms, Path(tmp) / f"{repeat}-{n}")
                    base = base or level.throughput_infer_per_s
                    cpu = ", ".join(f"{w.cpu_pct:.0f}" for w in level.workers if w.cpu_pct is not None)
                    rows.append(
                        f"| {repeat} | {n} | {level.throughput_infer_per_s:.0f} | {level.throughput_ci_low:.0f} – "
                        f"{level.throughput_ci_high:.0f} | {cpu or 'in-process'} | "
                        f"{level.throughput_infer_per_s / base:.2f} |"
                    )
                    print(rows[-1], file=sys.stderr, flush=True)
    finally:
        ray.shutdown()
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
