"""perfkit compare: the gate's threshold-and-noise rule, level matching, the console table, the
JUnit XML and the command's exit codes."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from perfkit.analysis.compare import Thresholds, compare_sweeps, parse_percent
from perfkit.analysis.slo import check_slo
from perfkit.cli import main
from perfkit.errors import PerfkitError
from perfkit.report.compare_text import render_comparison_lines
from perfkit.report.junit import comparison_cases, render_junit
from tests.synthetic import make_level, make_sweep, steady_sweep, write_sweep_json

# --------------------------------------------------------------------------------------------------
# The gate


def verdicts(comparison):  # type: ignore[no-untyped-def]
    return {(d.level, d.metric): d.verdict for d in comparison.deltas}


def test_identical_runs_do_not_regress() -> None:
    comparison = compare_sweeps(steady_sweep(), steady_sweep())
    assert not comparison.regressions
    assert set(verdicts(comparison).values()) == {"ok"}
    assert len(comparison.deltas) == 6  # 3 levels x (throughput, p99)


def test_a_drop_beyond_the_threshold_and_the_noise_is_a_regression() -> None:
    comparison = compare_sweeps(steady_sweep(), steady_sweep(0.8))
    v = verdicts(comparison)
    assert v[("concurrency 1", "throughput")] == "regression"
    assert v[("concurrency 1", "p99")] == "ok"
    throughput = next(d for d in comparison.deltas if d.metric == "throughput")
    assert throughput.change_pct == pytest.approx(-20.0)
    assert throughput.noise.method == "Mann-Whitney U" and throughput.noise.p_value == pytest.approx(2 / 252)


def test_a_drop_within_the_runs_noise_is_not_a_regression() -> None:
    # Windows spread ±40%: a 10% drop of the mean is well inside the runs' own variability.
    comparison = compare_sweeps(steady_sweep(spread=0.4), steady_sweep(0.9, spread=0.4))
    assert not comparison.regressions
    assert verdicts(comparison)[("concurrency 1", "throughput")] == "within noise"


def test_a_significant_drop_within_the_threshold_is_not_a_regression() -> None:
    comparison = compare_sweeps(steady_sweep(spread=0.001), steady_sweep(0.97, spread=0.001))
    assert not comparison.regressions
    delta = next(d for d in comparison.deltas if d.metric == "throughput")
    assert delta.noise.significant and delta.verdict == "ok"


def test_p99_regresses_only_when_the_confidence_intervals_separate() -> None:
    base = steady_sweep()
    worse = steady_sweep(p99_scale=1.5)  # CIs are ±5%: +50% separates them
    assert verdicts(compare_sweeps(base, worse))[("concurrency 2", "p99")] == "regression"
    wide = make_sweep([make_level(1, [1000.0] * 5, p99_ms=3.0, p99_ci_ms=(1.0, 6.0))])
    narrow = make_sweep([make_level(1, [1000.0] * 5, p99_ms=2.0, p99_ci_ms=(1.5, 2.5))])
    assert verdicts(compare_sweeps(narrow, wide))[("concurrency 1", "p99")] == "within noise"


def test_improvements_are_reported_and_never_fail() -> None:
    comparison = compare_sweeps(steady_sweep(0.8), steady_sweep())
    assert verdicts(comparison)[("concurrency 4", "throughput")] == "improved"
    assert not comparison.regressions


def test_few_windows_fall_back_to_welch() -> None:
    base = make_sweep([make_level(1, [1000.0, 1001.0, 999.0])])
    cand = make_sweep([make_level(1, [800.0, 801.0, 799.0])])
    delta = compare_sweeps(base, cand).deltas[0]
    assert delta.noise.method == "Welch t" and delta.verdict == "regression"


def test_latency_metrics_other_than_p99_use_the_window_latencies() -> None:
    base = make_sweep([make_level(1, [1000.0] * 5, latency_ms=[1.0, 1.01, 0.99, 1.0, 1.02])])
    cand = make_sweep([make_level(1, [1000.0] * 5, latency_ms=[1.5, 1.51, 1.49, 1.5, 1.52], p99_ms=3.0)])
    comparison = compare_sweeps(base, cand, Thresholds(metrics=("mean", "p50")))
    assert {d.metric: (d.noise.method, d.verdict) for d in comparison.deltas} == {
        "mean": ("Mann-Whitney U", "regression"),
        "p50": ("Mann-Whitney U", "regression"),
    }


def test_runs_of_different_levels_or_modes_cannot_be_compared() -> None:
    base = steady_sweep()
    fewer = dataclasses.replace(base, levels=base.levels[:2])
    with pytest.raises(PerfkitError, match="did not measure the same levels: the candidate lacks concurrency 4"):
        compare_sweeps(base, fewer)
    with pytest.raises(PerfkitError, match="perfkit sweep --concurrency-range 1:4"):
        compare_sweeps(base, fewer)
    rate = make_sweep([make_level(100, [100.0] * 5, mode="request_rate")])
    with pytest.raises(PerfkitError, match="same load mode"):
        compare_sweeps(base, rate)
    with pytest.raises(PerfkitError, match="--metric p42"):
        compare_sweeps(base, base, Thresholds(metrics=("p42",)))


def test_warnings_name_other_machines_and_models() -> None:
    other = steady_sweep(model="convnet", machine={"hostname": "elsewhere"})
    warnings = compare_sweeps(steady_sweep(), other).warnings
    assert any("differ in model: baseline mlp, candidate convnet" in w for w in warnings)
    assert any("differ in machine: baseline testhost, candidate elsewhere (differences" in w for w in warnings)


def test_parse_percent() -> None:
    assert parse_percent("5%", "--x") == 5.0
    assert parse_percent(" 12.5 ", "--x") == 12.5
    assert parse_percent(3, "--x") == 3.0
    with pytest.raises(PerfkitError, match="--max-throughput-drop takes a percentage"):
        parse_percent("five", "--max-throughput-drop")
    with pytest.raises(PerfkitError, match="non-negative"):
        parse_percent("-5%", "--x")


def test_console_table_and_junit() -> None:
    comparison = compare_sweeps(steady_sweep(), steady_sweep(0.8), names=("base", "new"))
    lines = render_comparison_lines(comparison)
    assert lines[0].split()[:4] == ["level", "metric", "baseline", "candidate"]
    assert any("REGRESSION" in line and "-20.0%" in line for line in lines)
    assert lines[-1].startswith("REGRESSION: 3 of 6 comparisons")
    root = ET.fromstring(render_junit("gate", comparison_cases(comparison)))
    suite = root.find("testsuite")
    assert suite is not None and suite.get("tests") == "6" and suite.get("failures") == "3"
    failures = suite.findall("testcase/failure")
    assert len(failures) == 3 and "throughput at concurrency 1" in (failures[0].get("message") or "")


def test_slo_gate_judges_p99_from_the_intended_send() -> None:
    levels = [make_level(r, [r] * 5, mode="request_rate", p99_ms=p) for r, p in ((200, 5.0), (400, 12.0), (600, 40.0))]
    sweep = make_sweep(levels)
    verdict = check_slo(sweep, 20.0, 350.0)
    assert verdict.within == ("rate 200/s", "rate 400/s") and verdict.capacity == pytest.approx(400.0)
    assert verdict.passed and "capacity 400.0 infer/s at rate 400/s" in verdict.lines()[0]
    assert not check_slo(sweep, 20.0, 500.0).passed
    assert check_slo(sweep, 1.0).within == () and check_slo(sweep, 1.0).passed


# --------------------------------------------------------------------------------------------------
# perfkit compare


def test_compare_command_exit_codes_and_junit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = write_sweep_json(steady_sweep(), tmp_path / "base.json")
    same = write_sweep_json(steady_sweep(), tmp_path / "same.json", kind=True)
    slow = write_sweep_json(steady_sweep(0.8), tmp_path / "slow.json")
    junit = tmp_path / "out" / "gate.xml"
    assert main(["compare", str(base), str(same)]) == 0
    assert "no regression in 6 comparisons" in capsys.readouterr().out
    assert main(["compare", str(base), str(slow), "--junit", str(junit), "--metric", "throughput"]) == 1
    assert ET.parse(junit).getroot().get("failures") == "3"
    # A generous threshold: the drop is real but allowed.
    assert main(["compare", str(base), str(slow), "--max-throughput-drop", "25%"]) == 0


def test_compare_command_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = write_sweep_json(steady_sweep(), tmp_path / "base.json")
    fewer = steady_sweep()
    fewer = write_sweep_json(dataclasses.replace(fewer, levels=fewer.levels[:1]), tmp_path / "fewer.json")
    assert main(["compare", str(base), str(fewer)]) == 2
    assert "did not measure the same levels" in capsys.readouterr().err
    assert main(["compare", str(base), str(tmp_path / "missing.json")]) == 2
    assert "cannot read" in capsys.readouterr().err
    (tmp_path / "junk.json").write_text("{not json")
    assert main(["compare", str(base), str(tmp_path / "junk.json")]) == 2
    assert "is not JSON" in capsys.readouterr().err
    assert main(["compare", str(base), str(base), "--max-latency-increase", "lots"]) == 2
    assert "--max-latency-increase takes a percentage" in capsys.readouterr().err
