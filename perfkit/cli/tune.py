"""`perfkit tune`: its flags into a validated TuneSpec (nothing below sees a Namespace), and its
results into files and console lines, rendered by `perfkit.report.tune_tables`.

Files in the output folder (default `reports/<timestamp>-tune/`), rewritten after every variant:
`results.csv` (one row per variant × concurrency: the variant's parameters, then every column of
`perfkit sweep`'s tidy CSV), `tune.json` (everything), `checkpoint.json` (unless --checkpoint names
another file); at the end `summary.txt` (the ranked summary, also printed), `best/config.pbtxt` and
`report.html`. A tune of several models writes the same, its results.csv one row per combination ×
measured model × level and its winner as `best/MODEL/config.pbtxt` (`CombinationFiles`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path

from perfkit.cli.common import Command, add_connection_flags, headers_from_args, tls_from_args, windows_from_args
from perfkit.errors import ExitCode, PerfkitError
from perfkit.load.inputs import parse_shape_flags
from perfkit.report.tune_tables import (
    best_pbtxt,
    render_combination_csv,
    render_combination_json,
    render_combination_summary,
    render_csv,
    render_json,
    render_summary,
)
from perfkit.results.files import load_result, write_text_atomic
from perfkit.results.provenance import redact_argv
from perfkit.target import TargetSpec, checked_endpoint, checked_metrics_url
from perfkit.tune.distributed import open_tuner
from perfkit.tune.multi.study import CombinationResult, Study, read_study
from perfkit.tune.multi.tuner import run_combination_tune
from perfkit.tune.objectives import Ranking, parse_constraint, parse_objective
from perfkit.tune.params import Param, check_against_config, parse_param
from perfkit.tune.space import SpaceSpec
from perfkit.tune.state import SEARCHES, TuneResult, TuneSpec, read_model
from perfkit.tune.tuner import run_tune

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
overlap are reported as a tie and the one with the fewest resources is recommended. A gain over the
default is claimed only when its 95 % interval excludes 0. A default configuration the server will
not load stops the tune at once (exit 2); an interrupted one (exit 130) still writes the best so far.

--param PATH=VALUES (repeatable) searches any config field instead of the knobs above: the cross
product of the --param values, each variant the config with those values and nothing else changed.
PATH is a ModelConfig field path, with [i] after a repeated message (instance_group[0].count);
VALUES is a comma list (0,100,500; KIND_CPU,KIND_GPU; true,false), an integer range A:B or
A:B:STEP (inclusive), or for a repeated field bracketed lists, one per alternative ([4,8] or
[4],[4,8]). Every path and value is checked against the schema before anything is measured.

--request-rate-range START:END searches each variant by request rate (open loop) instead: the
highest rate it sustains within the latency --constraint, latencies from the intended send times.
--search bayesian proposes variants with optuna's TPE, within --search-budget measurements.

Several CONFIG.pbtxt (one repository) are tuned together: each combination of their variants is
loaded at once and every model measured under its own load at the same time, ranked with
--weights MODEL:WEIGHT. An ensemble's config (or a BLS model's, with --composing-models) searches
its composing models' configs, measuring the ensemble.
"""


def _ints(text: str, flag: str, least: int = 0) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        values = ()
    if not values or any(v < least for v in values):
        raise PerfkitError(f"{flag} takes a comma-separated list of integers >= {least}, e.g. 0,100,500; got '{text}'")
    return tuple(sorted(set(values)))


def _range(text: str, flag: str) -> tuple[int, int]:
    parts = text.split(":")
    try:
        values = [int(p) for p in parts]
    except ValueError:
        values = []
    if len(values) not in (1, 2):
        raise PerfkitError(f"{flag} takes START:END, whole numbers (START, 2×START, … up to END), got '{text}'")
    return values[0], values[-1]


