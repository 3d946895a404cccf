"""A generative run counts requests (one completion each), so every place that names its
throughput says req/s, as the console's sweep table does: `perfkit compare`'s table (console and
HTML) when both runs are generative, and the SLO gate's capacity line. An inference run keeps
infer/s, and so does a comparison of a generative run with an inference one. And the note of a
generative run without --streaming says what it measures in a whole sentence."""

from __future__ import annotations

import dataclasses

import pytest

from perfkit.analysis.compare import Thresholds, compare_sweeps
from perfkit.analysis.slo import check_slo
from perfkit.genai.records import unstreamed_note
from perfkit.report import figures
from perfkit.report.compare_text import comparison_rows, render_comparison_lines
from perfkit.report.html.comparison import render_comparison_section
from perfkit.results.files import ReportItem
from perfkit.results.model import SweepResult
from tests.synthetic import make_level, make_sweep, make_token_figures

GATES = Thresholds(metrics=("throughput", "p99"))


def _generative(speed: float = 1.0) -> SweepResult:
    levels = [
        dataclasses.replace(make_level(c, [5.0 * c * speed] * 3), tokens=make_token_figures(1 + c / 8))
        for c in (1, 2)
    ]
    return make_sweep(levels, model="sim_llm")


def _inference(speed: float = 1.0) -> SweepResult:
    return make_sweep([make_level(c, [500.0 * c * speed] * 3) for c in (1, 2)], model="sim_llm")


def _throughput_metrics(base: SweepResult, cand: SweepResult) -> set[str]:
    header, rows = comparison_rows(compare_sweeps(base, cand, GATES))
    return {row[header.index("metric")] for row in rows if row[header.index("metric")].startswith("throughput")}


def test_the_comparison_of_two_generative_runs_counts_requests() -> None:
    assert _throughput_metrics(_generative(), _generative(0.9)) == {"throughput req/s"}
    lines = render_comparison_lines(compare_sweeps(_generative(), _generative(0.9), GATES))
    assert any("throughput req/s" in line for line in lines) and not any("infer/s" in line for line in lines)


def test_the_html_comparison_of_two_generative_runs_counts_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("throughput_vs_load", "latency_vs_load", "throughput_vs_p99"):  # the table is the point
        monkeypatch.setattr(figures, name, lambda *args, **kwargs: b"")
    items = [ReportItem(name, "sweep", run, f"{name}.json") for name, run in (("a", _generative()), ("b", _generative(0.9)))]
    section = render_comparison_section(items, GATES, None)
    assert "<td>throughput req/s</td>" in section and "infer/s" not in section


def test_the_comparison_of_inference_runs_or_of_mixed_runs_counts_inferences() -> None:
    assert _throughput_metrics(_inference(), _inference(0.9)) == {"throughput infer/s"}
    assert _throughput_metrics(_inference(), _generative()) == {"throughput infer/s"}


def test_the_slo_capacity_of_a_generative_run_is_in_requests_per_second() -> None:
    line = check_slo(_generative(), 1e6, 1.0).lines()[0]
    assert "capacity 10.0 req/s at concurrency 2" in line and "(needs 1.0 req/s within the SLO)" in line
    assert "infer/s" not in line
    assert "capacity 1,000.0 infer/s" in check_slo(_inference(), 1e6).lines()[0]


def test_the_unstreamed_note_says_what_is_measured_in_a_whole_sentence() -> None:
    note = unstreamed_note("chat", streaming=False)
    assert note.endswith("only request latency and tokens/s are measured")
    assert unstreamed_note("chat", streaming=True) == "" and unstreamed_note("embeddings", streaming=False) == ""
