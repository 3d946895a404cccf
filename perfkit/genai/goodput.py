"""Goodput: the rate of requests that met every service-level objective, beside the throughput.

`--goodput 'ttft_ms<=200,itl_ms<=20'` names per-request figures and their bounds (DistServe's and
AIPerf's definition: a request counts when each named figure of it is within its bound; goodput =
such requests / measured seconds). The figures: `ttft_ms`, `ttst_ms`, `itl_ms`, `latency_ms` (end to
end) with `<=`, and `output_tokens_per_s` (the request's own decode rate) with `>=`. A request
without a figure (one token: no inter-token gap; no second response: no TTST) cannot miss its
bound, and counts as meeting it; the token figures need `--streaming`, which `validate` says.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from perfkit.errors import PerfkitError
from perfkit.results.model import LevelResult, SweepResult, level_name

__all__ = [
    "DEFAULT_ATTAINMENT_PCT", "SLO_FIGURES", "GoodputVerdict", "Slo", "check_goodput", "goodput_holds", "met_mask",
    "parse_goodput", "render_goodput",
]  # fmt: skip

#: Goodput "holds" at a level when this share of its successful requests met every objective
#: (DistServe's SLO attainment, whose evaluations use 90%).
DEFAULT_ATTAINMENT_PCT = 90.0

#: The figures an objective can bound, with the comparison each takes.
SLO_FIGURES: Mapping[str, str] = {
    "ttft_ms": "<=",
    "ttst_ms": "<=",
    "itl_ms": "<=",
    "latency_ms": "<=",
    "output_tokens_per_s": ">=",
}
STREAMED_FIGURES = ("ttft_ms", "ttst_ms", "itl_ms", "output_tokens_per_s")
_TERM = re.compile(r"^\s*([a-z_]+)\s*(<=|>=|<|>|=|:)\s*([^\s,]+)\s*$")


@dataclass(frozen=True, slots=True)
class Slo:
    figure: str
    op: str  # "<=" or ">="
    limit: float

    def __str__(self) -> str:
        return f"{self.figure}{self.op}{self.limit:g}"


def parse_goodput(text: str) -> tuple[Slo, ...]:
    """`ttft_ms<=200,itl_ms<=20` (`:` also reads as the figure's own comparison, AIPerf's spelling)."""
    slos: list[Slo] = []
    for term in filter(None, (t.strip() for t in text.split(","))):
        match = _TERM.match(term)
        figures = ", ".join(f"{name}{op}N" for name, op in SLO_FIGURES.items())
        if match is None:
            raise PerfkitError(f"--goodput '{term}': write FIGURE<=LIMIT, e.g. 'ttft_ms<=200,itl_ms<=20' ({figures})")
        figure, op, raw = match.groups()
        if figure not in SLO_FIGURES:
            raise PerfkitError(f"--goodput: unknown figure '{figure}'; choose from {figures}")
        wanted = SLO_FIGURES[figure]
        if op not in (":", wanted):
            raise PerfkitError(f"--goodput: {figure} is bounded with {wanted} ({figure}{wanted}{raw}), not {op}")
        try:
            limit = float(raw)
        except ValueError:
            raise PerfkitError(f"--goodput: {figure}'s limit '{raw}' is not a number") from None
        if not limit > 0:
            raise PerfkitError(f"--goodput: {figure}'s limit must be positive, not {raw}")
        if any(s.figure == figure for s in slos):
            raise PerfkitError(f"--goodput names {figure} twice; keep one bound")
        slos.append(Slo(figure, wanted, limit))
    if not slos:
        raise PerfkitError("--goodput is empty: give at least one bound, e.g. 'ttft_ms<=200'")
    return tuple(slos)


def render_goodput(slos: tuple[Slo, ...]) -> str:
    return ",".join(map(str, slos))


def met_mask(
    slos: tuple[Slo, ...], figures: Mapping[str, npt.NDArray[np.float64]], count: int
) -> npt.NDArray[np.bool_]:
    """Which of `count` requests met every objective; `figures` holds each figure per request (NaN:
    the request has no such figure, which meets any bound)."""
    met = np.ones(count, dtype=np.bool_)
    for slo in slos:
        values = figures[slo.figure]
        with np.errstate(invalid="ignore"):
            within = values <= slo.limit if slo.op == "<=" else values >= slo.limit
        met &= within | np.isnan(values)
    return met


def goodput_holds(level: LevelResult, attainment_pct: float) -> bool:
    """The level's requests all succeeded and `attainment_pct` of them met every objective."""
    t = level.tokens
    return t is not None and t.goodput_pct is not None and level.error_count == 0 and t.goodput_pct >= attainment_pct


@dataclass(frozen=True, slots=True)
class GoodputVerdict:
    """A sweep's goodput: its best rate, the highest level at which goodput held, and the gate."""

    slo: str
    attainment_pct: float
    best_per_s: float
    best_level: str
    highest_holding: str  # "" when no level held
    min_per_s: float | None

    @property
    def passed(self) -> bool:
        return self.min_per_s is None or self.best_per_s >= self.min_per_s

    def lines(self) -> list[str]:
        held = (f"held ({self.attainment_pct:g}% of requests within) up to {self.highest_holding}"
                if self.highest_holding else f"held ({self.attainment_pct:g}% within) at no level")  # fmt: skip
        text = f"goodput {self.slo}: best {self.best_per_s:,.1f} req/s at {self.best_level}; {held}"
        if self.min_per_s is not None:
            text += f"; gate {'passed' if self.passed else 'FAILED'} (needs {self.min_per_s:,.1f} req/s)"
        return [text]


def check_goodput(
    result: SweepResult, min_per_s: float | None = None, attainment_pct: float = DEFAULT_ATTAINMENT_PCT
) -> GoodputVerdict:
    """The goodput verdict of a sweep run with `--goodput`; a PerfkitError when it was not."""
    levels = [lv for lv in result.levels if lv.tokens is not None and lv.tokens.goodput_per_s is not None]
    if not levels:
        raise PerfkitError("the goodput gate needs a sweep run with --goodput and a generative --endpoint-type")
    best = max(levels, key=lambda lv: lv.tokens.goodput_per_s or 0.0)  # type: ignore[union-attr]
    holding = [lv for lv in levels if goodput_holds(lv, attainment_pct)]
    highest = max(holding, key=lambda lv: lv.level, default=None)
    assert best.tokens is not None
    return GoodputVerdict(
        best.tokens.goodput_slo, attainment_pct, best.tokens.goodput_per_s or 0.0,
        level_name(best.mode, best.level, short=True),
        level_name(highest.mode, highest.level, short=True) if highest else "", min_per_s,
    )  # fmt: skip
