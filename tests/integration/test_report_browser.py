"""The HTML report in a real browser: headless Chromium opens it from disk, with no network, at
1400 px wide, and we read back what it rendered.

* The page's own check script writes on <body> how many images decoded (`data-images-ok` of
  `data-images-total`) and how many tables have rows; a screenshot must not be blank; Chromium's
  log must hold no console message from the page.
* A layout probe, added to a copy of the page, measures what a reader would see and writes it as
  JSON into the DOM: no sideways scroll of the page or of any table (scrollWidth <= clientWidth),
  every image decoded and inside its figure, the figures' alt texts by section.

Every kind of report is checked: a comparison of two concurrency sweeps (one with GPU memory, one
with errors) and a tune in one page, and `perfkit report` over several files in another: a
streamed request-rate sweep with late sends and the widest level table, a generative sweep, and a
tune of several models. Each kind is a section, laid out alone as in its own report; two pages instead of seven
keep Chromium's start-ups, most of the time here, to two, run side by side.

A control page, the same report with one image broken, a script error and a table too wide for the
window, proves the checks can fail."""

from __future__ import annotations

import dataclasses
import html
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib import image

from perfkit.report.html import render_html
from perfkit.results.files import ReportItem, TuneView, VariantView, load_result
from perfkit.results.model import LatencyStats, ResponseStats
from tests.synthetic import make_level, make_sweep, make_token_figures, steady_sweep, tune_json

CHROMIUM = shutil.which("chromium")
WIDTH = 1400

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="chromium is not on PATH: the browser check of the HTML report needs Debian's chromium "
        "(`apt-get install chromium`; .ci/run installs it, so CI always runs this test)",
    ),
]

#: Measures the laid-out page once loaded and writes the figures as JSON into <pre id="layout">.
LAYOUT_PROBE = """
window.addEventListener('load', function () {
  var root = document.documentElement;
  var out = {page: {scroll: root.scrollWidth, client: root.clientWidth}, tables: [], images: []};
  function where(node) { var s = node.closest('section'); return s ? s.id : ''; }
  document.querySelectorAll('table').forEach(function (t) {
    var box = t.parentElement.classList.contains('scroll') ? t.parentElement : t;
    out.tables.push({section: where(t), cls: t.className, scroll: box.scrollWidth, client: box.clientWidth});
  });
  document.querySelectorAll('img').forEach(function (i) {
    var img = i.getBoundingClientRect(), fig = i.closest('figure').getBoundingClientRect();
    out.images.push({section: where(i), alt: i.alt, ok: i.complete && i.naturalWidth > 0,
                     left: img.left, right: img.right, figLeft: fig.left, figRight: fig.right,
                     wide: i.closest('figure').classList.contains('wide')});
  });
  var pre = document.createElement('pre');
  pre.id = 'layout';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
"""


def _command(page: Path, profile: Path, shot: Path | None) -> list[str]:
    assert CHROMIUM is not None
    return [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
        "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--hide-scrollbars", f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
        "--virtual-time-budget=5000", *([f"--screenshot={shot}"] if shot else []), "--dump-dom",
        f"--window-size={WIDTH},{4000 if shot else 1000}", page.as_uri(),
    ]  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Rendered:
    """What Chromium made of a page: <body>'s attributes, the layout probe's figures, the console
    lines of its log, and the screenshot's pixels when one was asked for."""

    body: dict[str, str]
    layout: dict[str, Any]
    console: list[str]
    pixels: np.ndarray | None


def open_in_chromium(pages: dict[str, str], tmp_path: Path, shots: tuple[str, ...] = ()) -> dict[str, Rendered]:
    """Load each page (name → HTML, the layout probe added) in its own headless Chromium, all at
    once, and read back what each rendered."""
    running = {}
    for name, text in pages.items():
        page = tmp_path / f"{name}.html"
        page.write_text(text.replace("</body>", f"<script>{LAYOUT_PROBE}</script></body>"))
        shot = tmp_path / f"{name}.png" if name in shots else None
        command = _command(page, tmp_path / f"profile-{name}", shot)
        running[name] = (subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), shot)
    rendered = {}
    for name, (process, shot) in running.items():
        stdout, stderr = process.communicate(timeout=120)
        assert process.returncode == 0, stderr[-2000:]
        body = re.search(r"<body([^>]*)>", stdout)
        probe = re.search(r'<pre id="layout">([^<]*)</pre>', stdout)
        assert body is not None and probe is not None, stdout[:500]
        if shot is not None:
            assert shot.is_file(), f"no screenshot: {stderr[-2000:]}"
        rendered[name] = Rendered(
            dict(re.findall(r'([\w-]+)="([^"]*)"', body.group(1))),
            json.loads(html.unescape(probe.group(1))),
            [line for line in stderr.splitlines() if "CONSOLE" in line],
            image.imread(shot) if shot is not None else None,
        )
    return rendered