def _endpoints(values: list[str], protocol: str) -> tuple[str, ...]:
    urls = tuple(part.strip() for value in values for part in value.split(","))
    if any(not url for url in urls):
        raise PerfkitError(f"-u takes HOST:PORT, repeated or as a comma list; got {', '.join(values)!r}")
    return tuple(checked_endpoint(url, protocol) for url in urls)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "config", type=Path, nargs="+", metavar="CONFIG.pbtxt",
        help="the model's config, in its model folder; several (one repository): tuned together, measured at once",
    )  # fmt: skip
    target = p.add_argument_group("target")
    target.add_argument(
        "-u", "--url", action="append", metavar="HOST:PORT[,...]",
        help="a server in explicit mode (default: bundled; a HOST alone means port 8000, 8001 with -i grpc); several "
        "(repeat, or a comma list) with --workers",
    )  # fmt: skip
    target.add_argument("-i", "--protocol", choices=("http", "grpc"), default="http")
    add_connection_flags(p, target)
    target.add_argument("--request-timeout", type=float, default=30.0, metavar="SECONDS")
    target.add_argument("--collect-metrics", action="store_true", help="scrape -u's metrics for GPU figures")
    target.add_argument("--metrics-url", metavar="URL", help="default: where the server's metadata name says (triton: port 8002 on the host of -u)")
    ray = p.add_argument_group("distributed (Ray: pip install 'perfkit[distributed]')")
    ray.add_argument(
        "--workers", type=int, metavar="N",
        help="measure N variants at once, on N Ray actors, one per -u endpoint (default: one per -u when there "
        "are several)",
    )  # fmt: skip
    ray.add_argument("--ray-address", metavar="ADDR", help="the Ray cluster to join (default: start a local one)")
    search = p.add_argument_group("search (defaults as model_analyzer's)")
    search.add_argument(
        "--search", choices=SEARCHES, default="brute",
        help="brute: the whole grid; quick: hill climbing; bayesian: optuna's TPE within --search-budget (default brute)",
    )  # fmt: skip
    search.add_argument(
        "--search-budget", type=int, default=0, metavar="N",
        help="--search bayesian: variants measured at most, the default's included (default: a quarter of the grid, "
        "at least 8)",
    )  # fmt: skip
    search.add_argument(
        "--objective", default="throughput", metavar="FIGURE[:WEIGHT],...",
        help="throughput (default), latency (= p99_ms), p50_ms, p95_ms, p99_ms, mean_ms, gpu_memory_mb, "
        "gpu_utilization_pct; weights as throughput:3,p99_ms:1",
    )  # fmt: skip
    search.add_argument(
        "--constraint", action="append", default=[], metavar="'FIGURE<=BOUND'",
        help="e.g. 'p99_ms<=20' or 'throughput>=500' (repeatable); breaking variants are reported, not dropped",
    )  # fmt: skip
    search.add_argument(
        "--param", action="append", default=[], metavar="PATH=VALUES",
        help="a config field to search instead of the knobs below, e.g. "
        "'dynamic_batching.max_queue_delay_microseconds=0,100,500', 'instance_group[0].count=1:4', "
        "'dynamic_batching.preferred_batch_size=[4,8]' (repeatable: the cross product)",
    )  # fmt: skip
    search.add_argument("--concurrency-range", metavar="START:END", help="default 1:1024")
    search.add_argument(
        "--weights", default="", metavar="MODEL:WEIGHT,...",
        help="with several models: each model's weight in the ranking (model_analyzer's weighting; default 1 each)",
    )  # fmt: skip
    search.add_argument(
        "--composing-models", default="", metavar="MODEL,...",
        help="the models a BLS model calls: their configs are searched with it, the BLS model measured "
        "(an ensemble's are read from its steps)",
    )  # fmt: skip
    search.add_argument(
        "--request-rate-range", metavar="START:END",
        help="search each variant by request rate instead (open loop): the highest rate, doubling from START "
        "then bisecting, that it sustains within the latency --constraint, latency from the intended send time",
    )  # fmt: skip
    search.add_argument(
        "--request-distribution", choices=("constant", "poisson"), default="constant",
        help="arrivals with --request-rate-range",
    )  # fmt: skip
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


#: The knob flags --param replaces, with their defaults, and the --param that says the same.
_KNOBS = (
    ("min_instance_count", 1, "instance_group[0].count=1:4"), ("max_instance_count", 5, "instance_group[0].count=1:4"),
    ("min_batch_size", 1, "max_batch_size=1,8,64"), ("max_batch_size", 128, "max_batch_size=1,8,64"),
    ("batching_delays_us", "0", "dynamic_batching.max_queue_delay_microseconds=0,100"),
    ("preferred_batch_sizes", "none", "dynamic_batching.preferred_batch_size=[4],[8]"),
    ("instance_kinds", None, "instance_group[0].kind=KIND_CPU,KIND_GPU"),
)  # fmt: skip


def _params(args: argparse.Namespace) -> tuple[Param, ...]:
    texts, config_path = args.param, args.config[0]
    for name, default, instead in _KNOBS if texts else ():
        if getattr(args, name) != default:
            flag = "--" + name.replace("_", "-")
            raise PerfkitError(
                f"{flag} is a knob of the default grid, which --param replaces; say it as --param '{instead}'"
            )
    params = tuple(map(parse_param, texts))
    if params:  # the indexes against the model's own config, before any server starts
        check_against_config(params, read_model(config_path).base, str(config_path))
    return params


