"""JUnit XML for CI systems (GitLab, Jenkins, GitHub test reporters): a gate's verdicts as test cases.

`perfkit compare --junit` and `perfkit run` write one suite: a case per metric and level of a
comparison (failed where it regressed, skipped where it was not measured) and a case per SLO gate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from xml.etree import ElementTree as ET

from perfkit.analysis.compare import Comparison
from perfkit.analysis.slo import SloVerdict
from perfkit.report.compare_text import format_change, format_value, render_comparison_lines

__all__ = ["JUnitCase", "comparison_cases", "comparison_properties", "render_gate_junit", "render_junit", "slo_case"]


@dataclass(frozen=True, slots=True)
class JUnitCase:
    """One test case of a JUnit report: failed when `failure` is set, skipped when `skipped` is."""

    classname: str
    name: str
    summary: str
    failure: bool = False
    skipped: bool = False


def comparison_cases(comparison: Comparison) -> list[JUnitCase]:
    """A test case per metric and level: failed where it regressed, skipped where not measured."""
    cases = []
    for d in comparison.deltas:
        summary = (
            f"{d.metric} at {d.level}: {format_value(d.baseline)} -> {format_value(d.candidate)} {d.unit} "
            f"({format_change(d.change_pct)}, limit {d.limit_pct:g}%); {d.noise.detail or d.noise.method}: {d.verdict}"
        )
        classname = "perfkit.analysis.compare." + d.level.replace(" ", "_").replace(".", "_").replace("/", "_per_")
        cases.append(JUnitCase(classname, d.metric, summary, d.regression, d.verdict == "not measured"))
    return cases


def render_junit(
    suite: str,
    cases: Sequence[JUnitCase],
    properties: Sequence[tuple[str, str]] = (),
    output: str = "",
) -> str:
    """JUnit XML that CI systems (GitLab, Jenkins, GitHub test reporters) show as tests."""
    counts = {
        "tests": str(len(cases)),
        "failures": str(sum(c.failure for c in cases)),
        "errors": "0",
        "skipped": str(sum(c.skipped and not c.failure for c in cases)),
    }
    root = ET.Element("testsuites", {"name": "perfkit", **counts})
    element = ET.SubElement(root, "testsuite", {"name": suite, "time": "0", **counts})
    if properties:
        props = ET.SubElement(element, "properties")
        for name, value in properties:
            ET.SubElement(props, "property", name=name, value=value)
    for case in cases:
        node = ET.SubElement(element, "testcase", classname=case.classname, name=case.name, time="0")
        if case.failure:
            ET.SubElement(node, "failure", message=case.summary, type="PerformanceRegression").text = case.summary
        elif case.skipped:
            ET.SubElement(node, "skipped", message=case.summary)
        else:
            ET.SubElement(node, "system-out").text = case.summary
    if output:
        ET.SubElement(element, "system-out").text = output
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def comparison_properties(comparison: Comparison) -> list[tuple[str, str]]:
    """The suite's properties: what was compared, the gate's limits, and a `warning` for each way
    the runs were set up differently or a run has levels that are not valid."""
    t = comparison.thresholds
    return [
        ("baseline", comparison.baseline),
        ("candidate", comparison.candidate),
        ("max_throughput_drop_pct", f"{t.max_throughput_drop_pct:g}"),
        ("max_latency_increase_pct", f"{t.max_latency_increase_pct:g}"),
        ("alpha", f"{t.alpha:g}"),
        (
            "significance",
            "thresholds only: no per-window samples" if comparison.thresholds_only else "per-window samples",
        ),
        *(("warning", warning) for warning in comparison.warnings),
    ]


def slo_case(verdict: SloVerdict) -> JUnitCase:
    """The SLO gate as one case, failed when the capacity within the SLO is too low."""
    return JUnitCase("perfkit.slo", f"p99<={verdict.slo_p99_ms:g}ms", verdict.lines()[0], failure=not verdict.passed)


def render_gate_junit(comparison: Comparison | None, extra: Sequence[JUnitCase] = ()) -> str:
    """The JUnit XML of a gate: the comparison's verdicts (if any) and `extra` cases (an SLO)."""
    cases = (comparison_cases(comparison) if comparison else []) + list(extra)
    properties = comparison_properties(comparison) if comparison else []
    output = "\n".join(render_comparison_lines(comparison)) if comparison else ""
    return render_junit("perfkit performance gate", cases, properties, output)
