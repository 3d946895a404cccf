"""What a model asks of the server besides inference: custom metrics (`pb_utils.MetricFamily`,
`pb/metrics.py`) and the model loading API (`pb_utils.load_model`, `unload_model`,
`is_model_ready`, `pb/model_control.py`).

The stub sends a `service` message (`{"op": "service", "id", "call", ...}`) and waits for its
`service_result` (`{"id", "result", "error"}`); `serve` answers it from the stub's reader. Metric
calls are answered at once, from the server's `CustomMetrics` registry; model control runs on the
server's loop, through the data plane's repository API (so explicit model control mode and the load
parameters are checked as for a client). An error is worded as Triton's python backend words it:
"Failed to process the request for model '<instance>', message: <what the server said>"; the stub
puts the operation in front ("Error when creating Metric: ...").

The metric families and metrics a stub registered are its own: `release` drops them when the stub
goes (its model unloads, or it died), so an unloaded model's families leave the metrics port.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from reference_server.backends.context import BackendContext
from reference_server.backends.custom_metrics import KINDS, CustomMetrics, MetricError
from reference_server.backends.python import ipc
from reference_server.errors import ServerError

if TYPE_CHECKING:
    from reference_server.backends.python.process import StubProcess

__all__ = ["release", "serve"]

log = logging.getLogger(__name__)

# std::stol's reading: leading space, a sign, digits, anything after ignored.
_STOL = re.compile(r"\s*([+-]?\d+)")


class _Refused(Exception):
    """A call refused with a message for the model."""


def serve(stub: StubProcess, message: dict[str, Any], fds: list[int]) -> None:
    """Answer one `service` message from `stub` (on the stub's reading side)."""
    descs = message["tensors"]
    try:
        message["tensors"] = {d[0]: ipc.read_tensor(stub.stub_arena, d, fds, copy=True) for d in descs}
    finally:
        ipc.close_fds(fds)
    stub.give_back([(d[3][1], d[3][2]) for d in descs if d[3][0] == "a"])
    context = stub.model.context
    call = message["call"]
    try:
        metrics = context.custom_metrics
        if call in _METRIC_CALLS:
            if metrics is None:
                raise _Refused("metrics not supported")
            for kind, handle in message.get("drop", ()):  # objects the model let go of
                (metrics.family_delete if kind == "family" else metrics.metric_delete)(handle)
            _answer(stub, message, _METRIC_CALLS[call](metrics, stub, message))
        elif call in _CONTROL_CALLS:
            _control(stub, context, message)
        else:
            raise _Refused(f"unknown service call '{call}'")
    except (_Refused, MetricError) as error:
        _answer(stub, message, None, str(error))


def release(stub: StubProcess) -> None:
    """Drop the metric families and metrics `stub` registered (it is gone or going)."""
    metrics = stub.model.context.custom_metrics
    if metrics is not None:
        metrics.release(_owner(stub))


def _owner(stub: StubProcess) -> int:
    return id(stub)


def _answer(stub: StubProcess, message: dict[str, Any], result: Any, error: str | None = None) -> None:
    if error is not None:
        error = f"Failed to process the request for model '{stub.instance_name}', message: {error}"
    try:
        stub.channel.send({"op": "service_result", "id": message["id"], "result": result, "error": error})
    except ipc.ChannelClosed:
        pass  # the stub is gone; nobody waits


# --- custom metrics ----------------------------------------------------------------------------------


def _family_new(metrics: CustomMetrics, stub: StubProcess, message: dict[str, Any]) -> int:
    kind = message["kind"]
    if not isinstance(kind, int) or not 0 <= kind < len(KINDS):
        raise MetricError("Unsupported kind passed to MetricFamily constructor.")
    return metrics.family_new(_owner(stub), message["name"], message["description"], KINDS[kind])


def _metric_new(metrics: CustomMetrics, stub: StubProcess, message: dict[str, Any]) -> int:
    return metrics.metric_new(_owner(stub), message["family"], message["labels"], message["buckets"])


def _family_delete(metrics: CustomMetrics, stub: StubProcess, message: dict[str, Any]) -> None:
    metrics.family_delete(message["handle"])


def _increment(metrics: CustomMetrics, stub: StubProcess, message: dict[str, Any]) -> None:
    metrics.increment(message["handle"], float(message["value"]))


def _set(metrics: CustomMetrics, stub: StubProcess, message: dict[str, Any]) -> None:
    metrics.set(message["handle"], float(message["value"]))


def _observe(metrics: CustomMetrics, stub: StubProcess, message: dict[str, Any]) -> None:
    metrics.observe(message["handle"], float(message["value"]))


def _value(metrics: CustomMetrics, stub: StubProcess, message: dict[str, Any]) -> float:
    return metrics.value(message["handle"])


def _nothing(metrics: CustomMetrics, stub: StubProcess, message: dict[str, Any]) -> None:
    return None  # only the drops it carried


_METRIC_CALLS: dict[str, Callable[[CustomMetrics, StubProcess, dict[str, Any]], Any]] = {
    "family_new": _family_new, "family_delete": _family_delete, "metric_new": _metric_new,
    "increment": _increment, "set": _set, "observe": _observe, "value": _value, "drop": _nothing,
}  # fmt: skip


# --- model control -----------------------------------------------------------------------------------

_CONTROL_CALLS = frozenset(("load_model", "unload_model", "is_model_ready"))


def _control(stub: StubProcess, context: BackendContext, message: dict[str, Any]) -> None:
    control, loop = context.model_control, context.loop
    if control is None or loop is None or loop.is_closed():
        raise _Refused("the model loading API is not available on this server here")
    call, name = message["call"], message["model_name"]
    if call == "is_model_ready":
        version = _version(message["model_version"])
        # The repository is the loop's: read it there.
        run: Any = _ready(control.model_ready, name, version)
    elif call == "load_model":
        parameters: dict[str, Any] = {path: content.tobytes() for path, content in message["tensors"].items()}
        if message["config"]:
            parameters["config"] = message["config"]
        run = control.load_model(name, parameters)
    else:
        run = control.unload_model(name, {"unload_dependents": bool(message["unload_dependents"])})
    future = asyncio.run_coroutine_threadsafe(run, loop)
    future.add_done_callback(lambda done: _controlled(stub, message, done))


async def _ready(model_ready: Callable[[str, str], bool], name: str, version: str) -> bool:
    return model_ready(name, version)


def _controlled(stub: StubProcess, message: dict[str, Any], done: Any) -> None:
    try:
        result = done.result()
    except ServerError as error:
        _answer(stub, message, None, error.message)
        return
    except Exception as error:  # a bug of ours must still answer the model
        log.exception("model control call from '%s' failed", stub.instance_name)
        _answer(stub, message, None, f"{type(error).__name__}: {error}")
        return
    _answer(stub, message, result)


def _version(text: str) -> str:
    """A readiness check's version as Triton's python backend reads it ("" = any)."""
    if not text:
        return ""
    match = _STOL.match(text)
    if match is None:
        raise _Refused(
            f"failed to get model version from specified version string '{text}' (details: stol), version should "
            "be an integral value > 0"
        )
    version = int(match.group(1))
    if version < 0:
        raise _Refused(
            f"failed to get model version from specified version string '{text}', version should be an integral "
            "value > 0"
        )
    return str(version)
