"""An SLO gate: which levels of a sweep kept p99 within a bound, and the throughput they reached.

The SLO is judged on p99 from the intended send time, which is what a user arriving on schedule
sees (equal to the service latency in concurrency mode); a level with failed requests does not meet
it. With a minimum throughput the gate fails unless some level within the SLO reached it.
"""

from __future__ import annotations

from dataclasses import dataclass

from perfkit.analysis.compare import level_label
from perfkit.analysis.metrics import metric, throughput_unit
from perfkit.results.model import LevelResult, SweepResult

__all__ = ["SloVerdict", "check_slo"]

_P99 = metric("p99_from_intended_ms")


@dataclass(frozen=True, slots=True)
class SloVerdict:
    """Which levels kept p99 (from the intended send time) within the bound, and the capacity."""

    slo_p99_ms: float
    min_throughput: float | None
    within: tuple[str, ...]  # level labels
    capacity: float  # highest throughput among the levels within the SLO (0: none)
    capacity_level: str
    #: req/s for a generative run (a request is one completion), infer/s otherwise: the console's words
    unit: str = "infer/s"

    @property
    def passed(self) -> bool:
        return self.min_throughput is None or self.capacity >= self.min_throughput

    def lines(self) -> list[str]:
        head = f"SLO p99 <= {self.slo_p99_ms:g} ms"
        if not self.within:
            text = f"{head}: no level met it"
        else:
            text = f"{head}: {len(self.within)} level(s) met it; capacity {self.capacity:,.1f} {self.unit} at {self.capacity_level}"
        if self.min_throughput is not None:
            verdict = "passed" if self.passed else "FAILED"
            text += f"; gate {verdict} (needs {self.min_throughput:,.1f} {self.unit} within the SLO)"
        return [text]


def _meets(level: LevelResult, slo_p99_ms: float) -> bool:
    p99 = _P99.value(level)
    return p99 is not None and level.error_count == 0 and p99 <= slo_p99_ms


def check_slo(result: SweepResult, slo_p99_ms: float, min_throughput: float | None = None) -> SloVerdict:
    """The verdict of the SLO `slo_p99_ms` (and `min_throughput`, when given) on `result`."""
    within = [lv for lv in result.levels if _meets(lv, slo_p99_ms)]
    best = max(within, key=lambda lv: lv.throughput_infer_per_s, default=None)
    return SloVerdict(
        slo_p99_ms,
        min_throughput,
        tuple(level_label(lv) for lv in within),
        best.throughput_infer_per_s if best else 0.0,
        level_label(best) if best else "-",
        throughput_unit(result),
    )
