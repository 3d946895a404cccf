"""The generative report's words and legends: a generative run's throughput is in requests/s (the
console's "req/s"), never "infer/s", with the peak level's output tokens/s beside it; an inference
run keeps "infer/s"; the generative figures put their legends under the axes, where they cover no
curve."""

from __future__ import annotations

import dataclasses
import html as html_text
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from matplotlib.figure import Figure

from perfkit.analysis.compare import Thresholds
from perfkit.analysis.metrics import throughput_unit
from perfkit.report import figures
from perfkit.report.figures import canvas, generative
from perfkit.report.html.comparison import render_comparison_section
from perfkit.report.html.sweep import _TOKEN_TABLE, _kpis, _level_rows, _verdict, _workers_table
from perfkit.results.files import ReportItem
from perfkit.results.model import SweepResult, TokenFigures
from tests.synthetic import make_level, make_sweep, make_token_figures

CARD = re.compile(r'<div class="k">peak throughput</div><div class="v">([^<]*)</div><div class="s">([^<]*)</div>')


def _generative() -> SweepResult:
    levels = [
        dataclasses.replace(make_level(c, [5.0 * c] * 3), tokens=make_token_figures(1 + c / 8)) for c in (1, 2, 4)
    ]
    return make_sweep(levels, model="sim_llm")


def _inference() -> SweepResult:
    return make_sweep([make_level(c, [500.0 * c] * 3) for c in (1, 2, 4)])


def _card(result: SweepResult) -> tuple[str, str]:
    match = CARD.search(_kpis(result))
    assert match is not None
    return html_text.unescape(match[1]), html_text.unescape(match[2])


def test_a_generative_run_says_requests_per_second_with_output_tokens_beside_the_peak() -> None:
    result = _generative()
    peak = result.levels[-1]
    assert peak.tokens is not None
    assert _card(result) == ("20.0 req/s", f"{peak.tokens.output_tokens_per_s:,.1f} output tokens/s at concurrency 4")
    header, _ = _level_rows(result)
    assert header[1] == "throughput req/s (95% CI)"
    assert "infer/s" not in _kpis(result) + " ".join(header)
    assert "req/s" in _workers_table(result.levels, throughput_unit(result))
    assert throughput_unit(result) == "req/s"


def test_an_inference_run_keeps_inferences_per_second() -> None:
    result = _inference()
    assert _card(result) == ("2,000.0 infer/s", "at concurrency 4")
    header, _ = _level_rows(result)
    assert header[1] == "throughput infer/s (95% CI)" and "req/s" not in " ".join(header)
    assert throughput_unit(result) == "infer/s"
    assert throughput_unit(result, _generative()) == "infer/s or req/s"  # drawn together


