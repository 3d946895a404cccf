"""A sweep that ends 3 ends with one console line: the levels that never stabilised, how far apart
their windows were, and the flag to change; and which flags lengthen a level's windows. No server:
the sweep itself is replaced by its result."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

import perfkit.cli.sweep as sweep_cli
import perfkit.cli.sweep.command as sweep_command
from perfkit.cli import main
from perfkit.cli.common import windows_from_args
from perfkit.errors import ExitCode
from perfkit.measure.level import WindowSpec
from perfkit.report.html.sweep import _spec_text
from perfkit.report.summary import exit_line
from perfkit.results.model import Check, SweepResult
from perfkit.sweep.run import SweepFiles, SweepRun
from perfkit.sweep.spec import SweepSpec
from tests.synthetic import make_level, make_sweep


def unstable_sweep() -> SweepResult:
    return make_sweep([
        make_level(1, [1000, 1010, 1005]),
        make_level(3, [2000, 2600, 2100], stable=False),  # throughput 30% apart
        make_level(7, [4000, 4560, 4100], stable=False),  # 14%
    ])  # fmt: skip


def test_the_exit_3_line_names_the_levels_the_check_and_the_flags() -> None:
    line = exit_line(unstable_sweep(), ExitCode.UNSTABLE)
    assert line == (
        "concurrency 3 and 7 never stabilised (throughput varied 30% > -s 10% over the last 3 windows of 1 s): "
        "raise -p / --measurement-interval or --window-lengthenings, or accept more spread with -s / "
        "--stability-percentage"
    )


def test_the_exit_line_reads_s_from_the_run_and_names_rates_once() -> None:
    rates = [
        make_level(r, [r, r * 1.5, r], mode="request_rate", latency_ms=[1, 1.1, 3], stable=False) for r in (10, 20)
    ]
    result = make_sweep(rates, spec={"windows": {"stability_pct": 25.0, "stable_window_count": 3}})
    line = exit_line(result, ExitCode.UNSTABLE)
    assert line is not None
    assert line.startswith("request rate 10/s and 20/s never stabilised (throughput varied 50% and latency varied "
                           "200% > -s 25% over the last 3 windows of 1 s)")  # fmt: skip


def test_a_failed_check_other_than_stability_is_named_with_its_advice() -> None:
    invalid = make_level(
        2, [100, 100, 100], checks=[Check("sample_count", False, "40 measured; a p99 needs 662", "measure longer")]
    )
    line = exit_line(make_sweep([invalid]), ExitCode.UNSTABLE)
    assert line == "concurrency 2 failed the sample_count check (40 measured; a p99 needs 662): measure longer"


@pytest.mark.parametrize("code", [ExitCode.OK, ExitCode.FAILED, ExitCode.ERRORS, ExitCode.INTERRUPTED])
def test_no_exit_line_for_other_endings(code: ExitCode) -> None:
    assert exit_line(unstable_sweep(), code) is None


def fake_sweep(monkeypatch: pytest.MonkeyPatch, result: SweepResult) -> None:
    def run_sweep(spec: SweepSpec, argv: list[str]) -> tuple[SweepRun, int]:
        return SweepRun(result, SweepFiles(spec, result.model)), ExitCode.UNSTABLE

    monkeypatch.setattr(sweep_command, "run_sweep", run_sweep)


def test_perfkit_sweep_ends_3_with_that_line_last(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_sweep(monkeypatch, unstable_sweep())
    code = main(["sweep", "--concurrency-range", "1:8", "-p", "1000", "--report-dir", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 3
    assert err[-1].startswith("concurrency 3 and 7 never stabilised (throughput varied 30% > -s 10%")
    assert sum("never stabilised" in line for line in err) == 1


def test_perfkit_run_ends_3_with_that_line_last(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_sweep(monkeypatch, unstable_sweep())
    monkeypatch.setattr("perfkit.report.html.render_html", lambda *args, **kwargs: "<html></html>")
    scenario = tmp_path / "s.toml"
    scenario.write_text(
        f'[server]\nurl = "127.0.0.1:8000"\n[sweep]\nconcurrency_range = "1:8"\nreport_dir = "{tmp_path}"\n'
    )
    code = main(["run", str(scenario)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 3
    assert err[-1].startswith("concurrency 3 and 7 never stabilised")
    assert sum("never stabilised" in line for line in err) == 1


def sweep_windows(*flags: str) -> WindowSpec:
    parser = argparse.ArgumentParser()
    sweep_cli.add_arguments(parser)
    return sweep_cli.spec_from_args(parser.parse_args(list(flags))).windows


def test_sweep_lengthens_windows_unless_r_alone_bounds_the_level() -> None:
    assert (sweep_windows().max_trials, sweep_windows().lengthenings) == (10, 2)
    assert sweep_windows("-p", "1000").lengthenings == 2  # the README's quick start: -p sets the first window
    bounded = sweep_windows("-r", "5")
    assert (bounded.max_trials, bounded.lengthenings) == (5, 0)  # perf_analyzer's -r: at most 5 windows
    assert sweep_windows("-r", "5", "--window-lengthenings", "1").lengthenings == 1
    assert sweep_windows("--window-lengthenings", "0").lengthenings == 0


def test_tune_keeps_perf_analyzers_rule() -> None:
    args = argparse.Namespace(measurement_mode="time_windows", measurement_interval=1000.0, measurement_request_count=50,
                              stability_percentage=10.0, max_trials=10, percentile=None, warmup_request_count=20)  # fmt: skip
    assert windows_from_args(args).lengthenings == 0


def test_the_reports_measurement_line_says_windows_may_be_lengthened() -> None:
    windows = {"interval_ms": 1000.0, "stability_pct": 10.0, "max_trials": 10, "lengthenings": 2}
    text = _spec_text({"windows": windows})["measurement"]
    assert text.endswith("at most 10 windows a length, doubled up to 2 times when they disagree (see each level's "
                         "stable check)")  # fmt: skip
    assert "doubled" not in _spec_text({"windows": {**windows, "lengthenings": 0}})["measurement"]
