"""The edge of `perfkit tune`: its flags into a validated TuneSpec (nothing below sees a Namespace),
and its results into files and console lines. The renderers are pure functions of a TuneResult.

Files in the output folder (default `reports/<timestamp>-tune/`), rewritten after every variant:
`results.csv` (one row per variant × concurrency: the variant's parameters, then every column of
`perfkit sweep`'s tidy CSV), `tune.json` (everything), `checkpoint.json` (unless --checkpoint names
another file); at the end `summary.txt` (the ranked summary, also printed) and `best/config.pbtxt`.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import io
import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perfkit.cli.sweep_flags import add_connection_flags, headers_from_args, tls_from_args
from perfkit.errors import ExitCode, PerfkitError

if TYPE_CHECKING:  # the heavy modules load only when tune runs
    from perfkit.tune.objectives import Estimate, Figures
    from perfkit.tune.state import Record, TuneResult, TuneSpec

DESCRIPTION = """\
Find the model configuration that serves best, as model_analyzer's profile does: variants of
CONFIG.pbtxt (instance count, max_batch_size, dynamic batching) are loaded one after another
through the repository API with a config override, each measured over a concurrency range with
perfkit sweep's measurement, and ranked by --objective under --constraint.

With no -u, the bundled server runs on the model folder's parent in explicit model-control mode.
With -u, the server (ours or Triton) must run with --model-control-mode explicit; no file on it
is touched, and the model's configuration from before the tune is loaded back at the end.
With several -u (alike servers) and --workers, one Ray actor per server measures variants at once.