def layout_faults(layout: dict[str, Any]) -> list[str]:
    """What a reader at 1400 px would have to scroll sideways for, or would see broken."""
    faults = []
    page = layout["page"]
    if page["scroll"] > page["client"]:
        faults.append(f"the page scrolls sideways: {page['scroll']} px in {page['client']}")
    for t in layout["tables"]:
        if t["scroll"] > t["client"]:
            faults.append(f"{t['section']}: table {t['cls'] or '(plain)'} scrolls: {t['scroll']} px in {t['client']}")
    for i in layout["images"]:
        if not i["ok"]:
            faults.append(f"{i['section']}: image '{i['alt']}' did not load")
        if i["left"] < i["figLeft"] - 0.5 or i["right"] > i["figRight"] + 0.5 or i["figRight"] > page["client"]:
            faults.append(f"{i['section']}: image '{i['alt']}' does not fit its figure or the window")
        if not i["wide"] and i["right"] - i["left"] > 0.55 * page["client"]:
            faults.append(f"{i['section']}: image '{i['alt']}' is blown up to the window's width")
    return faults


def alts(layout: dict[str, Any], section: str) -> list[str]:
    return [i["alt"] for i in layout["images"] if i["section"] == section]


# --------------------------------------------------------------------------------------------------
# The reports


def _rate_sweep() -> Any:
    """Request rate up to 12000/s over gRPC streams, no GPU, late sends at the top: the widest level
    table (the rate-mode and the streamed columns)."""
    times = LatencyStats(count=100, mean_us=1500.0, p50_us=1400.0, p90_us=1800.0, p95_us=1900.0, p99_us=2500.0)
    levels = [
        dataclasses.replace(
            make_level(r, [r * (1 + 0.01 * d) for d in (-1, 0.5, 0, 1, -0.5)], mode="request_rate",
                       p99_ms=10 + r / 50, delayed_pct=0.0 if r < 12000 else 4.5),
            responses=ResponseStats(400_000, 4.0, r * 4.0, times, times),
        )
        for r in (1000, 2000, 4000, 8000, 12000)
    ]  # fmt: skip
    return make_sweep(levels)


def _generative_sweep() -> Any:
    levels = [
        dataclasses.replace(make_level(r, [r * 0.98] * 5, mode="request_rate", p99_ms=400 + r * 10),
                            tokens=make_token_figures(1 + r / 10))
        for r in (1, 2, 4, 8)
    ]  # fmt: skip
    return make_sweep(levels, model="sim_llm")


def _multi_model_tune() -> TuneView:
    """A tune of two models: the combinations with their combined figures, then each model's own."""

    def variants(scale: float) -> tuple[VariantView, ...]:
        return tuple(
            VariantView(name=f"mlp:{n} preprocess:{m}", params={"mlp": n, "preprocess": m}, default=(n, m) == (1, 1),
                        description=f"mlp: {n} instances (KIND_CPU), max batch 8, dynamic batching (max queue delay "
                        f"100 us, preferred sizes 4, 8); preprocess: {m} instances (KIND_CPU), max batch 64, no "
                        "dynamic batching",
                        throughput_infer_per_s=1000.0 * scale * n / m, p99_ms=2.0 * n + m, rank=i + 1,
                        concurrency=4, sweep=steady_sweep(scale * n / m))
            for i, (n, m) in enumerate(((2, 1), (1, 1), (3, 2)))
        )  # fmt: skip

    own = tuple(TuneView(model, variants(scale), best="mlp:2 preprocess:1") for model, scale in
                (("mlp", 1.0), ("preprocess", 2.0)))  # fmt: skip
    return TuneView("mlp, preprocess", variants(1.0), best="mlp:2 preprocess:1", measurements=18, per_model=own)


