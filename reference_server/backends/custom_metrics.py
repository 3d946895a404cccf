"""Custom metrics: the metric families that models register (Triton core's TRITONSERVER_MetricFamily
and TRITONSERVER_Metric API, which the python backend's `pb_utils.MetricFamily` reaches), listed on
the metrics port beside the `nv_*` families.

One registry per server, handed to backends in their `BackendContext`. A family is a name, a kind
(counter, gauge, histogram) and a description; a metric is one label set of a family. Both are
held through handles that belong to an owner (a python stub process): what an owner holds goes
when it lets go of it or when the owner goes (`release`, at unload or when the stub dies). A family
without metrics is not listed (as on Triton); one with neither handles nor metrics left is
forgotten, its name free again.

As Triton (prometheus-cpp under it): registering a family name again with the same kind returns the
same family, keeping its first description; with another kind it is refused. Two metrics of a family
with the same labels are one series, shared. A bad name or label, a negative counter increment,
`set` on a counter, and `observe` on anything but a histogram are refused with core's words. A
histogram's "le" label is refused too (prometheus-cpp accepts it and prints broken lines).
"""

from __future__ import annotations

import bisect
import itertools
import math
import re
import threading
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["COUNTER", "GAUGE", "HISTOGRAM", "KINDS", "CustomMetrics", "FamilyView", "MetricError"]

COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
#: pb_utils.MetricFamily.COUNTER, GAUGE, HISTOGRAM (MetricKind 0, 1, 2) by number.
KINDS = (COUNTER, GAUGE, HISTOGRAM)
_CORE_KIND = {COUNTER: "TRITONSERVER_METRIC_KIND_COUNTER", GAUGE: "TRITONSERVER_METRIC_KIND_GAUGE",
              HISTOGRAM: "TRITONSERVER_METRIC_KIND_HISTOGRAM"}  # fmt: skip

# Prometheus' data model, as prometheus-cpp checks it.
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")

Labels = tuple[tuple[str, str], ...]


class MetricError(ValueError):
    """A refused metric operation, in Triton core's (or prometheus-cpp's) words."""


@dataclass(slots=True)
class _Series:
    labels: Labels
    buckets: tuple[float, ...] = ()
    value: float = 0.0  # a counter's or gauge's value; a histogram's sum
    counts: list[int] = field(default_factory=list)  # a histogram's per-bucket counts, +Inf last
    refs: int = 0


@dataclass(slots=True)
class _Family:
    name: str
    kind: str
    description: str
    series: dict[Labels, _Series] = field(default_factory=dict)
    refs: int = 0


@dataclass(frozen=True, slots=True)
class FamilyView:
    """One family as the metrics endpoint lists it: (sample name, labels, value) per line."""

    name: str
    kind: str
    description: str
    samples: list[tuple[str, dict[str, str], float]]