def _budget(args: argparse.Namespace) -> int:
    if args.search_budget and args.search != "bayesian":
        raise PerfkitError("--search-budget applies to --search bayesian; add --search bayesian or drop the budget")
    return int(args.search_budget)


def spec_from_args(args: argparse.Namespace) -> TuneSpec:
    if args.concurrency_range and args.request_rate_range:
        raise PerfkitError("--concurrency-range and --request-rate-range are exclusive: a tune searches one load mode")
    if args.request_distribution != "constant" and not args.request_rate_range:
        raise PerfkitError("--request-distribution applies with --request-rate-range; add the range or drop it")
    for path in args.config:
        if not path.is_file():
            raise PerfkitError(f"CONFIG.pbtxt: {path} is not a file; give the config.pbtxt of a model folder")
    if args.metrics_url and not args.collect_metrics:
        raise PerfkitError("--metrics-url needs --collect-metrics")
    urls = _endpoints(args.url or [], args.protocol)
    if args.collect_metrics and not urls:
        raise PerfkitError("--collect-metrics applies to -u; the bundled server's metrics are always read")
    workers = args.workers if args.workers is not None else (len(urls) if len(urls) > 1 else 0)
    preferred = tuple(t.strip().lower() for t in args.preferred_batch_sizes.split(",") if t.strip())
    kinds = tuple(t.strip().upper() for t in (args.instance_kinds or "").split(",") if t.strip())
    spec = TuneSpec(
        config_path=args.config[0], search=args.search,
        target=TargetSpec(
            urls[0] if urls else None, args.protocol, headers=headers_from_args(args),
            request_timeout_s=args.request_timeout, tls=tls_from_args(args),
        ),
        objective=parse_objective(args.objective), constraints=tuple(map(parse_constraint, args.constraint)),
        concurrency=_range(args.concurrency_range or "1:1024", "--concurrency-range"),
        request_rates=_range(args.request_rate_range, "--request-rate-range") if args.request_rate_range else (0, 0),
        request_distribution=args.request_distribution, budget=_budget(args),
        space=SpaceSpec(
            args.min_instance_count, args.max_instance_count, args.min_batch_size, args.max_batch_size,
            _ints(args.batching_delays_us, "--batching-delays-us"), preferred, kinds, _params(args),
        ),
        windows=windows_from_args(args),
        shapes=tuple((name, tuple(dims)) for name, dims in parse_shape_flags(args.shape).items()),
        input_data=args.input_data, seed=args.seed, top=args.top,
        leaders=args.leaders, remeasure_rounds=args.remeasure, checkpoint=args.checkpoint,
        output_dir=args.output_dir, quiet=args.quiet, collect_metrics=args.collect_metrics,
        metrics_url=checked_metrics_url(args.metrics_url) if args.metrics_url else None, endpoints=urls if workers or len(urls) > 1 else (), workers=workers,
        ray_address=args.ray_address,
    )  # fmt: skip
    spec.validate()
    return spec


class TuneFiles:
    """Writes the output folder; called after every change, and `finish` at the end."""

    def __init__(self, folder: Path, argv: list[str]) -> None:
        self.folder, self.argv = folder, redact_argv(argv)  # secret -H values read `***` in tune.json

    def __call__(self, result: TuneResult) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)  # on the first result: a refused tune leaves nothing
        write_text_atomic(self.folder / "results.csv", render_csv(result))
        write_text_atomic(self.folder / "tune.json", render_json(result, self.argv))

    def finish(self, result: TuneResult) -> list[Path]:
        from perfkit.report.html import render_html  # it loads matplotlib, which most runs never need

        self(result)
        paths = [self.folder / "results.csv", self.folder / "tune.json", self.folder / "summary.txt"]
        write_text_atomic(paths[-1], "\n".join(render_summary(result)) + "\n")
        if result.best is not None:  # a tune that did not finish: the best so far, said to be provisional
            (self.folder / "best").mkdir(exist_ok=True)
            paths.append(self.folder / "best" / "config.pbtxt")
            write_text_atomic(paths[-1], best_pbtxt(result.best.config))
        # The report a person opens, from the same tune.json that `perfkit report` reads.
        paths.append(self.folder / "report.html")
        write_text_atomic(paths[-1], render_html([load_result(self.folder / "tune.json")]))
        return paths


