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

__all__ = ["SLO_FIGURES", "Slo", "met_mask", "parse_goodput", "render_goodput"]

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
