"""`perfkit run` end to end on the shipped scenario files: the smoke scenario as CI runs it, and the
regression gate failing (exit 1, JUnit failures, a comparison report) against a baseline that the
bundled server on this machine cannot match."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from perfkit.cli import main
from perfkit.results.model import read_sweep
from tests.synthetic import make_level, make_sweep, write_sweep_json

pytestmark = pytest.mark.integration

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


def test_the_smoke_scenario_runs_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    history = tmp_path / "history.csv"
    code = main(["run", str(SCENARIOS / "smoke.toml"), "--report-dir", str(tmp_path), "--append", str(history)])
    out = capsys.readouterr()
    assert code == 0, out.err[-3000:]
    (result_path,) = tmp_path.glob("sweep-mlp-concurrency-*.json")
    result = read_sweep(result_path)
    assert [lv.level for lv in result.levels] == [1.0, 4.0]
    assert all(lv.error_count == 0 for lv in result.levels)
    for suffix in (".csv", "_long.csv", ".html"):
        assert (tmp_path / f"{result_path.stem}{suffix}").is_file()
    page = (tmp_path / f"{result_path.stem}.html").read_text()
    # six figures: no errors or late sends, so no errors chart
    assert page.count('<img src="data:image/png;base64,') == 6 and "perfkit scenario smoke" in page
    assert 'alt="errors and late sends"' not in page
    rows = list(csv.DictReader(io.StringIO(history.read_text())))
    assert [(r["run_id"], r["level"]) for r in rows] == [(result_path.stem, "1"), (result_path.stem, "4")]
    assert rows[0]["timestamp"] == result.provenance["started_at"]
    assert "concurrency  infer/s" in out.out  # the summary table


@pytest.mark.usefixtures("quick_png")  # the page's text is checked, not its pictures
def test_the_regression_gate_fails_against_a_faster_baseline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # One level, short windows (flags override the file); a baseline of a million infer/s there, with
    # steady windows and a 10 µs p99, is beyond anything measured here and beyond any noise.
    fast = make_sweep([make_level(2, [1e6, 1.001e6, 0.999e6, 1e6, 1.0005e6], p99_ms=0.01)])
    baseline = write_sweep_json(fast, tmp_path / "fast.json")
    junit = tmp_path / "gate.xml"
    code = main([
        "run", str(SCENARIOS / "regression_gate.toml"), "--baseline", str(baseline), "--report-dir", str(tmp_path),
        "--junit", str(junit), "--concurrency-range", "2", "-p", "300",
    ])  # fmt: skip
    out = capsys.readouterr()
    assert code == 1, out.err[-3000:]
    assert "REGRESSION: 2 of 2 comparisons" in out.out
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None and suite.get("tests") == "2" and suite.get("failures") == "2"
    (page,) = tmp_path.glob("sweep-*.html")
    html = page.read_text()
    assert "2 regression(s)" in html and html.count("<section") == 3
    # The baseline file is untouched by a failing gate.
    assert json.loads(baseline.read_text())["levels"][0]["throughput_infer_per_s"] == pytest.approx(1e6, rel=1e-3)
