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
    python bench/tune_search.py --synthetic [--seeds 20]

`--synthetic` runs the three policies, with no server, on a noise-free model of the MLP's
throughput over a 160-variant grid (instances contend past the cores; batching gains with the
batch size, then thrashes; the queue delay adds a little) with 1 to 4 cores: the same comparison
without the run-to-run noise of a shared machine, averaged over bayesian seeds.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

from perfkit.measure.level import WindowSpec
from perfkit.tune.bayesian import bayesian_search
from perfkit.tune.objectives import Estimate, Objective
from perfkit.tune.search import brute_search, quick_search
from perfkit.tune.space import Batching, SpaceSpec, Variant, build_space
from perfkit.tune.state import TuneResult, TuneSpec
from perfkit.tune.tuner import one_server_tuner, run_tune
from v2kit.demo import build_demo_repository


def throughput(result: TuneResult, key: str, combined: bool = True) -> float:
    record = result.records[key]
    figures = record.combined() if combined else record.figures()
    return figures["throughput"].value if figures else 0.0


def synthetic_throughput(variant: Variant, cores: int) -> float:
    """The MLP-like landscape of tests/unit/test_search.py::mlp_like."""
    instances = min(variant.instance_count, cores) - 0.15 * max(0, variant.instance_count - cores)
    if variant.batching is None:
        return 500.0 * instances
    b = variant.max_batch_size
    return 500.0 * instances * (1 + math.log2(b)) * (0.97 ** max(0, b - 16)) * (1 + variant.batching.delay_us / 5000)


def synthetic(seeds: int) -> int:
    """Best found (as a share of the grid's best) after k measurements, per search, on the landscape."""
    space = build_space(SpaceSpec(delays_us=(0, 100, 500)), Variant(1, 64, Batching(100)))
    default = Variant(1, 64, Batching(100))
    spent = (4, 8, 12, 16, 24, 32, 40)
    print(f"synthetic MLP-like landscape, grid of {space.size} variants plus the default; best found / grid's best")
    print()
    print("| cores | search | measured | " + " | ".join(f"within {k}" for k in spent) + " | at the end |")
    print("|---|---|---:|" + "---:|" * (len(spent) + 1))
    for cores in (1, 2, 3, 4):
        top = max(synthetic_throughput(space.variant(c), cores) for c in space.coordinates())
        runs: dict[str, list[list[float]]] = {"brute": [], "quick": [], "bayesian": []}
        for search in runs:
            for seed in range(seeds if search == "bayesian" else 1):
                if search == "brute":
                    policy = brute_search(space, default)
                elif search == "quick":
                    policy = quick_search(space, default, Objective())
                else:
                    policy = bayesian_search(space, default, Objective(), seed=seed)
                found, variant = [], next(policy)
                while True:
                    tp = synthetic_throughput(variant, cores)
                    found.append(max(tp, found[-1] if found else 0.0))
                    try:
                        variant = policy.send({"throughput": Estimate.exact(tp)})
                    except StopIteration:
                        break
                runs[search].append(found)
        for search, found in runs.items():
            measured = sum(len(f) for f in found) / len(found)
            # Within k measurements: a search that stopped before k keeps what it found.
            cells = [f"{sum(f[min(k, len(f)) - 1] for f in found) / len(found) / top:.3f}" for k in (*spent, 10**9)]
            print(f"| {cores} | {search} | {measured:.0f} | " + " | ".join(cells) + " |")
    return 0


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
    parser.add_argument("--synthetic", action="store_true", help="no server: the noise-free landscape")
    parser.add_argument("--seeds", type=int, default=20, help="--synthetic: bayesian seeds averaged")
    args = parser.parse_args(argv)
    if args.synthetic:
        return synthetic(args.seeds)
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
    lines = ["| search | " + " | ".join(f"within {k}" for k in spent) + " |", "|---|" + "---:|" * len(spent)]
    for search, (result, _) in results.items():
        firsts = [throughput(result, key, combined=False) for key in result.records]
        cells = [f"{max(firsts[:k]):.0f}" for k in spent]  # a search that stopped keeps what it found
        lines.append(f"| {search} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
