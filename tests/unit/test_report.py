"""The HTML report and `perfkit report`: self-contained, escaped, the verdict first, every figure and
table present; result kinds; comparisons; tune results; the history CSV and the tidy schema doc."""

from __future__ import annotations

import base64
import csv
import dataclasses
import io
import json
import math
import re
from pathlib import Path

import pytest

from perfkit.cli import main
from perfkit.errors import PerfkitError
from perfkit.report.figures import canvas
from perfkit.report.html import render_html
from perfkit.report.tidy import render_tidy_schema, tidy_header
from perfkit.results.files import ReportItem, load_result, slo_from_sweep
from perfkit.results.model import Check, LatencyStats, ResponseStats
from tests.synthetic import make_level, make_sweep, steady_sweep, tune_json, write_sweep_json

ROOT = Path(__file__).resolve().parents[2]
IMG = re.compile(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)" alt="([^"]*)">')
# A 1×1 white PNG.
TINY_PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4//8/AAX+Av4N70a4AAAAAElFTkSuQmCC"
)


@pytest.fixture
def quick_png(monkeypatch: pytest.MonkeyPatch) -> None:
    """Figures are built as usual but not drawn: for the tests about the page's text, which would
    otherwise spend most of their time in matplotlib's renderer."""
    monkeypatch.setattr(canvas, "png", lambda fig: TINY_PNG)


def item(result, label: str = "run") -> ReportItem:  # type: ignore[no-untyped-def]
    return ReportItem(label, "sweep", result, f"{label}.json")


def test_a_sweep_report_is_self_contained_with_every_figure() -> None:
    page = render_html([item(steady_sweep())], generated_at="2026-01-01T00:00:00+00:00")
    images = IMG.findall(page)
    assert [alt for _, alt in images] == [
        "throughput vs load",
        "latency percentiles vs load",
        "throughput vs p99 latency",
        "latency breakdown",
        "measurement windows over the run",
        "utilisation and GPU memory over the run",
    ]  # no errors figure: no request failed
    for data, _ in images:
        assert base64.b64decode(data).startswith(b"\x89PNG\r\n\x1a\n")
    # Nothing to fetch: no external source, stylesheet or script.
    assert not re.search(r'(src|href)="(?!data:|#)', page)
    assert "<script src" not in page and "@import" not in page
    # Verdict before the figures; provenance present.
    assert page.index("VALID: all 3 levels passed every check") < page.index("<h3>Figures</h3>")
    for text in ("0123456789abcdef", "perfkit-reference-server", "perfkit sweep --concurrency-range 1:4", "testhost"):
        assert text in page
    assert page.count("<table") == 3  # levels, checks, provenance
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")


@pytest.mark.usefixtures("quick_png")
def test_every_interpolated_string_is_escaped() -> None:
    evil = '<script>alert("x")</script>'
    level = make_level(
        1, [100.0] * 5, errors={evil: 3},
        checks=(Check("stable", False, f"detail {evil}", f"advice {evil}"),),
    )  # fmt: skip
    sweep = dataclasses.replace(
        make_sweep([level], model=evil, argv=["sweep", evil]),
        completed=False,
        stop_reason=evil,
    )
    page = render_html([item(sweep, label=evil)], title=evil)
    assert evil not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
    assert page.count("<script>") == 1  # the page's own check script only


@pytest.mark.usefixtures("quick_png")
def test_an_invalid_run_says_why_and_what_to_do_first() -> None:
    good = make_level(1, [1000.0] * 5)
    bad = make_level(2, [1000.0, 500.0, 1500.0], stable=False, errors={"timeout": 4})
    page = render_html([item(make_sweep([good, bad]))])
    verdict = page[page.index('class="verdict bad"') : page.index("</div></div>", page.index('class="verdict bad"'))]
    assert "NOT VALID: 1 of 2 levels failed a check" in verdict
    assert "concurrency 2" in verdict and "measure longer windows (-p)" in verdict
    assert "4 of " in verdict and "read the server&#x27;s log" in verdict


@pytest.mark.usefixtures("quick_png")
def test_rate_mode_shows_late_sends_and_intended_latency() -> None:
    levels = [make_level(r, [r * 0.99] * 5, mode="request_rate", delayed_pct=d) for r, d in ((100, 0.0), (200, 3.5))]
    page = render_html([item(make_sweep(levels))], slo_ms=5.0)
    assert "p99 from intended ms" in page and "late sends (worst)" in page and "3.50 %" in page
    assert "offered rate" not in page  # axis labels live inside the PNGs, not the HTML


@pytest.mark.usefixtures("quick_png")
def test_several_runs_open_with_a_comparison() -> None:
    page = render_html([item(steady_sweep(), "before"), item(steady_sweep(0.8), "after")])
    comparison = page[page.index('<section id="comparison">') : page.index("</section>")]
    assert "after against before" in comparison
    assert "3 regression(s)" in comparison and "REGRESSION" in comparison
    assert len(IMG.findall(comparison)) == 3
    assert page.count("<section") == 3  # the comparison, then each run
    different = dataclasses.replace(steady_sweep(), levels=steady_sweep().levels[:1])
    page = render_html([item(steady_sweep(), "a"), item(different, "b")])
    assert "Not compared level by level: the two runs did not measure the same levels" in page


def test_kinds_are_dispatched_and_unknown_kinds_refused(tmp_path: Path) -> None:
    plain = write_sweep_json(steady_sweep(), tmp_path / "plain.json")
    tagged = write_sweep_json(steady_sweep(), tmp_path / "tagged.json", kind=True)
    assert load_result(plain).kind == load_result(tagged).kind == "sweep"
    assert load_result(plain).label == "plain"
    (tmp_path / "other.json").write_text(json.dumps({"kind": "flamegraph"}))
    with pytest.raises(PerfkitError, match="unknown result kind 'flamegraph'; perfkit reports sweep, tune"):
        load_result(tmp_path / "other.json")
    (tmp_path / "bad.json").write_text(json.dumps({"kind": "sweep", "levels": [], "model": "m"}))
    with pytest.raises(PerfkitError, match="not a readable sweep result"):
        load_result(tmp_path / "bad.json")


@pytest.mark.usefixtures("quick_png")
def test_a_tune_report_ranks_plots_and_states_the_gain(tmp_path: Path) -> None:
    tune = load_result(tune_json(tmp_path))
    assert tune.kind == "tune"
    page = render_html([tune])
    assert (
        "In 24 measurements across 4 configurations, count=2 mbs=8 batching=100us is 50 % better than the default "
        "configuration (95 % CI +44..+56 %) at maximizing throughput, under p99_ms&lt;=10 (4,500.0 infer/s, p99 "
        "6.00 ms at concurrency 4)."
    ) in page
    ranks = re.findall(r'<tr><td class="n">(\d)</td><td>([^<]+)</td>', page)
    assert ranks == [
        ("1", "count=2 mbs=8 batching=100us ★"),
        ("2", "count=1 mbs=4 batching=off (default)"),
        ("3", "count=4 mbs=8 batching=off"),
        ("4", "count=8 mbs=8 batching=off"),
    ]
    assert "infeasible; p99_ms 30 &gt; 10" in page and "&lt;count=1 mbs=4 batching=off&gt;" in page
    assert [alt for _, alt in IMG.findall(page)] == [
        "throughput vs p99 of every variant",
        "throughput vs p99 of the top variants",
        "throughput vs concurrency of the top variants",
    ]
    data = json.loads((tmp_path / "tune.json").read_text())
    del data["variants"]
    (tmp_path / "broken.json").write_text(json.dumps(data))
    with pytest.raises(PerfkitError, match="a tune result needs the key 'variants'"):
        load_result(tmp_path / "broken.json")


@pytest.mark.usefixtures("quick_png")
def test_a_tune_sentence_owns_up_to_ties(tmp_path: Path) -> None:
    path = tune_json(tmp_path)
    data = json.loads(path.read_text())
    data["best"] = "count=4 mbs=8 batching=off"  # pretend: the leader's tie, resolved to fewer resources
    data["ranking"][2]["status"] = "feasible"
    data["ties"] = ["count=2 mbs=8 batching=100us", "count=4 mbs=8 batching=off"]
    path.write_text(json.dumps(data))
    page = render_html([load_result(path)])
    assert "2 configurations tie for the best at maximizing throughput" in page
    assert (
        "count=4 mbs=8 batching=off, the one that uses the fewest resources, is 100 % better than the default "
        "configuration (95 % CI +92..+108 %)"
    ) in page
    # Its interval overlapping the default's: no gain is claimed, the interval is shown.
    data["ranking"][2]["score"] = {"value": math.log(2850.0), "low": math.log(2700.0), "high": math.log(3100.0)}
    path.write_text(json.dumps(data))
    page = render_html([load_result(path)])
    assert "is not distinguishable from the default configuration (-5 %, 95 % CI -12..+5 %)" in page
    assert "better than the default" not in page


def test_slo_comes_from_the_sweep_when_it_stabilised_on_p99() -> None:
    sweep = steady_sweep()
    assert slo_from_sweep(sweep) is None
    spec = {"load": {"latency_threshold_ms": 25.0}, "windows": {"percentile": 99}}
    assert slo_from_sweep(dataclasses.replace(sweep, provenance={"spec": spec})) == 25.0


@pytest.mark.usefixtures("quick_png")
def test_report_command_writes_beside_the_result_and_appends_history(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = write_sweep_json(steady_sweep(), tmp_path / "sweep-a.json")
    second = write_sweep_json(steady_sweep(0.9), tmp_path / "sweep-b.json")
    history = tmp_path / "history.csv"
    assert main(["report", str(first), "--append", str(history)]) == 0
    assert (tmp_path / "sweep-a.html").read_text().count("<img ") == 6  # no errors: no errors figure
    out = tmp_path / "cmp.html"
    assert main(["report", str(first), str(second), "-o", str(out), "--label", "old", "--label", "new"]) == 0
    assert "new against old" in out.read_text()
    assert main(["report", str(second), "--append", str(history), "-o", str(tmp_path / "b.html")]) == 0
    rows = list(csv.DictReader(io.StringIO(history.read_text())))
    assert list(rows[0])[:3] == ["run_id", "timestamp", "schema_version"]
    assert [r["run_id"] for r in rows] == ["sweep-a"] * 3 + ["sweep-b"] * 3
    assert {r["timestamp"] for r in rows} == {"2026-01-02T03:04:05+00:00"}
    history.write_text("run_id,timestamp,something_else\n")
    assert main(["report", str(first), "--append", str(history)]) == 2
    assert "--append" in capsys.readouterr().err
    assert main(["report"]) == 2
    assert main(["report", str(first), "--label", "a", "--label", "b"]) == 2


def test_the_tidy_schema_doc_is_up_to_date(capsys: pytest.CaptureFixture[str]) -> None:
    doc = ROOT / "docs" / "tidy_csv_schema.md"
    assert doc.read_text() == render_tidy_schema(), (
        "docs/tidy_csv_schema.md is stale: regenerate it with `perfkit report --tidy-schema > docs/tidy_csv_schema.md`"
    )
    documented = re.findall(r"^\| `([a-z0-9_]+)` \| (\w+) \|", doc.read_text(), flags=re.M)
    assert [name for name, _ in documented] == tidy_header(history=True)
    assert {kind for _, kind in documented} <= {"string", "integer", "number", "boolean"}
    assert main(["report", "--tidy-schema"]) == 0
    assert capsys.readouterr().out == doc.read_text()


def test_a_streamed_sweep_shows_its_response_figures(quick_png: None) -> None:
    times = LatencyStats(count=10, p50_us=1500.0)
    streamed = dataclasses.replace(
        make_level(1, [100.0, 100.0, 100.0]), responses=ResponseStats(40, 4.0, 400.0, times, times)
    )
    page = render_html([item(make_sweep([streamed]))])
    assert "first response p50 ms" in page and "response gap p50 ms" in page and "400.0" in page
    assert "first response p50 ms" not in render_html([item(steady_sweep())])
