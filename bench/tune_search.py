"""Brute vs quick vs bayesian search of `perfkit tune` on the demo MLP (bundled server): the best
objective each finds, their ratio, and how many variant measurements each took.

Quick search should land within 5 % of brute's best while measuring far fewer variants
(model_analyzer claims > 95 % of the best objective from < 10 % of the space); bayesian search
(optuna's TPE, `--search-budget`) spends a fixed number of measurements. Two ratios are printed:
a search's best as it measured it over brute's best as brute measured it (what a user of either
sees), and brute's own measurement of the search's pick over brute's best (no run-to-run noise:
did the search find the right configuration?). A second table is best found against measurements
spent: the best first-pass throughput among each search's first k variants, in its own order.

    python bench/tune_search.py [--max-instance-count 2] [--max-batch-size 16] [--window-ms 500]
                                [--search-budget 8] [--seed 0]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from perfkit.measure.level import WindowSpec
from perfkit.tune.objectives import Objective
from perfkit.tune.search import SpaceSpec
from perfkit.tune.state import TuneResult, TuneSpec
from perfkit.tune.tuner import one_server_tuner, run_tune
from v2kit.demo import build_demo_repository


def throughput(result: TuneResult, key: str, combined: bool = True) -> float:
    record = result.records[key]
    figures = record.combined() if combined else record.figures()
    return figures["throughput"].value if figures else 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-instance-count", type=int, default=2)
    parser.add_argument("--max-batch-size", type=int, default=16)
    parser.add_argument("--batching-delays-us", default="0")
    parser.add_argument("--concurrency-range", default="1:16")
    parser.add_argument("--window-ms", type=float, default=500.0)
    parser.add_argument("--stability-percentage", type=float, default=15.0)
    parser.add_argument("--search-budget", type=int, default=0, help="bayesian: variants (default: a quarter, >= 8)")
    parser.add_argument("--seed", type=int, default=0, help="bayesian: the sampler's seed")
    args = parser.parse_args(argv)
    start, end = (int(x) for x in args.concurrency_range.split(":"))
    delays = tuple(int(x) for x in args.batching_delays_us.split(","))
    results: dict[str, tuple[TuneResult, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        config = build_demo_repository(Path(tmp) / "models") / "mlp" / "config.pbtxt"
        for search in ("brute", "quick", "bayesian"):
            spec = TuneSpec(
                config_path=config,
                search=search,
                objective=Objective(),
                concurrency=(start, end),
                space=SpaceSpec(max_instances=args.max_instance_count, max_batch=args.max_batch_size, delays_us=delays),
                windows=WindowSpec(
                    interval_ms=args.window_ms, stability_pct=args.stability_percentage, warmup_request_count=20
                ),
                quiet=True,
                budget=args.search_budget if search == "bayesian" else 0,
                seed=args.seed,
            )
            print(f"{search} search ...", file=sys.stderr, flush=True)
            began = time.monotonic()
            result, code = run_tune(spec, lambda _: None, Path(tmp) / f"{search}-checkpoint.json", one_server_tuner)
            if result is None or result.ranking is None or result.ranking.leader is None:
                print(f"{search} search did not finish (exit code {code})", file=sys.stderr)
                return 1
            results[search] = (result, time.monotonic() - began)

    brute, quick = results["brute"][0], results["quick"][0]
    assert brute.ranking is not None and quick.ranking is not None
    brute_best = throughput(brute, brute.ranking.leader or "")
    print(f"demo MLP, grid of {brute.space.size} variants plus the default config, concurrency {start}:{end}, "
          f"{args.window_ms:g} ms windows, objective: throughput")  # fmt: skip
    print()
    print("| search | variants measured | load levels measured | best variant (leader) | best infer/s | "
          "ratio to brute | brute's measurement of it, ratio | recommended | wall time |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for search, (result, wall) in results.items():
        assert result.ranking is not None
        leader = result.ranking.leader or ""
        own = throughput(result, leader)
        cross = throughput(brute, leader, combined=leader in brute.leaders) if leader in brute.records else 0.0
        levels = sum(len(r.levels) + len(r.remeasures) for r in result.records.values())
        print(f"| {search} | {len(result.records)} | {levels} | {leader} | {own:.0f} | "
              f"{own / brute_best:.3f} | {cross:.0f}, {cross / brute_best:.3f} | {result.ranking.best} | {wall:.0f} s |")  # fmt: skip
    print()
    print(best_so_far(results))
    return 0


def best_so_far(results: dict[str, tuple[TuneResult, float]]) -> str:
    """Markdown: each search's best first-pass throughput among its first k variants."""
    spent = sorted({k for r, _ in results.values() for k in (2, 4, 8, 12, 16, len(r.records)) if k <= len(r.records)})
    lines = ["| search | " + " | ".join(f"after {k}" for k in spent) + " |", "|---|" + "---|" * len(spent)]
    for search, (result, _) in results.items():
        firsts = [throughput(result, key, combined=False) for key in result.records]
        cells = [f"{max(firsts[:k]):.0f}" if k <= len(firsts) else "" for k in spent]
        lines.append(f"| {search} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