def run(args: argparse.Namespace, argv: list[str]) -> int:
    """`perfkit tune`: 0 a configuration is recommended; 1 none met the constraints or the tune
    could not finish (the checkpoint resumes it); 2 usage, or a model that does not load with its own
    configuration; 130 interrupted (the best configuration so far is written all the same)."""
    spec = spec_from_args(args)
    folder = spec.output_dir or Path("reports") / f"{dt.datetime.now():%Y%m%d-%H%M%S}-tune"
    composing = [name.strip() for name in args.composing_models.split(",") if name.strip()]
    study = read_study(args.config, composing, args.weights)
    if study is not None:
        return _run_combination(spec, study, folder, argv)
    outputs = TuneFiles(folder, argv)
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
    unfinished = result is None or not result.completed
    if code == ExitCode.INTERRUPTED or (code == ExitCode.FAILED and unfinished):
        best = None if result is None or result.best is None else folder / "best" / "config.pbtxt"
        _say_unfinished(code, best, "variant", checkpoint)
    elif code == ExitCode.FAILED:
        _say_nothing_recommended(result is not None and _broke_constraints(result.ranking), "variant")
    return int(code)


def _say_unfinished(code: int, best: Path | None, what: str, checkpoint: Path) -> None:
    """What an interrupted or stopped tune left: the best so far (provisional), and how to resume."""
    how = "interrupted" if code == ExitCode.INTERRUPTED else "stopped early"
    if best is not None:
        print(f"{how}: {best} holds the best configuration found so far (provisional: the tune did not finish)",
              file=sys.stderr)  # fmt: skip
    else:
        print(f"{how}: no {what} was recommended before that, so no best configuration was written", file=sys.stderr)
    print(f"the measurements so far are in {checkpoint}: resume with --checkpoint {checkpoint}", file=sys.stderr)


def _broke_constraints(ranking: Ranking | None) -> bool:
    """Whether some variant was measured but broke a --constraint (else every one failed)."""
    return ranking is not None and any(e.status == "infeasible" for e in ranking.entries)


def _say_nothing_recommended(infeasible: bool, what: str) -> None:
    """Why a finished tune recommends nothing; loosening --constraint is advised only when a
    measured variant broke one (never when none was set, or when every variant failed)."""
    if infeasible:
        print(f"error: no {what} met the constraints; loosen --constraint or widen the search", file=sys.stderr)
    else:
        print(f"error: every {what} failed (the reasons are in the summary); nothing to recommend", file=sys.stderr)


class CombinationFiles:
    """The output folder of a tune of several models: results.csv and tune.json after every change,
    then `finish`: summary.txt, best/MODEL/config.pbtxt and report.html."""

    def __init__(self, folder: Path, argv: list[str]) -> None:
        self.folder, self.argv = folder, redact_argv(argv)

    def __call__(self, result: CombinationResult) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.folder / "results.csv", render_combination_csv(result))
        write_text_atomic(self.folder / "tune.json", render_combination_json(result, self.argv))

    def finish(self, result: CombinationResult) -> list[Path]:
        from perfkit.report.html import render_html  # it loads matplotlib, which most runs never need

        self(result)
        paths = [self.folder / "results.csv", self.folder / "tune.json", self.folder / "summary.txt"]
        write_text_atomic(paths[-1], "\n".join(render_combination_summary(result)) + "\n")
        best = result.best
        if best is not None:  # a tune that did not finish: the best so far, said to be provisional
            for name, config in best.configs.items():
                (self.folder / "best" / name).mkdir(parents=True, exist_ok=True)
                paths.append(self.folder / "best" / name / "config.pbtxt")
                write_text_atomic(paths[-1], best_pbtxt(config))
        paths.append(self.folder / "report.html")
        write_text_atomic(paths[-1], render_html([load_result(self.folder / "tune.json")]))
        return paths


def _run_combination(spec: TuneSpec, study: Study, folder: Path, argv: list[str]) -> int:
    """A tune of several models (or of an ensemble or BLS model): its own files, checkpoint included."""
    outputs = CombinationFiles(folder, argv)
    checkpoint = spec.checkpoint or folder / "checkpoint.json"
    result, code = run_combination_tune(spec, study, outputs, checkpoint)
    paths = outputs.finish(result)
    if not spec.quiet:
        print("\n".join(render_combination_summary(result)))
    for path in paths:
        print(f"wrote {path}", file=sys.stderr)
    if result.stop_reason:
        print(f"error: the tune stopped early: {result.stop_reason}", file=sys.stderr)
    if code == ExitCode.INTERRUPTED or (code == ExitCode.FAILED and not result.completed):
        _say_unfinished(code, None if result.best is None else folder / "best", "combination", checkpoint)
    elif code == ExitCode.FAILED:
        _say_nothing_recommended(_broke_constraints(result.ranking), "combination")
    return int(code)


COMMAND = Command(
    "tune",
    help="search model configurations (instances, batch size, dynamic batching) for the best one",
    description=DESCRIPTION,
    add_arguments=add_arguments,
    run=run,
    formatter_class=argparse.RawDescriptionHelpFormatter,
)
