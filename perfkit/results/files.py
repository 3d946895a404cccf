"""perfkit's result files: reading a JSON result of any kind (writing any file: results/writing.py).

Every result file says what it is with a top-level `kind` ("sweep", "tune", "tune_combination"); sweep files written
before `kind` existed are recognised by their `levels`. `load_result` dispatches on the kind
through `LOADERS`, so a new kind of result is one loader here and one section in `report.py`.

A tune (`perfkit tune`'s tune.json) is read into `TuneView`, the little the report needs; a tune of
several models into one too, over its combinations, with a `per_model` view of each measured model.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfkit.errors import PerfkitError
from perfkit.results.model import SweepResult, sweep_from_json
from perfkit.results.writing import write_text_atomic  # here too: every command's writer

__all__ = [
    "LOADERS",
    "ReportItem",
    "TuneView",
    "VariantView",
    "load_result",
    "slo_from_sweep",
    "tune_view_from_json",
    "write_text_atomic",
]


@dataclass(frozen=True, slots=True)
class VariantView:
    """One configuration a tune measured, with its figures at the concurrency the tune chose."""

    name: str
    params: dict[str, Any]
    throughput_infer_per_s: float | None
    p99_ms: float | None
    default: bool = False
    status: str = "feasible"  # feasible | infeasible | failed
    rank: int | None = None
    gain: float | None = None  # over the default, as a fraction (0.5: 50 % better)
    description: str = ""
    concurrency: int | None = None
    violations: tuple[str, ...] = ()
    sweep: SweepResult | None = None  # its levels, as a sweep over concurrency
    score: tuple[float, float, float] | None = None  # the ranking's score: (value, low, high), log scale
    throughput_ci: tuple[float, float] | None = None  # the 95 % interval of throughput_infer_per_s

    @property
    def feasible(self) -> bool:
        return self.status == "feasible"


@dataclass(frozen=True, slots=True)
class TuneView:
    """What the report needs from a tune: its variants, objective, constraints and verdict."""

    model: str
    variants: tuple[VariantView, ...]
    objective: str = "throughput"
    constraints: tuple[str, ...] = ()
    constraint_p99_ms: float | None = None
    measurements: int = 0
    best: str | None = None  # the recommended variant
    ties: tuple[str, ...] = ()  # variants whose score intervals overlap the leader's
    leader: str | None = None  # the highest score
    remeasured: tuple[str, ...] = ()  # the leaders re-measured, interleaved, before the verdict
    completed: bool = True  # False: the tune stopped early, and its ranking is provisional
    provenance: dict[str, Any] = field(default_factory=dict)
    #: A tune of several models: each measured model's figures of the same combinations (its own
    #: throughput and p99, its levels as a sweep); the variants above carry the combined figures.
    per_model: tuple[TuneView, ...] = ()

    def ranked(self) -> list[VariantView]:
        """The tune's own ranking when it has one, else feasible first by throughput."""
        return sorted(
            self.variants,
            key=lambda v: (
                v.rank if v.rank is not None else 1 << 30,
                not v.feasible,
                -(v.throughput_infer_per_s or 0.0),
            ),
        )


@dataclass(frozen=True, slots=True)
class ReportItem:
    label: str
    kind: str  # a key of LOADERS (and of report.SECTIONS)
    result: SweepResult | TuneView
    source: str = ""


def _sweep_from_data(data: dict[str, Any], source: str) -> SweepResult:
    return sweep_from_json(json.dumps(data), source)


_P99_BOUND = re.compile(r"^\s*(p99_ms|latency)\s*<=?\s*([0-9.]+)\s*$")


def _objective_text(weights: Any) -> str:
    if not isinstance(weights, dict) or not weights:
        return "throughput"
    if len(weights) == 1:
        return str(next(iter(weights)))
    return ", ".join(f"{name} (weight {weight:g})" for name, weight in weights.items())


def _value(figures: dict[str, Any] | None, name: str) -> float | None:
    entry = (figures or {}).get(name)
    return None if entry is None else float(entry["value"])


def _interval(entry: dict[str, Any] | None) -> tuple[float, float, float] | None:
    return None if not entry else (float(entry["value"]), float(entry["low"]), float(entry["high"]))


def tune_view_from_json(data: dict[str, Any], source: str) -> TuneView:
    """`perfkit tune`'s tune.json (report.tune_tables.render_json) as the report needs it; a missing key is named."""
    try:
        settings = data.get("settings") or {}
        constraints = tuple(str(c) for c in settings.get("constraints") or ())
        bounds = [float(m.group(2)) for m in map(_P99_BOUND.match, constraints) if m]
        ranking = {entry["key"]: entry for entry in data.get("ranking") or ()}
        header = {"schema_version": 1, "model": data["model"], "model_version": "", "url": str(settings.get("url") or ""),
                  "protocol": str(settings.get("protocol", "http")), "mode": "concurrency", "provenance": {}}  # fmt: skip
        variants = []
        for v in data["variants"]:
            entry = ranking.get(v["key"], {})
            figures = v.get("combined_figures") or v.get("figures")
            levels = v.get("levels") or []
            throughput = _interval((figures or {}).get("throughput"))
            variants.append(
                VariantView(
                    name=str(v["key"]),
                    params=dict(v.get("params") or {}),
                    throughput_infer_per_s=_value(figures, "throughput"),
                    p99_ms=_value(figures, "p99_ms"),
                    default=bool(v.get("is_default", False)),
                    status=str(entry.get("status") or v.get("status") or "failed"),
                    rank=entry.get("rank"),
                    gain=entry.get("gain_over_default"),
                    description=str(v.get("description", "")),
                    concurrency=v.get("chosen_concurrency"),
                    violations=tuple(entry.get("violations") or ()),
                    sweep=_sweep_from_data({**header, "levels": levels}, f"{source}: {v['key']}") if levels else None,
                    score=_interval(entry.get("score")),
                    throughput_ci=None if throughput is None else throughput[1:],
                )
            )
        measurements = data.get("measurements") or {}
        return TuneView(
            model=str(data["model"]),
            variants=tuple(variants),
            objective=_objective_text(settings.get("objective")),
            constraints=constraints,
            constraint_p99_ms=min(bounds) if bounds else None,
            measurements=int(measurements.get("levels", len(variants))),
            best=data.get("best"),
            ties=tuple(str(k) for k in data.get("ties") or ()),
            leader=data.get("leader"),
            remeasured=tuple(str(k) for k in data.get("leaders") or ()),
            completed=bool(data.get("completed", True)),
            provenance={k: data[k] for k in ("perfkit_version", "started_at", "argv", "server") if k in data},
        )
    except KeyError as exc:
        raise PerfkitError(f"{source}: a tune result needs the key {exc} (as perfkit tune writes tune.json)") from None