class CustomMetrics:
    """The server's custom metric families; safe to use from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._families: dict[str, _Family] = {}
        self._handles = itertools.count(1)
        #: handle → (owner, family) for families, (owner, family, series) for metrics.
        self._family_handles: dict[int, tuple[Hashable, _Family]] = {}
        self._metric_handles: dict[int, tuple[Hashable, _Family, _Series]] = {}

    # --- families and metrics ----------------------------------------------------------------------

    def family_new(self, owner: Hashable, name: str, description: str, kind: str) -> int:
        """A handle on family `name`, registering it if it is new."""
        if kind not in KINDS:
            raise MetricError("Unsupported kind passed to MetricFamily constructor.")
        if not _METRIC_NAME.fullmatch(name):
            raise MetricError("Invalid metric name")
        with self._lock:
            family = self._families.get(name)
            if family is None:
                family = self._families[name] = _Family(name, kind, description)
            elif family.kind != kind:
                raise MetricError("Family name already exists with different type")
            family.refs += 1
            handle = next(self._handles)
            self._family_handles[handle] = (owner, family)
            return handle

    def family_delete(self, handle: int) -> None:
        with self._lock:
            entry = self._family_handles.pop(handle, None)
            if entry is not None:
                entry[1].refs -= 1
                self._forget_if_unused(entry[1])

    def metric_new(
        self, owner: Hashable, family_handle: int, labels: Mapping[str, str], buckets: Sequence[float] | None
    ) -> int:
        """A handle on the series of `labels` in the family, creating it if it is new."""
        with self._lock:
            entry = self._family_handles.get(family_handle)
            if entry is None:
                raise MetricError("Could not create metric. MetricFamily has been deleted.")
            family = entry[1]
            for name, value in labels.items():
                # "le" is a histogram's bucket label, and names starting "__" are Prometheus' own.
                if (
                    not _LABEL_NAME.fullmatch(name)
                    or name.startswith("__")
                    or (family.kind == HISTOGRAM and name == "le")
                ):
                    raise MetricError("Invalid label name")
                if not isinstance(value, str):
                    raise MetricError("attempt to access JSON non-string as string")
            if family.kind == HISTOGRAM:
                if buckets is None:
                    raise MetricError("Bucket boundaries not found in Metric args.")
                bounds = tuple(float(b) for b in buckets)
                if any(b >= a for a, b in zip(bounds[1:], bounds)) or any(math.isnan(b) for b in bounds):
                    raise MetricError("Bucket Boundaries must be strictly sorted")
            elif buckets is not None:
                raise MetricError(f"Unexpected args found in {family.kind} Metric constructor.")
            else:
                bounds = ()
            key: Labels = tuple(sorted(labels.items()))
            series = family.series.get(key)
            if series is None:
                series = family.series[key] = _Series(key, bounds, counts=[0] * (len(bounds) + 1) if
                                                      family.kind == HISTOGRAM else [])  # fmt: skip
            series.refs += 1
            handle = next(self._handles)
            self._metric_handles[handle] = (owner, family, series)
            return handle

    def metric_delete(self, handle: int) -> None:
        with self._lock:
            entry = self._metric_handles.pop(handle, None)
            if entry is not None:
                self._drop_series(entry[1], entry[2])

    def release(self, owner: Hashable) -> None:
        """Let go of everything `owner` holds (its model unloaded, or its process died)."""
        with self._lock:
            for handle, (holder, family, series) in list(self._metric_handles.items()):
                if holder == owner:
                    del self._metric_handles[handle]
                    self._drop_series(family, series)
            for handle, (holder, family) in list(self._family_handles.items()):
                if holder == owner:
                    del self._family_handles[handle]
                    family.refs -= 1
                    self._forget_if_unused(family)

    def _drop_series(self, family: _Family, series: _Series) -> None:
        series.refs -= 1
        if series.refs <= 0:
            family.series.pop(series.labels, None)
        self._forget_if_unused(family)

    def _forget_if_unused(self, family: _Family) -> None:
        if family.refs <= 0 and not family.series and self._families.get(family.name) is family:
            del self._families[family.name]

    # --- values ------------------------------------------------------------------------------------

    def _series(self, handle: int, action: str) -> tuple[_Family, _Series]:
        entry = self._metric_handles.get(handle)
        if entry is None:
            raise MetricError(f"Could not {action} metric value. Metric has been invalidated.")
        return entry[1], entry[2]

    def increment(self, handle: int, value: float) -> None:
        with self._lock:
            family, series = self._series(handle, "increment")
            if family.kind == HISTOGRAM:
                raise MetricError(f"{_CORE_KIND[HISTOGRAM]} does not support Increment")
            if family.kind == COUNTER and value < 0:
                raise MetricError(
                    f"{_CORE_KIND[COUNTER]} can only be incremented monotonically by non-negative values."
                )
            series.value += value

    def set(self, handle: int, value: float) -> None:
        with self._lock:
            family, series = self._series(handle, "set")
            if family.kind != GAUGE:
                raise MetricError(f"{_CORE_KIND[family.kind]} does not support Set")
            series.value = value

    def observe(self, handle: int, value: float) -> None:
        with self._lock:
            family, series = self._series(handle, "set")  # core's words for Observe too
            if family.kind != HISTOGRAM:
                raise MetricError(f"{_CORE_KIND[family.kind]} does not support Observe")
            series.counts[bisect.bisect_left(series.buckets, value)] += 1
            series.value += value

    def value(self, handle: int) -> float:
        with self._lock:
            family, series = self._series(handle, "get")
            if family.kind == HISTOGRAM:
                raise MetricError(f"{_CORE_KIND[HISTOGRAM]} does not support Value")
            return series.value

    # --- listing -----------------------------------------------------------------------------------

    def families(self) -> list[FamilyView]:
        """The families with at least one metric, counters then gauges then histograms, each in the
        order registered (as Triton lists them); a histogram's lines as Triton prints them: `_count`,
        `_sum`, then `_bucket` with "le" last."""
        with self._lock:
            listed = sorted(self._families.values(), key=lambda f: KINDS.index(f.kind))
            return [
                FamilyView(family.name, family.kind, family.description, _samples(family))
                for family in listed
                if family.series
            ]

    def __len__(self) -> int:
        with self._lock:
            return sum(1 for family in self._families.values() if family.series)


def _samples(family: _Family) -> list[tuple[str, dict[str, str], float]]:
    samples: list[tuple[str, dict[str, str], float]] = []
    for series in family.series.values():
        labels = dict(series.labels)
        if family.kind != HISTOGRAM:
            samples.append((family.name, labels, series.value))
            continue
        samples.append((family.name + "_count", labels, float(sum(series.counts))))
        samples.append((family.name + "_sum", labels, series.value))
        cumulative = 0
        for bound, count in zip((*series.buckets, math.inf), series.counts):
            cumulative += count
            samples.append((family.name + "_bucket", {**labels, "le": _bound(bound)}, float(cumulative)))
    return samples


def _bound(bound: float) -> str:
    if math.isinf(bound):
        return "+Inf" if bound > 0 else "-Inf"
    return str(int(bound)) if bound.is_integer() else repr(bound)
