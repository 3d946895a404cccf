"""A tune's section of the HTML report: a sentence on the best configuration's gain over the default
(claimed only when it is significant, in `tune.verdict`'s words, as the console says it), the ranked
table with each variant's CI and difference to the default, the throughput–p99 Pareto plot of every
variant with the constraint, and the top variants' curves; a tune of several models
(`tune_combination`) the same over combinations, then each model's.
"""

from __future__ import annotations

from perfkit.report import figures
from perfkit.report.html.cells import Badge, anchor, esc, fmt, img, render_table
from perfkit.results.files import ReportItem, TuneView, VariantView
from perfkit.tune.verdict import TIE_RULE, Score, difference, mark, provisional, versus_default

__all__ = ["render_tune_section"]


def _gain(view: TuneView, variant: VariantView) -> float | None:
    """The tune's own gain over the default (a fraction), else the throughput ratio."""
    if variant.gain is not None:
        return float(variant.gain)
    default = next((v for v in view.variants if v.default), None)
    if default is None or not default.throughput_infer_per_s or variant.throughput_infer_per_s is None:
        return None
    return variant.throughput_infer_per_s / default.throughput_infer_per_s - 1


def _best(view: TuneView) -> VariantView | None:
    by_name = {v.name: v for v in view.variants}
    if view.best is not None:
        return by_name.get(view.best)
    ranked = view.ranked()
    return ranked[0] if ranked and ranked[0].feasible else None


def _scores(view: TuneView) -> dict[str, Score]:
    return {v.name: v.score for v in view.variants if v.score is not None}


def _versus(view: TuneView, variant: VariantView, default: VariantView) -> str:
    """`variant` against the default: with the tune's intervals, a gain only when it is significant
    (`verdict.versus_default`, as the console says it); from a tune.json without them, the point
    difference, said to be one."""
    scores = _scores(view)
    if variant.name in scores and default.name in scores:
        return versus_default(difference(scores[variant.name], scores[default.name]))
    gain = _gain(view, variant)
    if gain is None:
        return "not compared with the default configuration (no figures)"
    return (
        f"{abs(gain) * 100:.0f}% {'better' if gain >= 0 else 'worse'} than the default configuration by its "
        "point figures (this tune.json has no intervals to tell whether that is noise)"
    )


def _gain_sentence(view: TuneView) -> str:
    """model_analyzer's summary sentence (reports/report_manager.py), told with the tune's ties, and
    claiming a gain only when it is significant."""
    best = _best(view)
    constraints = f", under {', '.join(view.constraints)}" if view.constraints else ""
    measured = f"In {view.measurements} measurements across {len(view.variants)} configurations"
    if best is None:
        if not any(v.status == "infeasible" for v in view.variants):
            return f"{measured}, every configuration failed: nothing to recommend."
        return f"{measured}, no configuration met the constraints{constraints}."
    at = f" ({fmt(best.throughput_infer_per_s, 1)} infer/s, p99 {fmt(best.p99_ms)} ms"
    at += f" at concurrency {best.concurrency})" if best.concurrency is not None else ")"
    goal = f"at maximizing {view.objective}{constraints}"
    if best.default:
        return f"{measured}, the default configuration {best.name} is the best {goal}{at}."
    default = next((v for v in view.variants if v.default), None)
    if default is None:
        return f"{measured}, {best.name} is the best {goal}{at}; no default configuration was measured."
    versus = _versus(view, best, default)
    if len(view.ties) > 1:
        return (
            f"{measured}, {len(view.ties)} configurations tie for the best {goal}; {best.name}, the one that uses "
            f"the fewest resources, is {versus}{at}."
        )
    return f"{measured}, {best.name} is {versus} {goal}{at}."


def _versus_cell(view: TuneView, v: VariantView, scores: dict[str, Score], default: str | None) -> str:
    """The table's difference to the default with its interval, as the console prints it."""
    if v.default:
        return "-"
    if default is not None and v.name in scores and default in scores:
        return str(difference(scores[v.name], scores[default]))
    gain = _gain(view, v)  # a tune.json without intervals, or one model's own figures
    return "-" if gain is None else f"{gain * 100:+.0f} %"


