"""The report's figures keep out of their own way: legends outside the data, an outlier that does not
squash the region that matters, labels that avoid the points, no empty errors chart, a utilisation
figure that names memory only when it draws some, and a level table without a column per CI."""

from __future__ import annotations

import re
from typing import Any

import pytest
from matplotlib.figure import Figure

from perfkit.report import figures as report_figures
from perfkit.report.figures import canvas
from perfkit.report.html import render_html
from perfkit.results.files import ReportItem
from tests.synthetic import make_level, make_sweep, steady_sweep


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch) -> list[Figure]:
    """The figures the plots build, kept instead of drawn to PNG."""
    kept: list[Figure] = []

    def keep(fig: Figure) -> bytes:
        fig.canvas.draw()
        kept.append(fig)
        return b"\x89PNG\r\n\x1a\n"

    monkeypatch.setattr(canvas, "png", keep)
    return kept


def _bbox(artist: Any, fig: Figure) -> Any:
    return artist.get_window_extent(fig.canvas.get_renderer())


@pytest.mark.parametrize("draw", ["throughput_vs_load", "latency_vs_load", "throughput_vs_p99"])
def test_a_comparison_s_legend_is_outside_the_axes(draw: str, figures: list[Figure]) -> None:
    getattr(report_figures, draw)([("before", steady_sweep()), ("after", steady_sweep(0.9))])
    fig = figures[-1]
    (ax,) = fig.axes
    assert ax.get_legend() is None and len(fig.legends) == 1
    legend, frame = _bbox(fig.legends[0], fig), ax.get_tightbbox(fig.canvas.get_renderer())
    assert legend.y1 < frame.y0, "the legend overlaps the axes, its ticks or its labels"
    assert 0 <= legend.x0 and legend.x1 <= fig.bbox.x1


def test_robust_upper_leaves_out_a_far_outlier_only() -> None:
    assert report_figures.robust_upper([4.0, 6.0, 30.0]) == pytest.approx(6.0 * 1.12)
    assert report_figures.robust_upper([4.0, 6.0, 30.0], keep=[10.0]) == pytest.approx(10.0 * 1.12)
    assert report_figures.robust_upper([1.5, 2.0, 3.0, 5.0, 12.0, 80.0]) == pytest.approx(12.0 * 1.12)
    assert report_figures.robust_upper([1.0, 2.0, 3.0, 4.0, 5.0]) is None  # steady growth: nothing is far out
    assert report_figures.robust_upper([1.0, 50.0, 60.0, 70.0]) is None  # the far one is at the bottom
    assert report_figures.robust_upper([4.0, 30.0]) is None  # too few points to tell


def test_the_pareto_plot_keeps_the_region_that_matters_and_labels_clear_of_points(figures: list[Figure]) -> None:
    points = [report_figures.Point("default", 4.0, 3000.0, default=True), report_figures.Point("best", 6.0, 4500.0, best=True),
              report_figures.Point("b", 5.0, 4400.0), report_figures.Point("c", 6.3, 4300.0), report_figures.Point("outlier", 300.0, 6000.0)]  # fmt: skip
    report_figures.pareto(points, 10.0)
    fig = figures[-1]
    ax = fig.axes[0]
    assert ax.get_xlim()[1] < 15, "the outlier stretches the p99 axis"
    texts = {t.get_text(): t for t in ax.texts}
    assert "300 ms →" in texts  # drawn at the edge with its value
    renderer = fig.canvas.get_renderer()
    to_px = ax.transData.transform
    for name in ("default", "best"):
        box = texts[name].get_window_extent(renderer)
        assert ax.bbox.contains(box.x0, box.y0) and ax.bbox.contains(box.x1, box.y1)
        for p in points:
            x, y = to_px((p.p99_ms, p.throughput))
            assert not (box.x0 - 2 <= x <= box.x1 + 2 and box.y0 - 2 <= y <= box.y1 + 2), f"{name} covers {p.label}"


def test_the_errors_figure_only_when_there_are_errors_or_late_sends() -> None:
    assert not report_figures.has_errors_or_late_sends(steady_sweep())
    assert report_figures.has_errors_or_late_sends(make_sweep([make_level(1, [100.0] * 3, errors={"timeout": 1})]))
    assert report_figures.has_errors_or_late_sends(make_sweep([make_level(9, [9.0] * 3, mode="request_rate", delayed_pct=2)]))


def test_the_utilisation_figure_names_memory_only_when_it_draws_some(figures: list[Figure]) -> None:
    without = make_sweep([make_level(1, [100.0] * 3)])
    assert report_figures.utilisation_title(without) == "Utilisation over the run"
    assert report_figures.utilisation_title(steady_sweep()) == "Utilisation and GPU memory over the run"
    report_figures.utilization_over_run(steady_sweep())
    assert [ax.get_ylabel() for ax in figures[-1].axes] == ["utilisation (%)", "GPU memory (GiB)"]


def test_the_level_table_puts_each_ci_under_its_figure_and_drops_empty_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(canvas, "png", lambda fig: b"\x89PNG\r\n\x1a\n")  # the table is the point, not the figures
    levels = [make_level(r, [r * 1.0] * 5, mode="request_rate", delayed_pct=1.0) for r in (1000, 2000)]
    page = render_html([ReportItem("run", "sweep", make_sweep(levels), "run.json")])
    table = page[page.index('<table class="levels">') : page.index("</table>", page.index('<table class="levels">'))]
    headers = re.findall(r"<th[^>]*>([^<]*)</th>", table)
    assert "throughput infer/s (95% CI)" in headers and "p99 ms (95% CI)" in headers
    assert "95% CI" not in headers and "p99 95% CI" not in headers
    assert "GPU util %" not in headers  # no level measured a GPU
    assert '<span class="ci">' in table
