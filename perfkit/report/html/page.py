"""The HTML report's page: `render_html(items) -> str`, one self-contained file a person can open,
rendered from result files. A pure function (STYLE practice 15): figures are inlined as base64 PNG
data URIs and nothing is fetched from the network (practice 16).

Each result file carries a `kind`; `result_files.load_result` reads it and `SECTIONS` renders it
(`sweep.py`, `tune.py`). Several sweeps in one report open with `comparison.py`'s section. The page
carries a tiny inline script (`assets.CHECK_SCRIPT`) that, once loaded, counts the images that
decoded and the tables with rows and writes them on <body> (`data-images-ok`, `data-images-total`,
`data-tables`): the browser test reads them back from Chromium's DOM dump.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence

from perfkit._version import __version__
from perfkit.analysis.compare import GATE_METRICS, Thresholds
from perfkit.errors import PerfkitError
from perfkit.report.html.assets import CHECK_SCRIPT, CSS
from perfkit.report.html.cells import anchor, esc
from perfkit.report.html.comparison import render_comparison_section
from perfkit.report.html.sweep import render_sweep_section
from perfkit.report.html.tune import render_tune_section
from perfkit.results.files import ReportItem
from perfkit.results.model import SweepResult

__all__ = ["SECTIONS", "render_html"]


SECTIONS: dict[str, Callable[[ReportItem, float | None], str]] = {
    "sweep": render_sweep_section,
    "tune": render_tune_section,
    "tune_combination": render_tune_section,
}


def render_html(
    items: Sequence[ReportItem],
    *,
    title: str | None = None,
    slo_ms: float | None = None,
    thresholds: Thresholds | None = None,
    generated_at: str | None = None,
) -> str:
    """The whole report as one HTML document. `slo_ms` draws a p99 bound on the latency figures
    (default: the sweep's own -l when it stabilised on p99); `thresholds` are the comparison's."""
    if not items:
        raise PerfkitError("nothing to report: pass at least one result file")
    thresholds = thresholds or Thresholds(metrics=tuple(GATE_METRICS))
    models = sorted({it.result.model for it in items})
    title = title or (
        "perfkit report: " + ", ".join(models) if len(items) == 1 else f"perfkit comparison of {len(items)} runs"
    )
    stamp = generated_at or dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    compared = sum(isinstance(it.result, SweepResult) for it in items) > 1
    sections = [render_comparison_section(items, thresholds, slo_ms)] if compared else []
    sections += [SECTIONS[it.kind](it, slo_ms) for it in items]
    links = ([("comparison", "Comparison")] if compared else []) + [(anchor(it), it.label) for it in items]
    nav = "".join(f'<a href="#{esc(a)}">{esc(text)}</a>' for a, text in links)
    sources = ", ".join(it.source or it.label for it in items)
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<link rel="icon" href="data:,"><title>{esc(title)}</title><style>{CSS}</style></head><body>'
        f'<header><h1>{esc(title)}</h1><div class="sub">{esc(f"generated {stamp} by perfkit {__version__} from {sources}")}'
        f"</div></header><nav>{nav}</nav><main>{''.join(sections)}</main>"
        "<footer>Latencies are exact percentiles of the reported windows' requests; confidence intervals are 95%. "
        "Figures are PNG images inlined in this file, which needs no network.</footer>"
        f"<script>{CHECK_SCRIPT}</script></body></html>\n"
    )  # fmt: skip
