"""The HTML report's small pieces, shared by every section: escaping (every interpolated string goes
through `esc`, STYLE practice 16), an inlined PNG figure, a table whose all-number columns are
right-aligned, a pass/fail badge, a figure with its CI under it, and number formatting.
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Sequence
from dataclasses import dataclass

from perfkit.results.files import ReportItem

__all__ = ["Badge", "WithRange", "anchor", "esc", "fmt", "img", "number", "render_table"]


def esc(value: object) -> str:
    """`value` as text safe in an element or a quoted attribute."""
    return html.escape(str(value), quote=True)


def img(png: bytes, alt: str, wide: bool = False) -> str:
    """A figure inlined as a data URI (the file needs no network); `wide` spans the grid's row."""
    data = base64.b64encode(png).decode("ascii")
    return f'<figure class="{"wide" if wide else ""}"><img src="data:image/png;base64,{data}" alt="{esc(alt)}"></figure>'


def _numeric(value: object) -> bool:
    if isinstance(value, WithRange):
        return True
    return not isinstance(value, Badge) and _NUMERIC.fullmatch(str(value)) is not None


def render_table(header: Sequence[str], rows: Sequence[Sequence[object]], classes: str = "") -> str:
    """A table; columns whose cells are all numbers are right-aligned, header included."""
    numeric = [bool(rows) and all(_numeric(row[i]) for row in rows) for i in range(len(header))]
    head = "".join(f'<th class="n">{esc(h)}</th>' if n else f"<th>{esc(h)}</th>" for h, n in zip(header, numeric))
    body = "".join("<tr>" + "".join(_cell(c) for c in row) + "</tr>" for row in rows)
    return f'<table class="{esc(classes)}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


@dataclass(frozen=True, slots=True)
class Badge:
    """A cell's pass/fail mark (green or red)."""

    text: str
    ok: bool


@dataclass(frozen=True, slots=True)
class WithRange:
    """A figure with its 95% CI under it, small: one column where two would widen the table."""

    value: str
    low: str
    high: str


_NUMERIC = re.compile(r"[-+]?[\d,.]+( ?[–%] ?[\d,.]*%?)?|-")


def _cell(value: object) -> str:
    if isinstance(value, Badge):
        return f'<td><span class="badge {"ok" if value.ok else "bad"}">{esc(value.text)}</span></td>'
    if isinstance(value, WithRange):
        ci = "" if value.low == value.high == "-" else f'<span class="ci">{esc(value.low)}–{esc(value.high)}</span>'
        return f'<td class="n">{esc(value.value)}{ci}</td>'
    return f'<td class="n">{esc(value)}</td>' if _numeric(value) else f"<td>{esc(value)}</td>"


def number(value: str | float | None, digits: int) -> str:
    """A tidy CSV cell's figure with `digits` decimals; "-" when the level has none."""
    return "-" if value is None or isinstance(value, str) else f"{value:,.{digits}f}"


def fmt(value: float | None, digits: int = 2) -> str:
    """A figure with `digits` decimals and thousands separators; "-" when there is none."""
    return "-" if value is None else f"{value:,.{digits}f}"


def anchor(item: ReportItem) -> str:
    """The id of a result's section, which the page's navigation links to."""
    return "run-" + "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in item.label)