def test_the_comparison_of_generative_runs_names_their_peak_in_requests_per_second(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("throughput_vs_load", "latency_vs_load", "throughput_vs_p99"):  # the table is the point
        monkeypatch.setattr(figures, name, lambda *args, **kwargs: b"")
    items = [ReportItem(label, "sweep", _generative(), f"{label}.json") for label in ("a", "b")]
    runs_table = render_comparison_section(items, Thresholds(), None).split("</table>")[0]
    assert '<th class="n">peak req/s</th>' in runs_table and "infer/s" not in runs_table


def _figures(monkeypatch: pytest.MonkeyPatch) -> list[Figure]:
    """Every figure the drawing functions finish, instead of its PNG."""
    drawn: list[Figure] = []

    def keep(fig: Figure) -> bytes:
        drawn.append(fig)
        return b""

    monkeypatch.setattr(canvas, "png", keep)
    return drawn


def _labels(fig: Figure) -> list[str]:
    return [ax.get_ylabel() for ax in fig.axes] + [ax.get_xlabel() for ax in fig.axes]


def test_the_throughput_figures_label_a_generative_run_in_requests_per_second(monkeypatch: pytest.MonkeyPatch) -> None:
    drawn = _figures(monkeypatch)
    run = _generative()
    figures.throughput_vs_load([("run", run)])
    figures.throughput_vs_p99([("run", run)])
    figures.windows_over_run(run)
    figures.throughput_vs_load([("run", _inference())])
    labels = [_labels(fig) for fig in drawn]
    assert all("throughput (req/s)" in found for found in labels[:3]), labels
    assert "throughput (infer/s)" in labels[3]


DRAWINGS: list[tuple[str, Callable[[SweepResult], bytes]]] = [
    (alt, draw) for alt, draw, _ in generative.figures_of(_generative())
]


@pytest.mark.parametrize(("alt", "draw"), DRAWINGS, ids=[alt for alt, _ in DRAWINGS])
def test_a_generative_figure_puts_its_legend_under_the_axes(
    alt: str, draw: Callable[[SweepResult], bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    drawn = _figures(monkeypatch)
    draw(_generative())
    (fig,) = drawn
    assert all(ax.get_legend() is None for ax in fig.axes), f"{alt}: a legend inside the axes"
    (legend,) = fig.legends
    renderer: Any = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    box = legend.get_window_extent(renderer)
    boxes = [ax.get_tightbbox(renderer) for ax in fig.axes]  # ticks and the x axis's label included
    lowest = min(b.y0 for b in boxes if b is not None)
    assert box.y1 <= lowest + 1, f"{alt}: the legend overlaps the axes"
    texts = [t.get_text() for t in legend.get_texts()]
    if "distribution" in alt or "input length" in alt:
        assert texts == ["concurrency 1", "concurrency 2", "concurrency 4"], texts  # named in full: no title


@pytest.mark.parametrize("draw", [generative.tokens_vs_latency, generative.goodput_vs_load])
def test_a_twin_axes_figure_draws_no_line_along_its_top_edge(
    draw: Callable[[SweepResult], bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flat line autoscaled to the top edge (a per-user rate, 100 % of requests within the
    objectives) is drawn on the frame, and the two axes' highest points would coincide."""
    drawn = _figures(monkeypatch)
    draw(_generative())
    (fig,) = drawn
    for ax in fig.axes:
        top = ax.get_ylim()[1]
        for line in ax.get_lines():
            ys = np.asarray(line.get_ydata(), dtype=np.float64)
            if ys.size:
                assert ys.max() <= 0.9 * top, f"{line.get_label()} runs along the top"


def test_an_unstreamed_run_leaves_out_the_ttft_and_itl_figures_and_columns_it_has_no_figure_for() -> None:
    """Chat without --streaming: no TTFT or ITL, so no empty distribution, panel or scatter saying
    "it needs --streaming" four times (the Tokens section says it once), no column of "-", and the
    verdict does not claim their percentiles were judged."""

    def unstreamed(tokens: TokenFigures) -> TokenFigures:
        none = dataclasses.replace(tokens.ttft_ms, count=0)
        sample = tokens.sample
        assert sample is not None
        kept = len(sample.ttft_ms)
        sample = dataclasses.replace(sample, ttft_ms=(None,) * kept, itl_ms=(None,) * kept)
        return dataclasses.replace(tokens, streaming=False, ttft_ms=none, ttst_ms=none, itl_ms=none, sample=sample)

    run = _generative()
    plain = make_sweep([dataclasses.replace(lv, tokens=unstreamed(lv.tokens)) for lv in run.levels if lv.tokens])
    assert [alt for alt, *_ in generative.figures_of(plain)] == [
        "output tokens/s, total and per user, vs latency",
        "goodput vs load",
    ]
    header, _ = _level_rows(plain, _TOKEN_TABLE)
    assert not [title for title in header if "TTFT" in title or "ITL" in title or "TTST" in title], header
    assert "p90 of latency" in _verdict(plain) and "TTFT" not in _verdict(plain)
    assert len(generative.figures_of(run)) == 6 and "p90 of TTFT, ITL and latency" in _verdict(run)