@pytest.fixture(scope="module")
def items(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[ReportItem]]:
    """The two pages' reports: a comparison and a tune; `perfkit report` over several files."""
    tmp = tmp_path_factory.mktemp("report")
    troubled = make_sweep([
        make_level(1, [900.0, 910.0, 905.0, 899.0]),
        make_level(2, [1500.0, 1100.0, 1700.0], stable=False, errors={"timeout": 3, "HTTP 503": 2}),
        make_level(4, [2600.0, 2610.0, 2590.0, 2605.0]),
    ])  # fmt: skip
    return {
        "compare": [ReportItem("before", "sweep", steady_sweep(), "before.json"),
                    ReportItem("after", "sweep", troubled, "after.json"), load_result(tune_json(tmp))],
        "several": [ReportItem("sweep-mlp-http-request_rate-20261129-084611", "sweep", _rate_sweep(), "rate.json"),
                    ReportItem("generative", "sweep", _generative_sweep(), "generative.json"),
                    ReportItem("multi", "tune_combination", _multi_model_tune(), "multi.json")],
    }  # fmt: skip


@pytest.fixture(scope="module")
def pages(items: dict[str, list[ReportItem]]) -> dict[str, str]:
    return {name: render_html(report) for name, report in items.items()}


@pytest.fixture(scope="module")
def rendered(pages: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Rendered]:
    return open_in_chromium(pages, tmp_path_factory.mktemp("chromium"), shots=("compare",))


# --------------------------------------------------------------------------------------------------
# The checks


def test_the_report_renders_every_image_and_table_in_chromium(
    pages: dict[str, str], rendered: dict[str, Rendered]
) -> None:
    page, seen = pages["compare"], rendered["compare"]
    expected_images = page.count("<img ")
    assert expected_images == 3 + 6 + 7 + 3  # comparison, two sweeps (the first without errors), tune
    assert seen.body.get("data-images-total") == str(expected_images)
    assert seen.body.get("data-images-ok") == str(expected_images), "some images did not decode"
    assert int(seen.body.get("data-tables", "0")) == page.count("<table")
    assert seen.console == [], f"the page logged to the console: {seen.console}"
    # Not blank: a real page has ink, and plenty of it.
    assert seen.pixels is not None and seen.pixels.shape[:2] == (4000, WIDTH)
    gray = seen.pixels[..., :3].mean(axis=2)
    assert (gray < 0.9).mean() > 0.05 and gray.std() > 0.1


@pytest.mark.parametrize("name", ["compare", "several"])
def test_every_report_kind_fits_1400_px(name: str, rendered: dict[str, Rendered]) -> None:
    layout = rendered[name].layout
    assert layout["page"]["client"] == WIDTH
    assert len(layout["images"]) >= 10 and len(layout["tables"]) >= 5
    assert layout_faults(layout) == []
    assert rendered[name].console == []


def test_each_kind_has_its_sections_and_figures_follow_the_data(rendered: dict[str, Rendered]) -> None:
    compare, several = rendered["compare"].layout, rendered["several"].layout
    sections = {i["section"] for layout in (compare, several) for i in layout["images"]}
    assert sections >= {"comparison", "run-before", "run-after", "run-tune", "run-generative",
                        "run-sweep-mlp-http-request_rate-20261129-084611", "run-multi"}  # fmt: skip
    # The Errors chart only where there are errors or late sends.
    assert "errors and late sends" not in alts(compare, "run-before")
    assert "errors and late sends" in alts(compare, "run-after")
    assert "errors and late sends" in alts(several, "run-sweep-mlp-http-request_rate-20261129-084611")
    assert "errors and late sends" not in alts(several, "run-generative")
    # Memory named where it is drawn, and only there.
    assert "utilisation and GPU memory over the run" in alts(compare, "run-before")
    assert "utilisation over the run" in alts(several, "run-sweep-mlp-http-request_rate-20261129-084611")
    # The tune of several models: the combinations' figures, then each model's.
    assert len(alts(several, "run-multi")) >= 9


def test_the_checks_catch_a_broken_image_a_script_error_and_a_wide_table(pages: dict[str, str], tmp_path: Path) -> None:
    broken = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "data:image/png;base64,AAAA", pages["compare"], count=1)
    wide = '<div class="scroll"><table class="wide"><tr><td style="min-width:3000px">x</td></tr></table></div>'
    broken = broken.replace("</main>", f"{wide}</main>").replace(
        "</body>", "<script>undefinedFunction();</script></body>"
    )
    seen = open_in_chromium({"broken": broken}, tmp_path)["broken"]
    total = int(seen.body["data-images-total"])
    assert int(seen.body["data-images-ok"]) == total - 1
    assert any("undefinedFunction" in line for line in seen.console)
    faults = layout_faults(seen.layout)
    assert any("did not load" in f for f in faults) and any("table wide scrolls" in f for f in faults), faults
