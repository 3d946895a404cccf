"""perfkit.analysis.metrics: the one catalogue. Every metric answers to its canonical name and every
alias in `perfkit tune`, `perfkit compare` (flag and scenario file) and the tidy CSV, and each of
them reads the catalogue's one getter."""

from __future__ import annotations

import csv
import dataclasses
import io
from pathlib import Path

import pytest

from perfkit.analysis.compare import GATE_METRICS, Thresholds, compare_sweeps
from perfkit.analysis.metrics import METRICS, Metric, find, metric
from perfkit.cli import main
from perfkit.cli.scenario import parse_scenario
from perfkit.errors import PerfkitError
from perfkit.report.tidy import TIDY_COLUMNS, render_tidy_csv
from perfkit.results.model import LatencyStats, ResponseStats, SessionFigures, ValueStats
from perfkit.tune.objectives import FIGURES, figures_of, parse_constraint, parse_objective
from tests.synthetic import make_level, make_sweep, make_token_figures, steady_sweep, write_sweep_json

# Streamed, generative, with sessions and a sequence model's, so that the response, token,
# per-session and per-sequence figures have values too.
_TIMES = LatencyStats(count=100, mean_us=1500.0, p50_us=1000.0, p90_us=2000.0, p99_us=3000.0, max_us=4000.0)
SWEEP = make_sweep([
    dataclasses.replace(
        make_level(1, [100.0, 101.0, 99.0], mode="request_rate", gpu=True, p99_ms=3.0),
        responses=ResponseStats(400, 4.0, 400.0, _TIMES, _TIMES),
        tokens=make_token_figures(),
        sequence_count=30, sequence_throughput_per_s=10.0,
        sequence_latency=LatencyStats(count=30, mean_us=9000.0, max_us=15000.0, p50_us=8000.0, p90_us=12000.0,
                                      p95_us=13000.0, p99_us=14000.0),
        sessions=SessionFigures(20, 19, 6.5, ValueStats(20, 3.0, 0.5, 2.0, 4.0, 3.0, 4.0, 4.0, 4.0),
                                ValueStats(19, 900.0, 90.0, 700.0, 1200.0, 880.0, 1000.0, 1100.0, 1180.0)),
    )
])  # fmt: skip
LEVEL = SWEEP.levels[0]
TIDY = {column.name for column in TIDY_COLUMNS}
SPELLINGS = [(m, spelling) for m in METRICS for spelling in m.spellings]


def _id(case: tuple[Metric, str]) -> str:
    return case[1]


def test_names_are_unique_and_every_metric_has_a_reader() -> None:
    spellings = [spelling for m in METRICS for spelling in m.spellings]
    assert len(spellings) == len(set(spellings))
    for m in METRICS:
        assert m.name in TIDY or m.gate or m.figure, f"{m.name}: nothing reads it"
        assert metric(m.name) is m


@pytest.mark.parametrize("case", SPELLINGS, ids=map(_id, SPELLINGS))
def test_every_spelling_finds_its_metric(case: tuple[Metric, str]) -> None:
    m, spelling = case
    assert find(spelling) is m
    assert find(f" {spelling.upper()} ") is m


@pytest.mark.parametrize("case", SPELLINGS, ids=map(_id, SPELLINGS))
def test_tune_reaches_every_spelling_of_its_figures(case: tuple[Metric, str]) -> None:
    m, spelling = case
    if m.figure is None:
        with pytest.raises(PerfkitError, match="unknown figure"):
            parse_objective(spelling)
        return
    assert FIGURES[m.figure] is m
    assert parse_objective(spelling).weights == ((m.figure, 1.0),)
    assert parse_constraint(f"{spelling}<=1").metric == m.figure
    figures = figures_of(LEVEL)
    assert figures is not None and figures[m.figure].value == m.value(LEVEL)


@pytest.mark.parametrize("case", SPELLINGS, ids=map(_id, SPELLINGS))
def test_compare_reaches_every_spelling_of_its_gates(case: tuple[Metric, str]) -> None:
    m, spelling = case
    thresholds = Thresholds(metrics=(spelling,))
    if m.gate is None:
        with pytest.raises(PerfkitError, match="choose from"):
            thresholds.validate()
        return
    assert GATE_METRICS[m.gate] is m
    (delta,) = compare_sweeps(SWEEP, SWEEP, thresholds).deltas
    # SWEEP is generative: its throughput counts requests (both runs are), every other unit is the catalogue's
    unit = "req/s" if m.unit == "infer/s" else m.unit
    assert (delta.metric, delta.unit, delta.baseline) == (m.gate, unit, m.value(LEVEL))
    where = Path("gate.toml")
    assert parse_scenario({"gates": {"metrics": [spelling]}}, where).gates.thresholds.metrics == (spelling,)


@pytest.mark.parametrize("case", SPELLINGS, ids=map(_id, SPELLINGS))
def test_the_tidy_csv_has_every_spelling_of_its_metrics(case: tuple[Metric, str]) -> None:
    m, spelling = case
    found = find(spelling)
    if m.name not in TIDY:
        return
    assert found is not None
    column = next(c for c in TIDY_COLUMNS if c.name == found.name)
    assert (column.unit, column.getter(SWEEP, LEVEL)) == (m.unit, m.value(LEVEL))
    row = next(csv.DictReader(io.StringIO(render_tidy_csv(SWEEP))))
    assert float(row[found.name]) == pytest.approx(m.value(LEVEL), abs=1e-6)


def test_compare_command_takes_any_spelling_and_prints_the_gate_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = write_sweep_json(steady_sweep(), tmp_path / "base.json")
    assert main(["compare", str(base), str(base), "--metric", "p99_ms", "throughput_infer_per_s", "p99"]) == 0
    table = capsys.readouterr().out
    assert "p99 ms" in table and "throughput infer/s" in table and "p99_ms" not in table
    assert "no regression in 9 comparisons" in table
    with pytest.raises(SystemExit) as exit_info:
        main(["compare", str(base), str(base), "--metric", "gpu_memory_mb"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'gpu_memory_mb'" in err and "p99_from_intended" in err
