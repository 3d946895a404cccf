"""perfkit compare on perf_analyzer `-f` CSVs: perf_analyzer's own and perfkit's read as sweeps
without per-window samples, gated on thresholds alone, alone or next to a JSON result."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from perfkit.analysis.compare import Thresholds, compare_sweeps
from perfkit.cli import main
from perfkit.errors import PerfkitError
from perfkit.report.compare_text import render_comparison_lines
from perfkit.report.export import render_pa_csv
from perfkit.report.junit import render_gate_junit
from perfkit.report.tidy import render_tidy_csv
from perfkit.results.pa_csv import has_window_samples, sweep_from_pa_csv
from tests.synthetic import steady_sweep, write_sweep_json

# As perf_analyzer 2.48.0 wrote them against the reference server (`-f`, and `--verbose-csv -f`).
PA_CONCURRENCY = """\
Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,Server Compute Input,\
Server Compute Infer,Server Compute Output,Client Recv,p50 latency,p90 latency,p95 latency,p99 latency
1,1113.76,52,374,246,1,213,4,0,867,967,1035,1521
2,1845.36,45,496,249,18,254,13,0,1035,1315,1383,1847
"""
PA_RATE_VERBOSE = """\
Request Rate,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,Server Compute Input,\
Server Compute Infer,Server Compute Output,Client Recv,p50 latency,p90 latency,p95 latency,p99 latency,\
Avg latency,request/response,response wait
50,49.8287,176,704,289,2,492,6,0,1629,1916,2082,2169,1670,176,1472
"""
THRESHOLDS_ONLY = "thresholds only: no per-window samples, no significance test"


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def slower(text: str, factor: float) -> str:
    """The CSV with every level's Inferences/Second scaled by `factor`."""
    lines = text.splitlines()
    rows = [line.split(",") for line in lines[1:]]
    return "\n".join([lines[0], *(",".join([r[0], f"{float(r[1]) * factor:g}", *r[2:]]) for r in rows)]) + "\n"


def test_perf_analyzers_csv_reads_as_levels_without_samples() -> None:
    sweep = sweep_from_pa_csv(PA_CONCURRENCY, "pa.csv")
    assert sweep.mode == "concurrency" and not has_window_samples(sweep)
    assert [(lv.level, lv.throughput_infer_per_s) for lv in sweep.levels] == [(1.0, 1113.76), (2.0, 1845.36)]
    first = sweep.levels[0]
    assert first.windows == () and first.latency.p99_us == 1521 and first.latency.p50_us == 867
    assert first.server is not None and first.server.compute_infer_us == 213
    # What a plain -f CSV does not hold is NaN, never a zero that would compare as a figure.
    assert math.isnan(first.latency.mean_us) and math.isnan(first.latency.p999_us)

    rate = sweep_from_pa_csv(PA_RATE_VERBOSE, "rate.csv")
    assert rate.mode == "request_rate" and rate.levels[0].level == 50.0
    assert rate.levels[0].latency.mean_us == 1670


def test_perfkits_own_csv_reads_back_with_its_figures() -> None:
    original = steady_sweep()
    sweep = sweep_from_pa_csv(render_pa_csv(original.levels, verbose_csv=True), "perfkit.csv")
    assert [lv.level for lv in sweep.levels] == [lv.level for lv in original.levels]
    for read, level in zip(sweep.levels, original.levels):
        assert read.throughput_infer_per_s == pytest.approx(level.throughput_infer_per_s, rel=1e-5)
        assert read.latency.p99_us == int(level.latency.p99_us)  # perf_analyzer truncates to integer µs
        assert read.latency.mean_us == int(level.latency.mean_us)


def test_thresholds_alone_decide_and_the_verdict_and_junit_say_so() -> None:
    base = sweep_from_pa_csv(PA_CONCURRENCY, "base.csv")
    # 6 % slower: beyond the 5 % limit. With no samples to test it against, that is a regression.
    cand = sweep_from_pa_csv(slower(PA_CONCURRENCY, 0.94), "cand.csv")
    comparison = compare_sweeps(base, cand, Thresholds(metrics=("throughput", "p99", "p999")))
    assert comparison.thresholds_only and comparison.without_samples == ("baseline", "candidate")
    verdicts = {(d.level, d.metric): d.verdict for d in comparison.deltas}
    assert verdicts[("concurrency 1", "throughput")] == "regression"
    assert verdicts[("concurrency 1", "p99")] == "ok"
    assert verdicts[("concurrency 1", "p999")] == "not measured"  # not in the file
    lines = render_comparison_lines(comparison)
    assert lines[-1] == f"REGRESSION: 2 of 6 comparisons are worse than their limit ({THRESHOLDS_ONLY})"
    assert any("gated on thresholds only" in line for line in lines)

    root = ET.fromstring(render_gate_junit(comparison).split("\n", 1)[1])
    props = {p.get("name"): p.get("value") for p in root.iter("property")}
    assert props["significance"] == "thresholds only: no per-window samples"
    failure = next(root.iter("failure"))
    assert "no per-window samples: thresholds only: regression" in (failure.get("message") or "")


