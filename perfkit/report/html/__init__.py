"""The HTML report: one self-contained file a person can open, rendered from result files.

`page.render_html(items) -> str` draws the page; each result file's `kind` picks its section:
`sweep.py` (perfkit sweep's JSON), `tune.py` (a tune, or a tune of several models), and, for several
sweeps, `comparison.py` first. `cells.py` holds the small pieces every section uses (escaping,
tables, badges, inlined figures), `assets.py` the style sheet and the load check. The figures come
from `perfkit.report.figures`.
"""

from __future__ import annotations

from perfkit.report.html.page import SECTIONS, render_html
from perfkit.report.html.sweep import render_sweep_section
from perfkit.report.html.tune import render_tune_section

__all__ = ["SECTIONS", "render_html", "render_sweep_section", "render_tune_section"]
