"""The HTML report in a real browser: headless Chromium opens it from disk, with no network, and we
read back what it rendered: the page's own check script writes on <body> how many images decoded
(`data-images-ok` of `data-images-total`) and how many tables have rows; a screenshot must not be
blank; Chromium's log must hold no console message from the page. A control page, the same report
with one image broken and a script error, proves the checks can fail."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from matplotlib import image

from perfkit.report.html import render_html
from perfkit.results.files import ReportItem, load_result
from tests.synthetic import make_level, make_sweep, steady_sweep, tune_json

CHROMIUM = shutil.which("chromium")

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="chromium is not on PATH: the browser check of the HTML report needs Debian's chromium "
        "(`apt-get install chromium`; .ci/run installs it, so CI always runs this test)",
    ),
]


def open_in_chromium(page: Path, tmp_path: Path) -> tuple[dict[str, str], np.ndarray, list[str]]:
    """Load `page` in headless Chromium: the <body> attributes after load, the screenshot's pixels,
    and the console lines of Chromium's log."""
    assert CHROMIUM is not None
    shot = tmp_path / f"{page.stem}.png"
    command = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
        "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0",
        f"--screenshot={shot}", "--dump-dom", "--window-size=1280,4000", page.as_uri(),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    body = re.search(r"<body([^>]*)>", done.stdout)
    assert body is not None, done.stdout[:500]
    attributes = dict(re.findall(r'([\w-]+)="([^"]*)"', body.group(1)))
    assert shot.is_file(), f"no screenshot: {done.stderr[-2000:]}"
    console = [line for line in done.stderr.splitlines() if "CONSOLE" in line]
    return attributes, image.imread(shot), console


@pytest.fixture(scope="module")
def report_html(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A report of everything: two sweeps compared (one with failed requests and an unstable
    level), and a tune."""
    tmp = tmp_path_factory.mktemp("report")
    troubled = make_sweep([
        make_level(1, [900.0, 910.0, 905.0, 899.0]),
        make_level(2, [1500.0, 1100.0, 1700.0], stable=False, errors={"timeout": 3, "HTTP 503": 2}),
        make_level(4, [2600.0, 2610.0, 2590.0, 2605.0]),
    ])  # fmt: skip
    items = [
        ReportItem("before", "sweep", steady_sweep(), "before.json"),
        ReportItem("after", "sweep", troubled, "after.json"),
        load_result(tune_json(tmp)),
    ]
    return render_html(items)


def test_the_report_renders_every_image_and_table_in_chromium(report_html: str, tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    page.write_text(report_html)
    expected_images = report_html.count("<img ")
    assert expected_images == 3 + 7 + 7 + 3  # comparison, two sweeps, tune
    body, pixels, console = open_in_chromium(page, tmp_path)
    assert body.get("data-images-total") == str(expected_images)
    assert body.get("data-images-ok") == str(expected_images), "some images did not decode"
    assert int(body.get("data-tables", "0")) == report_html.count("<table")
    assert console == [], f"the page logged to the console: {console}"
    # Not blank: a real page has ink, and plenty of it.
    gray = pixels[..., :3].mean(axis=2)
    assert pixels.shape[:2] == (4000, 1280)
    assert (gray < 0.9).mean() > 0.05 and gray.std() > 0.1


def test_the_checks_catch_a_broken_image_and_a_script_error(report_html: str, tmp_path: Path) -> None:
    broken = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "data:image/png;base64,AAAA", report_html, count=1)
    broken = broken.replace("</body>", "<script>undefinedFunction();</script></body>")
    page = tmp_path / "broken.html"
    page.write_text(broken)
    body, _, console = open_in_chromium(page, tmp_path)
    total = int(body["data-images-total"])
    assert int(body["data-images-ok"]) == total - 1
    assert any("undefinedFunction" in line for line in console)