def test_json_results_keep_their_significance_test() -> None:
    comparison = compare_sweeps(steady_sweep(), steady_sweep())
    assert not comparison.thresholds_only
    assert "thresholds only" not in render_comparison_lines(comparison)[-1]
    assert 'name="significance" value="per-window samples"' in render_gate_junit(comparison)


def test_compare_command_on_csvs_alone_and_mixed_with_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pa = write(tmp_path / "pa.csv", PA_CONCURRENCY)
    junit = tmp_path / "gate.xml"
    assert main(["compare", str(pa), str(pa), "--junit", str(junit)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"no regression in 4 comparisons ({THRESHOLDS_ONLY})"
    assert "thresholds only" in junit.read_text()
    assert main(["compare", str(pa), str(write(tmp_path / "slow.csv", slower(PA_CONCURRENCY, 0.8)))]) == 1
    assert "REGRESSION: 2 of 4" in capsys.readouterr().out

    # A JSON baseline against perfkit's CSV of the same run passes; of a slower run, fails.
    base = write_sweep_json(steady_sweep(), tmp_path / "base.json")
    same = write(tmp_path / "same.csv", render_pa_csv(steady_sweep().levels))
    slow = write(tmp_path / "slow_perfkit.csv", render_pa_csv(steady_sweep(0.8).levels))
    assert main(["compare", str(base), str(same)]) == 0
    out = capsys.readouterr().out
    assert "note: same has no per-window samples" in out and "different models" not in out
    assert main(["compare", str(same), str(base), "--metric", "throughput"]) == 0
    assert main(["compare", str(base), str(slow), "--metric", "throughput"]) == 1


def test_a_csv_takes_the_json_runs_batch_size() -> None:
    json_run = steady_sweep()
    json_run = dataclasses.replace(
        json_run, levels=tuple(dataclasses.replace(lv, batch_size=4) for lv in json_run.levels)
    )
    csv_run = sweep_from_pa_csv(render_pa_csv(steady_sweep().levels), "same.csv")
    comparison = compare_sweeps(json_run, csv_run)
    assert comparison.deltas[0].level == "concurrency 1 (batch 4)" and not comparison.regressions


def test_a_csv_that_is_not_perf_analyzers_is_an_input_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pa = write(tmp_path / "pa.csv", PA_CONCURRENCY)
    other = write(tmp_path / "sales.csv", "region,total\nnorth,3\n")
    assert main(["compare", str(other), str(pa)]) == 2
    err = capsys.readouterr().err
    assert f"{other} is not a result compare can read" in err and "perf_analyzer -f CSV" in err
    assert "perfkit JSON result" in err
    tidy = write(tmp_path / "tidy.csv", render_tidy_csv(steady_sweep()))
    assert main(["compare", str(pa), str(tidy)]) == 2
    assert "that is perfkit's tidy CSV" in capsys.readouterr().err
    with pytest.raises(PerfkitError, match=r"bad\.csv, line 2: column 'p99 latency' holds 'n/a'"):
        sweep_from_pa_csv(PA_CONCURRENCY.replace(",1521", ",n/a"), "bad.csv")
    with pytest.raises(PerfkitError, match="header without rows"):
        sweep_from_pa_csv(PA_CONCURRENCY.splitlines()[0], "empty.csv")
    with pytest.raises(PerfkitError, match="3 cells under a header of 13"):
        sweep_from_pa_csv(PA_CONCURRENCY + "3,1,2\n", "short.csv")


def test_a_csv_of_custom_intervals_compares_with_their_json_run() -> None:
    json_run = steady_sweep()
    levels = tuple(dataclasses.replace(lv, mode="custom_intervals", level=lv.level * 100) for lv in json_run.levels)
    json_run = dataclasses.replace(json_run, mode="custom_intervals", levels=levels)
    csv_run = sweep_from_pa_csv(render_pa_csv(levels), "intervals.csv")
    assert csv_run.mode == "request_rate"  # perf_analyzer's header says Request Rate
    comparison = compare_sweeps(csv_run, json_run)
    assert comparison.deltas[0].level == "intervals 100/s" and not comparison.regressions