def _tune_table(view: TuneView, best: VariantView | None) -> str:
    rows = []
    scores = _scores(view)
    default = next((v.name for v in view.variants if v.default), None)
    for i, v in enumerate(view.ranked(), 1):
        marked = "" if not v.feasible else mark(
            v.name, best=best.name if best else None, leader=view.leader, ties=view.ties,
            remeasured=view.remeasured, scores=scores,
        )  # fmt: skip
        status = (
            v.status + (f" ({marked})" if marked else "") + ("; " + "; ".join(v.violations) if v.violations else "")
        )
        ci = v.throughput_ci
        rows.append([
            v.rank or i, v.name + (" (default)" if v.default else "") + (" ★" if v is best else ""),
            v.description or ", ".join(f"{k}={val}" for k, val in v.params.items()),
            "-" if v.concurrency is None else str(v.concurrency), fmt(v.throughput_infer_per_s, 1),
            "-" if ci is None else f"{ci[0]:,.1f} – {ci[1]:,.1f}", fmt(v.p99_ms),
            _versus_cell(view, v, scores, default), Badge(status, v.feasible),
        ])  # fmt: skip
    header = ["rank", "variant", "configuration", "concurrency", "throughput infer/s", "95% CI", "p99 ms",
              "vs default (95% CI)", "status"]  # fmt: skip
    return f'<div class="scroll">{render_table(header, rows)}</div>'


def _tune_figures(view: TuneView, best: VariantView | None, constraint: float | None, top_n: int) -> list[str]:
    """The Pareto plot of every variant, and the curves of the top N, the best and the default."""
    ranked = view.ranked()
    points = [
        figures.Point(v.name, v.p99_ms, v.throughput_infer_per_s, v.default, v is best)
        for v in view.variants
        if v.p99_ms is not None and v.throughput_infer_per_s is not None
    ]
    drawn = [img(figures.pareto(points, constraint), "throughput vs p99 of every variant")] if points else []
    shown = [*ranked[:top_n], *(v for v in ranked if v is best or v.default)]  # the top N, the best, the default
    unique = [v for i, v in enumerate(shown) if not any(v is w for w in shown[:i])]
    top = [(v.name, v.sweep) for v in unique if v.sweep is not None]
    if top:
        drawn += [
            img(figures.throughput_vs_p99(top, constraint), "throughput vs p99 of the top variants"),
            img(figures.throughput_vs_load(top), "throughput vs concurrency of the top variants"),
        ]
    return drawn


def render_tune_section(item: ReportItem, slo_ms: float | None = None, top_n: int = 3) -> str:
    """A tune; of several models (`per_model`), each measured model's own table and figures follow."""
    view = item.result
    assert isinstance(view, TuneView)
    best = _best(view)
    constraint = view.constraint_p99_ms or slo_ms
    drawn = _tune_figures(view, best, constraint, top_n)
    models = "".join(
        f"<h3>{esc(own.model)}, best first</h3>{_tune_table(own, _best(own))}"
        f'<div class="grid">{"".join(_tune_figures(own, _best(own), constraint, top_n))}</div>'
        for own in view.per_model
    )
    command = " ".join(str(a) for a in view.provenance.get("argv", []))
    unfinished = provisional(view.completed)  # the console's rule and words
    return (
        f'<section id="{esc(anchor(item))}"><h2>{esc(f"Tune of {view.model}")} <span class="muted">{esc(item.label)}</span></h2>'
        f'<div class="verdict {"ok" if best and not unfinished else "bad"}"><div class="title">{esc(_gain_sentence(view))}</div>'
        + (f'<div class="provisional">{esc(unfinished)}</div>' if unfinished else "") + "</div>"
        f'<h3>Configurations, best first</h3>{_tune_table(view, best)}<p class="note">{esc(TIE_RULE)}</p>'
        + (f'<h3>Figures</h3><div class="grid">{"".join(drawn)}</div>' if drawn else "") + models
        + (f'<p class="note">{esc("perfkit " + command)}</p>' if command else "")
        + "</section>"
    )  # fmt: skip
