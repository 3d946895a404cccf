"""`perfkit compare` warns when the two runs were set up differently (protocol, server, endpoint type,
batch size, model, machine) and when either has levels that are not valid: on the console, in the
JUnit properties and in the HTML report, and the gate still runs."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

import pytest

from perfkit.analysis.compare import compare_sweeps
from perfkit.cli import main
from perfkit.report.compare_text import render_comparison_lines
from perfkit.report.figures import canvas
from perfkit.report.html import render_html
from perfkit.report.junit import render_gate_junit
from perfkit.results.files import ReportItem
from perfkit.results.model import SweepResult
from tests.synthetic import make_level, make_sweep, steady_sweep, write_sweep_json

TINY_PNG = b"\x89PNG\r\n\x1a\n"


def _with_spec(result: SweepResult, **sections: dict[str, Any]) -> SweepResult:
    spec = {**result.provenance["spec"], **sections}
    return dataclasses.replace(result, provenance={**result.provenance, "spec": spec})


def _batch(result: SweepResult, size: int) -> SweepResult:
    return dataclasses.replace(result, levels=tuple(dataclasses.replace(lv, batch_size=size) for lv in result.levels))


def test_the_same_setup_gives_no_warning() -> None:
    other_port = dataclasses.replace(steady_sweep(), url="127.0.0.1:39999")  # embedded: a new port each run
    assert compare_sweeps(steady_sweep(), other_port).warnings == ()


@pytest.mark.parametrize(
    ("candidate", "expected"),
    [
        (dataclasses.replace(steady_sweep(), protocol="grpc"), "differ in protocol: baseline http, candidate grpc"),
        (_with_spec(steady_sweep(), data_path={"streaming": True}), "candidate http streaming"),
        (
            steady_sweep(server={"url": "10.0.0.5:8000", "embedded": False}),
            "differ in server: baseline the embedded reference server, candidate 127.0.0.1:8000",
        ),
        (_with_spec(steady_sweep(), genai={"endpoint_type": "chat"}), "differ in endpoint type"),
        (_batch(steady_sweep(), 4), "differ in batch size: baseline 1, candidate 4"),
        (steady_sweep(model="convnet"), "differ in model: baseline mlp, candidate convnet"),
        (
            steady_sweep(machine={"hostname": "elsewhere", "cpu_count": 64}),
            "differ in machine: baseline testhost, 4 CPUs, candidate elsewhere, 64 CPUs (differences may be",
        ),
    ],
    ids=["protocol", "streaming", "server", "endpoint-type", "batch", "model", "machine"],
)
def test_each_setup_difference_is_warned_and_the_gate_still_runs(candidate: SweepResult, expected: str) -> None:
    base = _with_spec(steady_sweep(), genai={"endpoint_type": "kserve-infer"})
    comparison = compare_sweeps(base, candidate)
    assert len(comparison.warnings) == 1 and expected in comparison.warnings[0], comparison.warnings
    assert len(comparison.deltas) == 6 and not comparison.regressions
    lines = render_comparison_lines(comparison)
    assert lines[-2] == f"WARNING: {comparison.warnings[0]}" and lines[-1].startswith("no regression")
    properties = ET.fromstring(render_gate_junit(comparison)).findall("testsuite/properties/property")
    assert [p.get("value") for p in properties if p.get("name") == "warning"] == [comparison.warnings[0]]


def test_invalid_levels_are_said_on_the_console_naming_the_run_and_the_checks() -> None:
    broken = make_sweep([
        make_level(1, [1000.0] * 5, p99_ms=1.5), make_level(2, [1800.0, 900.0, 2700.0], p99_ms=2.0, stable=False),
        make_level(4, [3000.0] * 5, p99_ms=3.0, errors={"timeout": 3}),
    ])  # fmt: skip
    comparison = compare_sweeps(steady_sweep(), broken, names=("main", "pr-12"))
    assert comparison.warnings == (
        "the candidate (pr-12) has 2 of 3 levels not valid (concurrency 2, concurrency 4, failing errors, stable): "
        "their figures may not be what the build does; its report says why and what to change",
    )
    both = compare_sweeps(broken, broken)
    assert [w.split(" has ")[0] for w in both.warnings] == ["the baseline", "the candidate"]


def test_the_compare_command_warns_and_keeps_its_exit_code(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = write_sweep_json(steady_sweep(), tmp_path / "base.json")
    grpc = write_sweep_json(_batch(dataclasses.replace(steady_sweep(), protocol="grpc"), 2), tmp_path / "new.json")
    junit = tmp_path / "gate.xml"
    assert main(["compare", str(base), str(grpc), "--junit", str(junit)]) == 0
    out = capsys.readouterr().out
    assert "WARNING: the runs differ in protocol: base http, new grpc" in out
    assert "WARNING: the runs differ in batch size: base 1, new 2" in out
    assert out.rstrip().splitlines()[-1].startswith("no regression")
    assert "the runs differ in protocol" in junit.read_text()


def test_the_html_comparison_shows_the_warnings_above_its_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(canvas, "png", lambda fig: TINY_PNG)
    items = [ReportItem("before", "sweep", steady_sweep(), "before.json"),
             ReportItem("after", "sweep", steady_sweep(model="convnet"), "after.json")]  # fmt: skip
    page = render_html(items)
    box = page.index('class="verdict warn"')
    assert "the runs differ in model: before mlp, after convnet" in page[box : page.index("</ul>", box)]
    assert box < page.index("<th>metric</th>")