The leaders are re-measured, interleaved, before a winner is named; variants whose 95 % intervals
overlap are reported as a tie and the one with the fewest resources is recommended.
"""


def _ints(text: str, flag: str, least: int = 0) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        values = ()
    if not values or any(v < least for v in values):
        raise PerfkitError(f"{flag} takes a comma-separated list of integers >= {least}, e.g. 0,100,500; got '{text}'")
    return tuple(sorted(set(values)))


def _concurrency(text: str) -> tuple[int, int]:
    parts = text.split(":")
    try:
        values = [int(p) for p in parts]
    except ValueError:
        values = []
    if len(values) not in (1, 2):
        raise PerfkitError(f"--concurrency-range takes START:END (swept as START, 2×START, … up to END), got '{text}'")
    return values[0], values[-1]


def _endpoints(values: list[str]) -> tuple[str, ...]:
    urls = tuple(part.strip() for value in values for part in value.split(","))
    if any(not url for url in urls):
        raise PerfkitError(f"-u takes HOST:PORT, repeated or as a comma list; got {', '.join(values)!r}")
    return urls


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser(
        "tune",
        help="search model configurations (instances, batch size, dynamic batching) for the best one",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("config", type=Path, metavar="CONFIG.pbtxt", help="the model's config, in its model folder")
    target = p.add_argument_group("target")
    target.add_argument(
        "-u", "--url", action="append", metavar="HOST:PORT[,...]",
        help="a server in explicit mode (default: bundled); several (repeat, or a comma list) with --workers",
    )  # fmt: skip
    target.add_argument("-i", "--protocol", choices=("http", "grpc"), default="http")
    add_connection_flags(p, target)
    target.add_argument("--request-timeout", type=float, default=30.0, metavar="SECONDS")
    target.add_argument("--collect-metrics", action="store_true", help="scrape -u's metrics for GPU figures")
    target.add_argument("--metrics-url", metavar="URL", help="default: port 8002 on the host of -u")
    ray = p.add_argument_group("distributed (Ray: pip install 'perfkit[distributed]')")
    ray.add_argument(
        "--workers", type=int, metavar="N",
        help="measure N variants at once, on N Ray actors, one per -u endpoint (default: one per -u when there "
        "are several)",
    )  # fmt: skip
    ray.add_argument("--ray-address", metavar="ADDR", help="the Ray cluster to join (default: start a local one)")
    search = p.add_argument_group("search (defaults as model_analyzer's)")
    search.add_argument("--search", choices=("brute", "quick"), default="brute", help="default brute")
    search.add_argument(
        "--objective", default="throughput", metavar="FIGURE[:WEIGHT],...",
        help="throughput (default), latency (= p99_ms), p50_ms, p95_ms, p99_ms, mean_ms, gpu_memory_mb, "
        "gpu_utilization_pct; weights as throughput:3,p99_ms:1",
    )  # fmt: skip
    search.add_argument(
        "--constraint", action="append", default=[], metavar="'FIGURE<=BOUND'",
        help="e.g. 'p99_ms<=20' or 'throughput>=500' (repeatable); breaking variants are reported, not dropped",
    )  # fmt: skip
    search.add_argument("--concurrency-range", default="1:1024", metavar="START:END", help="default 1:1024")
    search.add_argument("--min-instance-count", type=int, default=1, metavar="N")
    search.add_argument("--max-instance-count", type=int, default=5, metavar="N", help="default 5")
    search.add_argument("--min-batch-size", type=int, default=1, metavar="N", help="max_batch_size from N, doubling")
    search.add_argument("--max-batch-size", type=int, default=128, metavar="N", help="default 128")
    search.add_argument("--batching-delays-us", default="0", metavar="US,...", help="queue delays tried (default 0)")
    search.add_argument(
        "--preferred-batch-sizes", default="none", metavar="none|max|N,...",
        help="preferred batch sizes tried with dynamic batching: none, max (= max_batch_size) or a number",
    )  # fmt: skip
    search.add_argument(
        "--instance-kinds", metavar="KIND_CPU,KIND_GPU", help="instance kinds tried (default: the config's)"
    )
    ranking = p.add_argument_group("ranking")
    ranking.add_argument("--top", type=int, default=3, metavar="N", help="variants in the summary (default 3)")
    ranking.add_argument("--leaders", type=int, default=3, metavar="N", help="leaders re-measured (default 3)")
    ranking.add_argument("--remeasure", type=int, default=2, metavar="ROUNDS", help="re-measure rounds (default 2)")
    m = p.add_argument_group("measurement (as perfkit sweep's)")
    m.add_argument("--measurement-mode", choices=("time_windows", "count_windows"), default="time_windows")
    m.add_argument("-p", "--measurement-interval", type=float, default=1000.0, metavar="MS", help="default 1000")
    m.add_argument("--measurement-request-count", type=int, default=50, metavar="N")
    m.add_argument("-s", "--stability-percentage", type=float, default=10.0, metavar="PCT")
    m.add_argument("-r", "--max-trials", type=int, default=10, metavar="N")
    m.add_argument("--percentile", type=float, default=None, metavar="P", help="stabilise on this percentile")
    m.add_argument(
        "--warmup-request-count", type=int, default=20, metavar="N", help="per level, after each (re)load (default 20)"
    )
    data = p.add_argument_group("input data")
    data.add_argument("--shape", action="append", default=[], metavar="NAME:D1,D2,...")
    data.add_argument("--input-data", default="random", metavar="random|zero|FILE.json")
    data.add_argument("--seed", type=int, default=0)
    out = p.add_argument_group("output")
    out.add_argument("--checkpoint", type=Path, metavar="FILE", help="resume from FILE and save to it")
    out.add_argument("-o", "--output-dir", type=Path, metavar="DIR", help="default reports/<timestamp>-tune/")
    out.add_argument("--quiet", action="store_true", help="no progress display")


def spec_from_args(args: argparse.Namespace) -> TuneSpec:
    from perfkit.load.inputs import parse_shape_flags
    from perfkit.sweep.spec import TargetSpec, WindowSpec
    from perfkit.tune.objectives import parse_constraint, parse_objective
    from perfkit.tune.search import SpaceSpec
    from perfkit.tune.state import TuneSpec

    if not args.config.is_file():
        raise PerfkitError(f"CONFIG.pbtxt: {args.config} is not a file; give the config.pbtxt of a model folder")
    if args.metrics_url and not args.collect_metrics:
        raise PerfkitError("--metrics-url needs --collect-metrics")
    urls = _endpoints(args.url or [])
    if args.collect_metrics and not urls:
        raise PerfkitError("--collect-metrics applies to -u; the bundled server's metrics are always read")
    workers = args.workers if args.workers is not None else (len(urls) if len(urls) > 1 else 0)
    preferred = tuple(t.strip().lower() for t in args.preferred_batch_sizes.split(",") if t.strip())
    kinds = tuple(t.strip().upper() for t in (args.instance_kinds or "").split(",") if t.strip())
    spec = TuneSpec(
        config_path=args.config, search=args.search,
        target=TargetSpec(
            urls[0] if urls else None, args.protocol, headers=headers_from_args(args),
            request_timeout_s=args.request_timeout, tls=tls_from_args(args),
        ),
        objective=parse_objective(args.objective), constraints=tuple(map(parse_constraint, args.constraint)),
        concurrency=_concurrency(args.concurrency_range),
        space=SpaceSpec(
            args.min_instance_count, args.max_instance_count, args.min_batch_size, args.max_batch_size,
            _ints(args.batching_delays_us, "--batching-delays-us"), preferred, kinds,
        ),
        windows=WindowSpec(
            mode=args.measurement_mode, interval_ms=args.measurement_interval,
            request_count=args.measurement_request_count, stability_pct=args.stability_percentage,
            max_trials=args.max_trials, percentile=args.percentile, warmup_request_count=args.warmup_request_count,
        ),
        shapes=tuple((name, tuple(dims)) for name, dims in parse_shape_flags(args.shape).items()),
        input_data=args.input_data, seed=args.seed, top=args.top,
        leaders=args.leaders, remeasure_rounds=args.remeasure, checkpoint=args.checkpoint,
        output_dir=args.output_dir, quiet=args.quiet, collect_metrics=args.collect_metrics,
        metrics_url=args.metrics_url, endpoints=urls if workers or len(urls) > 1 else (), workers=workers,
        ray_address=args.ray_address,
    )  # fmt: skip
    spec.validate()
    return spec


# --- renderers ------------------------------------------------------------------------------------


def _gain(result: TuneResult, key: str) -> float | None:
    """exp(score − default's score) − 1: how much better than the default configuration."""
    ranking = result.ranking
    if ranking is None:
        return None
    entries = {e.key: e for e in ranking.entries}
    own, default = entries.get(key), entries.get(result.default_key)
    if own is None or default is None or own.score is None or default.score is None:
        return None
    return math.expm1(own.score.value - default.score.value)


WIDE_INTERVAL = 0.5  # a score interval wider than ×1.5 / ÷1.5 (about ±25 %) is worth a warning


def _relative_width(score: Estimate | None) -> float:
    return 0.0 if score is None else math.expm1(score.high - score.low)


def _figure(record: Record, name: str) -> str:
    figures = record.combined()
    return "-" if figures is None or name not in figures else f"{figures[name].value:.1f}"


def render_summary(result: TuneResult) -> list[str]:
    """The ranked summary as lines: the verdict in words, then the top variants."""
    spec, ranking = result.spec, result.ranking
    measured = sum(r.measured for r in result.records.values())
    levels = sum(len(r.levels) + len(r.remeasures) for r in result.records.values())
    constraints = ", ".join(map(str, spec.constraints)) or "none"
    lines = [
        f"perfkit tune of model '{result.model.name}': {spec.search} search, {spec.objective.describe()}, "
        f"constraints: {constraints}",
        f"{len(result.records)} variants measured ({levels} load levels, {measured} of them in this run) "
        f"out of a grid of {result.space.size}.",
    ]
    if not result.completed:
        lines.append("The tune did not finish: this ranking is provisional (the leaders were not re-measured).")
    if ranking is None or ranking.best is None:
        lines.append("No variant met the constraints: nothing to recommend (see the ranking below).")
    else:
        best = result.records[ranking.best]
        assert best.chosen is not None  # a feasible variant has a chosen level
        lv = best.levels[best.chosen]
        default = result.records.get(result.default_key)
        lines.append(f"Best: {best.variant.key} ({best.variant.describe()}),")
        lines.append(
            f"  {_figure(best, 'throughput')} infer/s at concurrency {int(lv.level)}, p99 {_figure(best, 'p99_ms')} ms"
        )
        gain = _gain(result, ranking.best)
        if ranking.best == result.default_key:
            lines.append("  The default configuration is the best: no variant beat it.")
        elif result.default_key in ranking.tie:
            lines.append("  It is not distinguishable from the default configuration (their intervals overlap).")
        elif gain is not None and default is not None:
            what = "more throughput" if [n for n, _ in spec.objective.weights] == ["throughput"] else "better"
            lines.append(
                f"  That is {gain * 100:.0f} % {what} than the default configuration ({result.default_key}: "
                f"{_figure(default, 'throughput')} infer/s, p99 {_figure(default, 'p99_ms')} ms)"
                + (", under the constraints." if spec.constraints else ".")
            )
        if len(ranking.tie) > 1:
            lines.append(
                f"Tie: {', '.join(ranking.tie)} have overlapping 95 % intervals"
                f"{' after re-measurement' if result.leaders else ''}; "
                f"recommending {ranking.best}, the one with the fewest resources."
            )
            wide = [k for k in ranking.tie if _relative_width(ranking.entry(k).score) > WIDE_INTERVAL]
            if wide:
                lines.append(
                    f"  The intervals of {', '.join(wide)} span more than ±{WIDE_INTERVAL * 50:.0f} %: the machine "
                    "was too noisy to tell them apart. Longer windows (-p), a tighter -s or more --remeasure "
                    "rounds narrow them."
                )
    lines += ["", *_table(result)]
    failed = [r for r in result.records.values() if r.status == "failed"]
    if failed:
        lines += ["", f"{len(failed)} variant(s) failed:"] + [f"  {r.variant.key}: {r.error}" for r in failed]
    if result.lost_endpoints:
        lines += ["", "Endpoints left out of the tune:"] + [f"  {why}" for why in result.lost_endpoints]
    return lines


def _gain_interval(result: TuneResult, key: str) -> str:
    """The gain over the default with the 95 % interval of this variant's score."""
    ranking = result.ranking
    assert ranking is not None
    own, default = ranking.entry(key), ranking.entry(result.default_key)
    if own.score is None or default.score is None:
        return "-"
    low, mid, high = (
        math.expm1(x - default.score.value) * 100 for x in (own.score.low, own.score.value, own.score.high)
    )
    return f"{mid:+.0f} % ({low:+.0f}..{high:+.0f})"


def _table(result: TuneResult) -> list[str]:
    ranking = result.ranking
    if ranking is None:
        return []
    rows = [["rank", "variant", "concurrency", "infer/s (95% CI)", "p99 ms", "vs default (95% CI)", "status"]]
    # The top N, and whatever the verdict names: the tie (the recommendation among it) and the default.
    measured = [e for e in ranking.entries if e.status != "failed"]
    wanted = {e.key for e in measured[: result.spec.top]} | set(ranking.tie) | {result.default_key}
    for e in (e for e in ranking.entries if e.key in wanted):
        record = result.records[e.key]
        figures = record.combined()
        tp = None if figures is None else figures.get("throughput")
        mark = " (recommended)" if e.key == ranking.best else (" (tied)" if e.key in ranking.tie else "")
        rows.append([
            str(ranking.entries.index(e) + 1), e.key + (" [default]" if record.default else ""),
            "-" if record.chosen is None else str(int(record.levels[record.chosen].level)),
            "-" if tp is None else f"{tp.value:.1f} ({tp.low:.0f}..{tp.high:.0f})",
            _figure(record, "p99_ms"), _gain_interval(result, e.key),
            e.status + mark + ("; " + "; ".join(e.violations) if e.violations else ""),
        ])  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


def _variant_cells(record: Record) -> list[str]:
    p = record.variant.params()
    delay = "" if p["max_queue_delay_us"] is None else str(p["max_queue_delay_us"])
    return [record.variant.key, str(record.default).lower(), str(p["instance_count"]), str(p["max_batch_size"]),
            str(p["dynamic_batching"]).lower(), delay, ";".join(map(str, p["preferred_batch_sizes"])),
            p["instance_kind"], record.status]  # fmt: skip


VARIANT_COLUMNS = [
    "variant", "is_default", "instance_count", "max_batch_size", "dynamic_batching", "max_queue_delay_us",
    "preferred_batch_sizes", "instance_kind", "status", "phase", "chosen", "feasible", "violations", "error",
]  # fmt: skip


def render_csv(result: TuneResult) -> str:
    """One row per variant × concurrency (re-measurements are rows of phase 'remeasure')."""
    from perfkit.report.export import render_tidy_csv, tidy_header
    from perfkit.results.model import SweepResult
    from perfkit.tune.objectives import figures_of, violations

    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(VARIANT_COLUMNS + tidy_header())
    blank = [""] * len(tidy_header())
    for record in result.records.values():
        levels = [*record.levels, *record.remeasures]
        if not levels:
            writer.writerow([*_variant_cells(record), "search", "false", "", "", record.error, *blank])
            continue
        sweep = SweepResult(result.model.name, "", "", result.spec.target.protocol, "concurrency", tuple(levels), {})
        rows = list(csv.reader(io.StringIO(render_tidy_csv(sweep))))[1:]
        for i, (level, row) in enumerate(zip(levels, rows)):
            figures = figures_of(level)
            broken = violations(figures, result.spec.constraints) if figures is not None else ["no successful request"]
            phase = "search" if i < len(record.levels) else "remeasure"
            chosen = str(i == record.chosen).lower()
            writer.writerow([*_variant_cells(record), phase, chosen, str(not broken).lower(), "; ".join(broken),
                             record.error, *row])  # fmt: skip
    return out.getvalue()


def _estimates(figures: Figures | None) -> dict[str, dict[str, float]] | None:
    return (
        None if figures is None else {k: {"value": e.value, "low": e.low, "high": e.high} for k, e in figures.items()}
    )


def render_json(result: TuneResult, argv: list[str]) -> str:
    """tune.json: everything the HTML report needs. Secret -H values read `***`, as in a sweep's
    provenance."""
    from dataclasses import asdict

    from perfkit._version import __version__
    from perfkit.results.model import to_jsonable
    from perfkit.results.provenance import redact_argv

    spec, ranking = result.spec, result.ranking
    variants = []
    for key, r in result.records.items():
        variants.append({
            "key": key, "description": r.variant.describe(), "params": r.variant.params(), "is_default": r.default,
            "status": r.status, "error": r.error, "config": r.config, "levels": to_jsonable(r.levels),
            "chosen_concurrency": None if r.chosen is None else int(r.levels[r.chosen].level),
            "figures": _estimates(r.figures()), "remeasures": to_jsonable(r.remeasures),
            "combined_figures": _estimates(r.combined()), "measured_in_this_run": r.measured,
            "endpoint": r.endpoint or None,
        })  # fmt: skip
    entries = [] if ranking is None else [
        {"rank": i + 1, "key": e.key, "status": e.status, "violations": list(e.violations),
         "score": None if e.score is None else {"value": e.score.value, "low": e.score.low, "high": e.score.high},
         "gain_over_default": _gain(result, e.key)}
        for i, e in enumerate(ranking.entries)
    ]  # fmt: skip
    best = result.best
    doc = {
        "schema_version": 1, "perfkit_version": __version__, "started_at": result.started_at,
        "argv": redact_argv(argv),
        "model": result.model.name, "config_path": str(spec.config_path), "server": result.server,
        "settings": {
            "url": spec.target.url, "endpoints": list(spec.endpoints), "workers": spec.workers,
            "protocol": spec.target.protocol,
            "search": spec.search,
            "objective": dict(spec.objective.weights), "constraints": [str(c) for c in spec.constraints],
            "concurrency_range": list(spec.concurrency), "space": asdict(spec.space), "windows": asdict(spec.windows),
            "top": spec.top, "leaders": spec.leaders, "remeasure_rounds": spec.remeasure_rounds,
        },
        "space": {"shape": list(result.space.shape), "size": result.space.size},
        "base_config": result.model.base, "default": result.default_key, "variants": variants,
        "measurements": {
            "variants": len(result.records),
            "levels": sum(len(r.levels) + len(r.remeasures) for r in result.records.values()),
            "measured_in_this_run": sum(r.measured for r in result.records.values()),
        },
        "ranking": entries, "leaders": result.leaders,
        "leader": None if ranking is None else ranking.leader, "ties": [] if ranking is None else list(ranking.tie),
        "best": None if best is None else best.variant.key, "best_config": None if best is None else best.config,
        "completed": result.completed, "stop_reason": result.stop_reason, "lost_endpoints": result.lost_endpoints,
    }  # fmt: skip
    return json.dumps(doc, indent=1)


def best_pbtxt(config: dict[str, Any]) -> str:
    """A configuration JSON as config.pbtxt text (it parses back to the same ModelConfig)."""
    from google.protobuf import text_format

    from v2kit.model_config import config_from_json

    return str(text_format.MessageToString(config_from_json(json.dumps(config), "the best configuration")))


class Outputs:
    """Writes the output folder; called after every change, and `finish` at the end."""

    def __init__(self, folder: Path, argv: list[str]) -> None:
        self.folder, self.argv = folder, argv

    def __call__(self, result: TuneResult) -> None:
        from perfkit.results.files import write_text_atomic

        self.folder.mkdir(parents=True, exist_ok=True)  # on the first result: a refused tune leaves nothing
        write_text_atomic(self.folder / "results.csv", render_csv(result))
        write_text_atomic(self.folder / "tune.json", render_json(result, self.argv))

    def finish(self, result: TuneResult) -> list[Path]:
        from perfkit.results.files import write_text_atomic

        self(result)
        paths = [self.folder / "results.csv", self.folder / "tune.json", self.folder / "summary.txt"]
        write_text_atomic(paths[-1], "\n".join(render_summary(result)) + "\n")
        if result.best is not None and result.completed:
            (self.folder / "best").mkdir(exist_ok=True)
            paths.append(self.folder / "best" / "config.pbtxt")
            write_text_atomic(paths[-1], best_pbtxt(result.best.config))
        # The report a person opens, from the same tune.json that `perfkit report` reads.
        from perfkit.report.html import render_html
        from perfkit.results.files import load_result

        paths.append(self.folder / "report.html")
        write_text_atomic(paths[-1], render_html([load_result(self.folder / "tune.json")]))
        return paths


def run(args: argparse.Namespace, argv: list[str]) -> int:
    """`perfkit tune`: 0 a configuration is recommended; 1 none met the constraints or the tune
    could not finish (the checkpoint resumes it); 2 usage; 130 interrupted."""
    from perfkit.tune.distributed import open_tuner
    from perfkit.tune.tuner import run_tune

    spec = spec_from_args(args)
    folder = spec.output_dir or Path("reports") / f"{dt.datetime.now():%Y%m%d-%H%M%S}-tune"
    outputs = Outputs(folder, argv)
    checkpoint = spec.checkpoint or folder / "checkpoint.json"
    result, code = run_tune(spec, outputs, checkpoint, open_tuner)
    if result is not None and result.ranking is not None:
        paths = outputs.finish(result)
        if not spec.quiet:
            print("\n".join(render_summary(result)))
        for path in paths:
            print(f"wrote {path}", file=sys.stderr)
    if result is not None and result.stop_reason:
        print(f"error: the tune stopped early: {result.stop_reason}", file=sys.stderr)
    if code in (ExitCode.INTERRUPTED, ExitCode.FAILED) and (result is None or not result.completed):
        print(f"the measurements so far are in {checkpoint}: resume with --checkpoint {checkpoint}", file=sys.stderr)
    elif code == ExitCode.FAILED:
        print("error: no variant met the constraints; loosen --constraint or widen the search", file=sys.stderr)
    return int(code)
