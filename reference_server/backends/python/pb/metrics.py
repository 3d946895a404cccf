"""`pb_utils.MetricFamily` and `pb_utils.Metric`: custom metrics from model.py (Triton's python
backend README, "Custom Metrics"), listed on the server's metrics port beside the `nv_*` families.

```python
family = pb_utils.MetricFamily(name="requests_seen", description="Requests seen",
                               kind=pb_utils.MetricFamily.COUNTER)
metric = family.Metric(labels={"model": "m", "version": "1"})
metric.increment(1)
```

A HISTOGRAM family's metrics take `buckets=[...]` (upper bounds, ascending) and `observe(value)`.
Every call goes to the server (`backends/python/services.py`, where the values live) and waits for
its answer; misuse is refused with Triton's words, as TritonModelException. A Metric (or a family
with no Metric left) that the model lets go of leaves the metrics port with the model's next metric
call; everything the model registered leaves when the model unloads.
"""

from __future__ import annotations

import enum
import json
import queue
from typing import Any, ClassVar

# Imported by pb_utils, which this module needs at call time only: import pb_utils, not this.
from reference_server.backends.python.pb import triton_python_backend_utils as pb

__all__ = ["Metric", "MetricFamily", "MetricKind"]

#: ("metric" | "family", handle) of objects the model let go of: `__del__` may run on any thread at
#: any moment (inside a send, even), so it only queues them; the next call takes them to the server.
_dropped: queue.SimpleQueue[tuple[str, int]] = queue.SimpleQueue()


class MetricKind(enum.IntEnum):
    """pb_utils.MetricKind (also MetricFamily.COUNTER, GAUGE, HISTOGRAM)."""

    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


def _call(call: str, prefix: str, **args: Any) -> Any:
    drop = []
    while True:
        try:
            drop.append(_dropped.get_nowait())
        except queue.Empty:
            break
    try:
        return pb._bridge().call_server(call, {"drop": drop, **args})
    except pb.TritonModelException as exc:
        raise pb.TritonModelException(prefix + str(exc)) from None


class MetricFamily:
    """A family of metrics: one name, kind and description, a metric per label set."""

    COUNTER: ClassVar[MetricKind] = MetricKind.COUNTER
    GAUGE: ClassVar[MetricKind] = MetricKind.GAUGE
    HISTOGRAM: ClassVar[MetricKind] = MetricKind.HISTOGRAM

    def __init__(self, name: str, description: str, kind: MetricKind) -> None:
        if not isinstance(name, str) or not isinstance(description, str) or not isinstance(kind, MetricKind):
            # Triton's binding (pybind11) takes exactly these types.
            raise TypeError(
                "__init__(): incompatible constructor arguments. The following argument types are supported:\n"
                "    1. c_python_backend_utils.MetricFamily(name: str, description: str, kind: "
                f"c_python_backend_utils.MetricKind)\n\nInvoked with: kwargs: name={name!r}, "
                f"description={description!r}, kind={kind!r}"
            )
        self._name = name
        self._kind = kind
        self._handle: int | None = None
        self._handle = _call(
            "family_new", "Error when creating MetricFamily: ", name=name, description=description, kind=int(kind)
        )

    def Metric(self, labels: dict[str, str] | None = None, buckets: list[float] | None = None) -> Metric:
        """A metric of this family for `labels` (a HISTOGRAM's also needs `buckets`, a list)."""
        if labels is not None and not isinstance(labels, dict):
            raise pb.TritonModelException("Failed to create metric. Labels must be a dictionary.")
        if buckets is not None:
            if not isinstance(buckets, list):
                raise pb.TritonModelException("Failed to create metric. Buckets must be a list.")
            if self._kind != MetricKind.HISTOGRAM:
                raise pb.TritonModelException("Failed to create metric. Unexpected buckets found.")
        elif self._kind == MetricKind.HISTOGRAM:
            raise pb.TritonModelException("Failed to create metric. Missing required buckets.")
        # As Triton's stub sends them: through JSON, so keys become strings and values stay as given.
        wire = json.loads(json.dumps(labels)) or {}
        return Metric(self, wire, None if buckets is None else [float(b) for b in buckets])

    def __del__(self) -> None:
        if self._handle is not None:
            _dropped.put(("family", self._handle))


class Metric:
    """One label set of a family: `increment`, `set` (GAUGE), `observe` (HISTOGRAM), `value`."""

    def __init__(self, family: MetricFamily, labels: dict[str, Any], buckets: list[float] | None) -> None:
        self._family = family  # a family outlives its metrics
        self._handle: int | None = None
        self._handle = _call(
            "metric_new", "Error when creating Metric: ", family=family._handle, labels=labels, buckets=buckets
        )

    def increment(self, value: float) -> None:
        _call("increment", "Failed to increment metric value: ", handle=self._handle, value=_number(value, "increment"))

    def set(self, value: float) -> None:
        _call("set", "Failed to set metric value: ", handle=self._handle, value=_number(value, "set"))

    def observe(self, value: float) -> None:
        _call("observe", "Failed to observe metric value: ", handle=self._handle, value=_number(value, "observe"))

    def value(self) -> float:
        result: float = _call("value", "Failed to get metric value: ", handle=self._handle)
        return result

    def __del__(self) -> None:
        if self._handle is not None:
            _dropped.put(("metric", self._handle))


def _number(value: Any, method: str) -> float:
    # As pybind11 converts to a double: anything with __float__ or __index__, but no string.
    kind = type(value)
    if isinstance(value, (str, bytes)) or not (hasattr(kind, "__float__") or hasattr(kind, "__index__")):
        raise TypeError(
            f"{method}(): incompatible function arguments. The following argument types are supported:\n"
            f"    1. (self: c_python_backend_utils.Metric, arg0: float) -> None\n\nInvoked with: {value!r}"
        )
    return float(value)