def _combination_view(data: dict[str, Any], source: str, model: str, prefix: str) -> TuneView:
    """One measured model's view of a tune of several models (prefix: "" or "MODEL/" on figure names)."""
    variants = []
    for c in data["combinations"]:
        figures = c.get("combined_figures") or c.get("figures") or {}
        own = [levels[model] for levels in c.get("levels") or () if model in levels]
        variants.append({
            "key": c["key"], "is_default": c.get("is_default", False), "status": c.get("status"),
            "description": "; ".join(f"{name}: {key}" for name, key in (c.get("variants") or {}).items()),
            "chosen_concurrency": c.get("chosen_concurrency"), "levels": own,
            "figures": {k.removeprefix(prefix): v for k, v in figures.items() if k.startswith(prefix)},
        })  # fmt: skip
    settings = dict(data.get("settings") or {})
    if prefix:  # a constraint on each model (`MODEL/p99_ms<=20`) is that model's own
        settings["constraints"] = [
            c.removeprefix(prefix) for c in settings.get("constraints") or () if c.startswith(prefix)
        ]
    return tune_view_from_json({**data, "model": model, "variants": variants, "settings": settings}, source)


def combination_view_from_json(data: dict[str, Any], source: str) -> TuneView:
    """A tune of several models (report.tune_tables.render_combination_json): the combinations ranked
    by their combined figures, and `per_model` views of each measured model's figures."""
    try:
        measured = [data["endpoint"]] if data.get("endpoint") else list(data["models"])
        prefix = "" if data.get("endpoint") else "{}/"
        per_model = tuple(_combination_view(data, source, m, prefix.format(m)) for m in measured)
        overall = _combination_view(data, source, " + ".join(measured), "")
        # The combination as a whole: its throughput summed over the models, its worst model's p99.
        p99s = [{v.name: v.p99_ms for v in view.variants} for view in per_model]
        worst: dict[str, float | None] = {}
        for v in overall.variants:
            values = [x for p in p99s if (x := p[v.name]) is not None]
            worst[v.name] = max(values) if values else None
        variants = tuple(dataclasses.replace(v, p99_ms=worst[v.name]) for v in overall.variants)
        # A model's own gain is its throughput against the default's (the tune's gain is the whole's).
        no_gain = tuple(
            dataclasses.replace(
                view, variants=tuple(dataclasses.replace(v, gain=None, score=None) for v in view.variants)
            )
            for view in per_model
        )
        return dataclasses.replace(overall, variants=variants, per_model=no_gain)
    except KeyError as exc:
        raise PerfkitError(f"{source}: a tune result needs the key {exc} (as perfkit tune writes tune.json)") from None


LOADERS: dict[str, Callable[[dict[str, Any], str], SweepResult | TuneView]] = {
    "sweep": _sweep_from_data,
    "tune": tune_view_from_json,
    "tune_combination": combination_view_from_json,
}


def load_result(path: Path, label: str | None = None) -> ReportItem:
    """Read a result file and tell its kind (`kind`, else a sweep when it has `levels`)."""
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise PerfkitError(f"cannot read {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise PerfkitError(f"{path} is not JSON ({exc}); pass a perfkit result file") from None
    if not isinstance(data, dict):
        raise PerfkitError(f"{path} is not a perfkit result file")
    kind = data.pop("kind", None) or ("sweep" if "levels" in data else "tune" if "ranking" in data else None)
    if kind not in LOADERS:
        raise PerfkitError(f"{path}: unknown result kind {kind!r}; perfkit reports {', '.join(LOADERS)} results")
    try:
        result = LOADERS[kind](data, str(path))
    except (TypeError, ValueError) as exc:
        raise PerfkitError(f"{path}: not a readable {kind} result ({exc})") from None
    return ReportItem(label or path.stem, kind, result, str(path))


def slo_from_sweep(result: SweepResult) -> float | None:
    """The sweep's own p99 bound: `-l MS` when it stabilised on `--percentile 99`."""
    spec = result.provenance.get("spec") or {}
    threshold = (spec.get("load") or {}).get("latency_threshold_ms") or 0.0
    percentile = (spec.get("windows") or {}).get("percentile")
    return float(threshold) if threshold > 0 and percentile == 99 else None
