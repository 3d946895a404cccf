"""How a tune's ranking is told, in one place for the console summary (`report.tune_tables`) and
the HTML report (`report.html`), so that the two never say different things of the same tune.

Scores are `objectives.Objective.score`s: Σ w·s·ln(figure), an interval on a log scale, passed here
as (value, low, high) triples so that the HTML report can use them as tune.json stores them.

Differences. Variant A against variant B is exp(A − B) − 1 ("50 % better"), with the interval from
the far ends of their intervals: (A.low − B.high, A.high − B.low). That interval includes 0 exactly
when the two score intervals overlap, which is the ranking's own rule of a tie (`objectives.rank`):
a difference whose interval excludes 0 is significant, and is never shown as a tie.

Marks. One rule (`mark`) says what the ranking makes of each feasible variant:
- recommended: the pick, the cheapest variant of the tie;
- the leader: the highest score, when a cheaper variant tied with it is the pick;
- tied with the leader: in the ranking's tie, that is, its difference to the leader includes 0 and
  it was re-measured with the leader (or no leader was re-measured: the tune did not get that far,
  or --remeasure 0);
- overlaps the leader, not re-measured: its difference to the leader includes 0 too, but from one
  measurement, while the leaders' intervals come from several runs; it is not a candidate (raise
  --leaders to re-measure it with them);
- nothing: the leader is better, significantly.
The report prints `TIE_RULE`, which says the same in a sentence.

Gains. A headline claims a gain over the default only when the difference is significant
(`versus_default`); otherwise it says the pick cannot be told apart from the default, with the
interval. A tune that did not finish is provisional (`provisional`).
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass

__all__ = ["TIE_RULE", "Difference", "Score", "difference", "mark", "provisional", "versus_default"]

#: A score and its 95 % interval: (value, low, high).
Score = tuple[float, float, float]

TIE_RULE = (
    "A variant is tied with the leader when the 95 % interval of its difference to the leader includes 0 "
    "(their score intervals overlap) and it was re-measured with the leader, interleaved; the recommended "
    "variant is the one of the tie with the fewest resources. A variant whose difference includes 0 but "
    "that was measured once is marked 'overlaps the leader, not re-measured' (raise --leaders to include "
    "it). A difference whose interval excludes 0 is significant: never a tie, and the only kind of gain a "
    "headline claims."
)


@dataclass(frozen=True, slots=True)
class Difference:
    """How much better one variant scores than another, as fractions (0.5: 50 % better)."""

    gain: float
    low: float
    high: float

    @property
    def significant(self) -> bool:
        """Whether the 95 % interval excludes 0: the two variants can be told apart."""
        return self.low > 0 or self.high < 0

    def __str__(self) -> str:
        return f"{_percent(self.gain)} % ({_percent(self.low)}..{_percent(self.high)})"


def _percent(fraction: float) -> str:
    """A signed whole percentage; a fraction that rounds to 0 reads +0, never -0."""
    return f"{round(fraction * 100) or 0:+d}"


def difference(own: Score, other: Score) -> Difference:
    """`own` against `other` (see the module header): its interval includes 0 iff theirs overlap."""
    return Difference(math.expm1(own[0] - other[0]), math.expm1(own[1] - other[2]), math.expm1(own[2] - other[1]))


def mark(
    key: str,
    *,
    best: str | None,
    leader: str | None,
    ties: Collection[str],
    remeasured: Collection[str],
    scores: dict[str, Score],
) -> str:
    """The mark of a feasible variant by the rule of the module header ("" when it has none). The
    difference to the leader is shown beside a tie, so that the reader sees the 0 it includes."""
    if key == best:
        return "recommended"
    if key == leader:
        return "the leader"
    own, top = scores.get(key), scores.get(leader or "")
    against = "" if own is None or top is None else f": {difference(own, top)}"
    if key in ties:
        return f"tied with the leader{against}"
    if own is None or top is None or key in remeasured or not remeasured:
        return ""
    return f"overlaps the leader{against}, not re-measured" if not difference(own, top).significant else ""


def versus_default(d: Difference, better: str = "better", default: str = "the default configuration") -> str:
    """The pick against the default, as a headline may say it: a gain only when it is significant."""
    interval = f"95 % CI {_percent(d.low)}..{_percent(d.high)} %"
    if not d.significant:
        return f"not distinguishable from {default} ({_percent(d.gain)} %, {interval})"
    if d.gain > 0:
        return f"{d.gain * 100:.0f} % {better} than {default} ({interval})"
    # Only a default that breaks the constraints scores higher than the pick and is not picked.
    return f"{-d.gain * 100:.0f} % lower on the objective than {default} ({interval})"


def provisional(completed: bool) -> str:
    """The warning a ranking carries when the tune did not finish ("" when it did)."""
    if completed:
        return ""
    return "The tune did not finish: this ranking is provisional (the leaders were not all re-measured)."
