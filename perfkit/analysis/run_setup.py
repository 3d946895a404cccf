"""What two runs were set up to measure, side by side: the differences a comparison must warn about.

A change between a baseline and a candidate is only the build's when everything else was the same.
When the runs differ in protocol, endpoint, batch size, model or machine, the gate still runs (a
team may mean to compare HTTP with gRPC, or one host with another), but every output says so first:
the console, the JUnit properties and the HTML report. So does a run with levels that failed their
validity checks, whose figures the gate then trusts less than it seems to.

Everything is read from the result itself: the protocol and URL it measured, its provenance (the
server, the machine, the spec it ran with) and its levels. A perf_analyzer CSV records none of that:
what a run does not record is not compared.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from perfkit.results.model import SweepResult, level_name

__all__ = ["batch_sizes", "invalid_levels", "setup_differences"]


def _spec(result: SweepResult) -> dict[str, Any]:
    return result.provenance.get("spec") or {}


def _protocol(result: SweepResult) -> str:
    spec = _spec(result)
    streamed = (spec.get("data_path") or {}).get("streaming") or (spec.get("genai") or {}).get("streaming")
    return f"{result.protocol}{' streaming' if streamed else ''}" if result.protocol else ""


def _server(result: SweepResult) -> str:
    if (result.provenance.get("server") or {}).get("embedded"):
        return "the embedded reference server"  # its port is new each run: not a difference
    return result.url


def _endpoint_type(result: SweepResult) -> str:
    genai = _spec(result).get("genai") or {}
    kind = str(genai.get("endpoint_type") or "")
    return f"{kind} at {genai['endpoint']}" if kind and genai.get("endpoint") else kind


def _model(result: SweepResult) -> str:
    return result.model + (f" version {result.model_version}" if result.model and result.model_version else "")


def batch_sizes(result: SweepResult) -> str:
    """The batch sizes of a run's levels, as text ('1', '1, 4'); '' for a run with no level."""
    return ", ".join(str(size) for size in sorted({lv.batch_size for lv in result.levels}))


#: What names a machine, each with how it reads in a warning.
_MACHINE = (("hostname", "{}"), ("cpu_count", "{} CPUs"), ("platform", "{}"))


def _machines(baseline: SweepResult, candidate: SweepResult) -> tuple[str, str]:
    """The two machines, each told by what differs of hostname, CPU count and platform."""
    a, b = ((r.provenance.get("machine") or {}) for r in (baseline, candidate))
    differ = [(key, form) for key, form in _MACHINE if a.get(key) and b.get(key) and a[key] != b[key]]
    return ", ".join(form.format(a[key]) for key, form in differ), ", ".join(form.format(b[key]) for key, form in differ)


#: What a comparison checks, each with how to read it from a result ('' when the run does not say).
_ASPECTS: tuple[tuple[str, Callable[[SweepResult], str], str], ...] = (
    ("protocol", _protocol, "client and server costs differ by protocol"),
    ("server", _server, "a different server or address measures something else"),
    ("endpoint type", _endpoint_type, "the requests differ"),
    ("batch size", batch_sizes, "levels are matched by load alone; throughput counts inferences"),
    ("model", _model, "a different model measures something else"),
)


def setup_differences(baseline: SweepResult, candidate: SweepResult, names: tuple[str, str]) -> list[str]:
    """One warning per way the two runs were set up differently, naming both values."""
    pairs = [(aspect, read(baseline), read(candidate), why) for aspect, read, why in _ASPECTS]
    pairs.append(("machine", *_machines(baseline, candidate), "differences may be the machine's"))
    return [
        f"the runs differ in {aspect}: {names[0]} {base}, {names[1]} {cand} ({why})"
        for aspect, base, cand, why in pairs
        if base and cand and base != cand
    ]


def invalid_levels(result: SweepResult, role: str, name: str) -> str:
    """A warning naming the levels of the `role` run ('baseline', 'candidate'), labelled `name`,
    that failed a validity check; '' when all passed."""
    bad = [lv for lv in result.levels if not lv.valid]
    if not bad:
        return ""
    labels = ", ".join(level_name(lv.mode, lv.level, short=True) for lv in bad)
    failed = sorted({c.name for lv in bad for c in lv.checks if not c.passed})
    checks = f", failing {', '.join(failed)}" if failed else ""
    who = f"the {role}" if name == role else f"the {role} ({name})"
    return (
        f"{who} has {len(bad)} of {len(result.levels)} levels not valid ({labels}{checks}): "
        "their figures may not be what the build does; its report says why and what to change"
    )
