"""`perfkit tune`'s results as text, pure functions of a TuneResult: the ranked summary (printed and
`summary.txt`), `results.csv` (one row per variant × concurrency: the variant's parameters, then
every column of `perfkit sweep`'s tidy CSV), `tune.json` (everything the HTML report reads) and the
winner's `config.pbtxt`; and of a CombinationResult (a tune of several models): its summary,
results.csv (one row per combination × measured model × level) and tune.json. The CLI decides where each goes.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import asdict
from typing import Any

from google.protobuf import text_format

from perfkit._version import __version__
from perfkit.report.tidy import render_tidy_csv, tidy_header
from perfkit.results.model import SweepResult, level_name, to_jsonable
from perfkit.tune.multi.study import CombinationRecord, CombinationResult, level_figures
from perfkit.tune.objectives import Estimate, Figures, Ranking, figures_of, violations
from perfkit.tune.state import Record, TuneResult
from perfkit.tune.verdict import Score, difference, mark, provisional, versus_default
from v2kit.model_config import config_from_json


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


def _scores(ranking: Ranking) -> dict[str, Score]:
    return {e.key: (e.score.value, e.score.low, e.score.high) for e in ranking.entries if e.score is not None}


def nothing_recommended(ranking: Ranking | None, what: str = "variant") -> str:
    """Why a tune recommends nothing: no variant met the constraints, or every one failed."""
    if ranking is not None and any(e.status == "infeasible" for e in ranking.entries):
        return f"No {what} met the constraints: nothing to recommend (see the ranking below)."
    return f"Every {what} failed: nothing to recommend (the reasons are below)."


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
        lines.append(provisional(result.completed))
    if ranking is None or ranking.best is None:
        lines.append(nothing_recommended(ranking))
    else:
        best = result.records[ranking.best]
        assert best.chosen is not None  # a feasible variant has a chosen level
        lv = best.levels[best.chosen]
        default = result.records.get(result.default_key)
        lines.append(f"Best: {best.variant.key} ({best.variant.describe()}),")
        lines.append(
            f"  {_figure(best, 'throughput')} infer/s at {level_name(lv.mode, lv.level)}, p99 {_figure(best, 'p99_ms')} ms"
        )
        scores = _scores(ranking)
        if ranking.best == result.default_key:
            lines.append("  The default configuration is the best: no variant beat it.")
        elif default is not None and ranking.best in scores and result.default_key in scores:
            # A gain is claimed only when its interval excludes 0 (`verdict.versus_default`).
            d = difference(scores[ranking.best], scores[result.default_key])
            what = "more throughput" if [n for n, _ in spec.objective.weights] == ["throughput"] else "better"
            lines.append(
                f"  {'That is' if d.significant else 'It is'} {versus_default(d, what)}; the default, "
                f"{result.default_key}: {_figure(default, 'throughput')} infer/s, p99 {_figure(default, 'p99_ms')} ms"
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


def _gain_interval(scores: dict[str, Score], key: str, default: str) -> str:
    """The difference to the default with its 95 % interval (`verdict.difference`); "-" for the default."""
    if key == default or key not in scores or default not in scores:
        return "-"
    return str(difference(scores[key], scores[default]))


def _table(result: TuneResult) -> list[str]:
    ranking = result.ranking
    if ranking is None:
        return []
    load = "request rate" if result.spec.rate_mode else "concurrency"
    rows = [["rank", "variant", load, "infer/s (95% CI)", "p99 ms", "vs default (95% CI)", "status"]]
    # The top N, and whatever the verdict names: the tie (the recommendation among it) and the default.
    measured = [e for e in ranking.entries if e.status != "failed"]
    wanted = {e.key for e in measured[: result.spec.top]} | set(ranking.tie) | {result.default_key}
    scores = _scores(ranking)
    for e in (e for e in ranking.entries if e.key in wanted):
        record = result.records[e.key]
        figures = record.combined()
        tp = None if figures is None else figures.get("throughput")
        rows.append([
            str(ranking.entries.index(e) + 1), e.key + (" [default]" if record.default else ""),
            "-" if record.chosen is None else str(int(record.levels[record.chosen].level)),
            "-" if tp is None else f"{tp.value:.1f} ({tp.low:.0f}..{tp.high:.0f})",
            _figure(record, "p99_ms"), _gain_interval(scores, e.key, result.default_key),
            _status(e.key, e.status, e.violations, ranking, result.leaders, scores),
        ])  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


def _status(
    key: str, status: str, broken: tuple[str, ...], ranking: Ranking, leaders: list[str], scores: dict[str, Score]
) -> str:
    """A variant's status with its mark (`verdict.mark`, the report's rule too) or what it broke."""
    text = status
    if status == "feasible":
        marked = mark(
            key, best=ranking.best, leader=ranking.leader, ties=ranking.tie, remeasured=leaders, scores=scores
        )
        text += f" ({marked})" if marked else ""
    return text + ("; " + "; ".join(broken) if broken else "")


def _variant_cells(record: Record) -> list[str]:
    p = record.params()
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
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(VARIANT_COLUMNS + tidy_header())
    blank = [""] * len(tidy_header())
    for record in result.records.values():
        levels = [*record.levels, *record.remeasures]
        if not levels:
            writer.writerow([*_variant_cells(record), "search", "false", "", "", record.error, *blank])
            continue
        sweep = SweepResult(
            result.model.name, "", "", result.spec.target.protocol, result.spec.load_mode, tuple(levels), {}
        )
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
    """tune.json: everything the HTML report needs. `argv` is recorded as given: the caller redacts
    secret -H values to `***`, as in a sweep's provenance."""
    spec, ranking = result.spec, result.ranking
    variants = []
    for key, r in result.records.items():
        variants.append({
            "key": key, "description": r.variant.describe(), "params": r.params(), "is_default": r.default,
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
        "argv": argv,
        "model": result.model.name, "config_path": str(spec.config_path), "server": result.server,
        "settings": {
            "url": spec.target.url, "endpoints": list(spec.endpoints), "workers": spec.workers,
            "protocol": spec.target.protocol,
            "search": spec.search,
            "objective": dict(spec.objective.weights), "constraints": [str(c) for c in spec.constraints],
            "concurrency_range": list(spec.concurrency), "load_mode": spec.load_mode,
            "request_rate_range": list(spec.request_rates) if spec.rate_mode else None,
            "request_distribution": spec.request_distribution, "search_budget": spec.budget or None,
            "space": asdict(spec.space), "windows": asdict(spec.windows),
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
    return str(text_format.MessageToString(config_from_json(json.dumps(config), "the best configuration")))


# --- tunes of several models (perfkit.tune.multi) -------------------------------------------------


def _combination_gain(result: CombinationResult, key: str) -> float | None:
    ranking = result.ranking
    entries = {} if ranking is None else {e.key: e for e in ranking.entries}
    own, default = entries.get(key), entries.get(result.default_key)
    if own is None or default is None or own.score is None or default.score is None:
        return None
    return math.expm1(own.score.value - default.score.value)


def _per_model(record: CombinationRecord, name: str) -> str:
    figures = record.combined() or {}
    tp, p99 = figures.get(f"{name}throughput"), figures.get(f"{name}p99_ms")
    return "-" if tp is None else f"{tp.value:.1f} infer/s" + ("" if p99 is None else f", p99 {p99.value:.1f} ms")


def render_combination_summary(result: CombinationResult) -> list[str]:
    """What a tune of several models found, in words, then the top combinations."""
    spec, study, ranking = result.spec, result.study, result.ranking
    constraints = ", ".join(map(str, spec.constraints)) or "none"
    if study.endpoint is None:
        what = "models " + ", ".join(f"'{n}' (weight {w:.2g})" for n, w in study.weights) + ", measured concurrently"
    else:
        what = f"{study.mode} '{study.endpoint.name}' over " + ", ".join(f"'{m.name}'" for m in study.members)
    lines = [
        f"perfkit tune of {what}: {spec.search} search, {spec.objective.describe()}, constraints: {constraints}",
        f"{len(result.records)} combinations measured "
        f"({sum(len(r.levels) for r in result.records.values())} load levels) out of a grid of {result.space.size}.",
    ]
    if not result.completed:
        lines.append(
            provisional(result.completed) + (f" It stopped: {result.stop_reason}" if result.stop_reason else "")
        )
    best = result.best
    if ranking is None or best is None:
        lines.append(nothing_recommended(ranking, "combination"))
    else:
        lines.append(f"Best (at concurrency {best.chosen_concurrency()}):")
        prefix = "" if study.endpoint is not None else "{}/"
        for name, variant in best.combination.variants:
            shown = f"; {_per_model(best, prefix.format(name))}" if study.endpoint is None else ""
            lines.append(f"  {name}: {variant.key} ({variant.describe()}){shown}")
        if study.endpoint is not None:
            lines.append(f"  {study.endpoint.name}: {_per_model(best, '')}")
        scores = _scores(ranking)
        if best.combination.key == result.default_key:
            lines.append("  The default configurations are the best: no combination beat them.")
        elif best.combination.key in scores and result.default_key in scores:
            d = difference(scores[best.combination.key], scores[result.default_key])
            told = versus_default(d, "better on the objective", "the default configurations")
            lines.append(f"  {'That is' if d.significant else 'It is'} {told}.")
    lines += ["", "rank  status      score    combination"]
    entries = () if ranking is None else ranking.entries
    scores = {} if ranking is None else _scores(ranking)
    for i, e in enumerate(entries):
        assert ranking is not None
        if i >= spec.top and e.key != ranking.best:
            continue
        score = "-" if e.score is None else f"{e.score.value:7.3f}"
        default = " [default]" if e.key == result.default_key else ""
        broken = f"  ({'; '.join(e.violations)})" if e.violations else ""
        marked = "" if e.status != "feasible" else mark(
            e.key, best=ranking.best, leader=ranking.leader, ties=ranking.tie, remeasured=result.leaders, scores=scores
        )  # fmt: skip
        lines.append(
            f"{i + 1:<5} {e.status:<11} {score:>7}  {e.key}{default}{f' ({marked})' if marked else ''}{broken}"
        )
    return lines


def render_combination_json(result: CombinationResult, argv: list[str]) -> str:
    """tune.json of a tune of several models: the study, every combination with its levels, the ranking."""
    spec, study, ranking = result.spec, result.study, result.ranking
    combinations = []
    for key, r in result.records.items():
        combinations.append({
            "key": key, "is_default": r.default, "status": r.status, "error": r.error,
            "variants": {name: v.key for name, v in r.combination.variants}, "configs": r.configs,
            "levels": [{name: to_jsonable(lv) for name, lv in levels.items()} for levels in r.levels],
            "level_figures": [_estimates(f) for f in r.figures],
            "chosen_concurrency": r.chosen_concurrency(), "figures": _estimates(r.chosen_figures()),
            "remeasures": [_estimates(f) for f in r.remeasures], "combined_figures": _estimates(r.combined()),
        })  # fmt: skip
    entries = [] if ranking is None else [
        {"rank": i + 1, "key": e.key, "status": e.status, "violations": list(e.violations),
         "score": None if e.score is None else {"value": e.score.value, "low": e.score.low, "high": e.score.high},
         "gain_over_default": _combination_gain(result, e.key)}
        for i, e in enumerate(ranking.entries)
    ]  # fmt: skip
    best = result.best
    doc = {
        "schema_version": 1, "kind": "tune_combination", "perfkit_version": __version__,
        "started_at": result.started_at, "argv": argv, "mode": study.mode,
        "models": [m.name for m in study.members], "endpoint": None if study.endpoint is None else study.endpoint.name,
        "weights": dict(study.weights),
        "settings": {
            "url": spec.target.url, "protocol": spec.target.protocol, "search": spec.search,
            "search_budget": spec.budget or None, "objective": dict(result.objective.weights),
            "constraints": [str(c) for c in result.constraints], "concurrency_range": list(spec.concurrency),
            "space": asdict(spec.space), "windows": asdict(spec.windows), "leaders": spec.leaders,
            "remeasure_rounds": spec.remeasure_rounds,
        },
        "space": {"shape": list(result.space.shape), "size": result.space.size},
        "default": result.default_key, "combinations": combinations, "ranking": entries, "leaders": result.leaders,
        "leader": None if ranking is None else ranking.leader, "ties": [] if ranking is None else list(ranking.tie),
        "best": None if best is None else best.combination.key, "best_configs": None if best is None else best.configs,
        "measurements": {
            "combinations": len(result.records),
            "levels": sum(len(r.levels) + len(r.remeasure_levels) for r in result.records.values()),
            "measured_in_this_run": sum(r.measured for r in result.records.values()),
        },
        "completed": result.completed, "stop_reason": result.stop_reason,
    }  # fmt: skip
    return json.dumps(doc, indent=1)


COMBINATION_COLUMNS = [
    "combination", "is_default", "model", "variant", "status", "phase", "chosen", "feasible", "violations", "error",
]  # fmt: skip


def render_combination_csv(result: CombinationResult) -> str:
    """One row per combination × measured model × level (re-measurements: phase 'remeasure'); a
    level's feasibility is the combination's, judged on every model's figures at once."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COMBINATION_COLUMNS + tidy_header())
    blank = [""] * len(tidy_header())
    spec, study = result.spec, result.study
    for r in result.records.values():
        variants = dict(r.combination.variants)
        head = [r.combination.key, str(r.default).lower()]
        levels = [*r.levels, *r.remeasure_levels]
        if not levels:
            writer.writerow([*head, "", "", r.status, "search", "false", "", "", r.error, *blank])
            continue
        for model in study.measured:
            own = [lv[model.name] for lv in levels]
            sweep = SweepResult(model.name, "", "", spec.target.protocol, "concurrency", tuple(own), {})
            rows = list(csv.reader(io.StringIO(render_tidy_csv(sweep))))[1:]
            for i, row in enumerate(rows):
                figures = level_figures(study, levels[i])
                broken = ["no successful request"] if figures is None else violations(figures, result.constraints)
                variant = variants.get(model.name)
                writer.writerow([
                    *head, model.name, "" if variant is None else variant.key, r.status,
                    "search" if i < len(r.levels) else "remeasure", str(i == r.chosen).lower(),
                    str(not broken).lower(), "; ".join(broken), r.error, *row,
                ])  # fmt: skip
    return out.getvalue()
