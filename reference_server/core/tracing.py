"""Triton's trace extension: the trace settings, which requests are traced, and the trace files.

Settings (tritonserver's src/tracer.cc, `TraceManager`). One global setting, begun from
`--trace-config` (`startup_settings`), and one per model that asked for one; a model's setting
names the fields it was given (`specified`) and takes the rest from the global one, also when the
global one changes later. Setting a field to null (HTTP) or to no value (gRPC) clears it: a model's
falls back to the global value again, the global one to its value at start. A model with no field
of its own left has no setting of its own. The answer reports the setting in force, every value a
string (the level a list of them), with `trace_count` the traces still to take.

Sampling: a setting takes every `trace_rate`-th request it sees while `trace_count` is not used up
(-1: no limit), if its level is not OFF and it has a file. `Tracing.active` is True only while some
setting could take a request, so that with tracing off the data plane pays one attribute check per
request and makes nothing.

A traced request (`RequestTrace`, `core/request_trace.py`) records TIMESTAMPS as Triton's do, on
the same clock (`time.perf_counter_ns`, CLOCK_MONOTONIC like Triton's steady clock): the front end's
`HTTP_RECV_START`/`HTTP_RECV_END` (gRPC: `GRPC_WAITREAD_START`/`GRPC_WAITREAD_END`), when it began
reading the request's body (its HTTP head complete; its HTTP/2 stream opened) and when the body was
complete, which the front end takes only while `active` and hands over in `Tracing.received`
(HTTP generate hands it over too; a compressed gRPC request, handed over from a task, and a gRPC
stream's request have both at their arrival in the data plane); `REQUEST_START`, `QUEUE_START`, `COMPUTE_START`, `COMPUTE_INPUT_END`,
`COMPUTE_OUTPUT_START`, `COMPUTE_END` and `REQUEST_END` from the scheduler's own timings of the
request (the trace is the request's secondary statistics, so the scheduler records it as it records
the model's); and Triton's `INFER_RESPONSE_COMPLETE`, then `HTTP_SEND_START`/`HTTP_SEND_END`
(`GRPC_SEND_*`), around the answer's hand-off to the front end. A streamed request (gRPC
ModelStreamInfer, HTTP generate) has one trace with a send per response it sends (from its
hand-off until the front end asks for the next), and INFER_RESPONSE_COMPLETE for the first response
over gRPC, for each response and a final flag sent alone over HTTP, as tritonserver 2.51 writes
them. At level TENSORS the request's tensors are written too (`trace_tensors.py`).

Files: Triton's JSON, one array of objects: per trace `{"id":..,"model_name":..,"model_version":..
[,"request_id":..]}` and one `{"id":..,"timestamps":[{"name":..,"ns":..}]}` per timestamp. With
`log_frequency` N, every N traces of a setting go to `<trace_file>.<index>`, a whole array each;
with 0, to `<trace_file>` itself, closed with ']' at shutdown. A setting holds at most N (or
`_FLUSH_EVERY`) traces in memory before writing them, and writes what it holds when it is replaced
or the server stops (`Tracing.close`).

Front-end workers that run models themselves sample by a copy of these settings (`snapshot`, and
`workers/trace_relay.py`) and send their finished traces here (`accept`): the core numbers them,
counts them against trace_count, and writes them with its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import IO, Any

from reference_server.core.request_trace import OFF, TENSORS, TIMESTAMPS, RequestTrace
from reference_server.errors import InternalError, InvalidArgument, ServerError, Unsupported

log = logging.getLogger(__name__)

__all__ = [
    "LEVELS",
    "OFF",
    "TENSORS",
    "TIMESTAMPS",
    "RequestTrace",
    "TraceSetting",
    "Tracing",
    "changes_from_json",
    "changes_from_proto",
    "startup_settings",
]

#: Level names by bit, in the order Triton lists them.
LEVELS = {"TIMESTAMPS": TIMESTAMPS, "TENSORS": TENSORS}
MIN_TRACE_COUNT = -1
_UINT32_MAX = 2**32 - 1
_INT32_MAX = 2**31 - 1
#: Traces a setting with log_frequency 0 holds before appending them to its file.
_FLUSH_EVERY = 64
_FIELDS = ("level", "rate", "count", "log_frequency")
_FILE_REFUSED = "trace file location can not be updated through network protocol"


class TraceSetting:
    """One setting in force (global or a model's), with its sampling state and unwritten traces."""

    __slots__ = ("level", "rate", "count", "log_frequency", "file", "specified", "_seen", "_taken", "_held", "_done")

    def __init__(
        self, level: int, rate: int, count: int, log_frequency: int, file: TraceFile, specified: frozenset[str]
    ) -> None:
        self.level = level
        self.rate = rate
        self.count = count
        self.log_frequency = log_frequency
        self.file = file
        self.specified = specified  # the fields a model's setting has of its own
        self._seen = 0
        self._taken = 0
        self._held: list[str] = []
        self._done = 0

    def valid(self) -> bool:
        return self.level != OFF and self.rate != 0 and bool(self.file.name) and self.count != 0

    def reason(self) -> str:
        """Why this setting can take no trace ('' when it can), in Triton's words."""
        if self.level == OFF:
            return "tracing is disabled"
        if self.rate == 0:
            return "sample rate must be non-zero"
        if not self.file.name:
            return "trace file name is not given"
        return ""

    def sample(self) -> bool:
        """Whether the request now seen is traced (Triton's `TraceSetting::SampleTrace`)."""
        if not self.valid():
            return False
        self._seen += 1
        if self._seen % self.rate:
            return False
        if self.count > 0:
            self.count -= 1
        self._taken += 1
        return True

    def sampling(self) -> tuple[int, int, int]:
        """What a front-end worker samples by: the level (OFF when nothing can be taken), rate, count."""
        return (self.level if self.valid() else OFF, self.rate, self.count)

    def finished(self, trace: RequestTrace) -> None:
        """A trace this setting took is done: write it."""
        self.write(trace.json())

    def taken(self) -> None:
        """A front-end worker took a trace by this setting (`Tracing.accept`): counted as seen and
        taken here, so that the last of `trace_count` traces still writes the file."""
        self._seen += 1
        self._taken += 1

    def as_dict(self) -> dict[str, Any]:
        levels = [name for name, bit in LEVELS.items() if self.level & bit] or ["OFF"]
        return {
            "trace_level": levels,
            "trace_rate": str(self.rate),
            "trace_count": str(self.count),
            "log_frequency": str(self.log_frequency),
            "trace_file": self.file.name,
            "trace_mode": "triton",
        }

    def write(self, trace: str) -> None:
        """Hold one finished trace's objects (JSON text without the brackets); write when due."""
        self._held.append(trace)
        self._done += 1
        if self.log_frequency:
            if len(self._held) >= self.log_frequency:
                self.file.write_indexed(self._take())
        elif self.count == 0 and self._done == self._seen:
            self.file.write_indexed(self._take())  # Triton's: the last of `trace_count` traces taken
        elif len(self._held) >= _FLUSH_EVERY:
            self.file.append(self._take())

    def flush(self) -> None:
        """Write what this setting holds: it is being replaced, or the server stops."""
        if self._held:
            held = self._take()
            if self.log_frequency:
                self.file.write_indexed(held)
            else:
                self.file.append(held)

    def _take(self) -> list[str]:
        held, self._held = self._held, []
        return held


class TraceFile:
    """One trace file's name, its open stream (log_frequency 0) and the next `.<index>` file."""

    __slots__ = ("name", "_stream", "_index", "_closed")

    def __init__(self, name: str) -> None:
        self.name = name
        self._stream: IO[str] | None = None
        self._index = 0
        self._closed = False  # a trace finishing after shutdown must not open the file again

    def append(self, traces: list[str]) -> None:
        if self._closed:
            return
        try:
            if self._stream is None:
                self._stream = open(self.name, "w", encoding="utf-8")  # closed by close()
                self._stream.write("[")
            else:
                self._stream.write(",")
            self._stream.write(",".join(traces))
            self._stream.flush()
        except OSError as exc:
            log.error("failed creating trace file: %s", exc)  # Triton's words; the request is answered all the same

    def write_indexed(self, traces: list[str]) -> None:
        if self._closed:
            return
        name = f"{self.name}.{self._index}"
        self._index += 1
        try:
            with open(name, "w", encoding="utf-8") as stream:
                stream.write("[" + ",".join(traces) + "]")
        except OSError as exc:
            log.error("failed creating trace file: %s", exc)

    def close(self) -> None:
        self._closed = True
        if self._stream is not None:
            self._stream.write("]")
            self._stream.close()
            self._stream = None


class Tracing:
    """The server's trace settings and the traces they take (the core process's, on its loop)."""

    def __init__(self, default: TraceSetting | None = None) -> None:
        if default is None:
            default = TraceSetting(OFF, 1000, -1, 0, TraceFile(""), frozenset())
        self._files = {default.file.name: default.file}
        self._default = default  # the start-up values a cleared global field returns to
        self._global = TraceSetting(
            default.level, default.rate, default.count, default.log_frequency, default.file, frozenset()
        )
        self._models: dict[str, TraceSetting] = {}
        self._next_id = 1
        #: Whether any setting may take a trace: the one check the data plane makes per request.
        self.active = self._global.valid()
        #: Called when a setting's trace_count runs out, so that the front-end workers stop taking
        #: traces (`workers/hosting.py`); an update's callers tell them themselves.
        self.used_up: Callable[[], None] | None = None
        #: The front end's read of the request it hands to the data plane now (when it began and
        #: ended reading its body, `perf_counter_ns`), set only around that synchronous hand-off
        #: while tracing is active; None otherwise (then the hand-off's time stands for both).
        self.received: tuple[int, int] | None = None

    def settings(self, model: str = "") -> dict[str, Any]:
        return self._models.get(model, self._global).as_dict() if model else self._global.as_dict()

    def update(self, model: str, changes: Mapping[str, Any]) -> None:
        """Apply checked `changes` ({field: value, or None to clear}) to `model`'s setting ('' for the
        global one), as Triton's `TraceManager::UpdateTraceSetting` does."""
        self._update(model, changes)
        if not model:  # the models' settings take their unspecified fields from the global one
            for name in [name for name, setting in self._models.items() if len(setting.specified) < len(_FIELDS)]:
                self._update(name, {})
        self.active = any(setting.valid() for setting in (self._global, *self._models.values()))

    def _update(self, model: str, changes: Mapping[str, Any]) -> None:
        current = self._models.get(model) if model else self._global
        fallback = self._global if model else self._default
        values = {field: getattr(fallback, field) for field in _FIELDS}
        specified = set(current.specified) if current is not None else set()
        for field, value in changes.items():
            if value is None:
                specified.discard(field)
            else:
                specified.add(field)
        for field in specified:
            values[field] = changes[field] if changes.get(field) is not None else getattr(current, field)
        if model and not specified:
            replaced = self._models.pop(model, None)
            if replaced is not None:
                replaced.flush()
            return
        setting = TraceSetting(
            values["level"], values["rate"], values["count"], values["log_frequency"], fallback.file,
            frozenset(specified),
        )  # fmt: skip
        if setting.level != OFF and not setting.valid():
            raise InvalidArgument(f"Attempting to set invalid trace setting :{setting.reason()}")
        if current is not None:
            current.flush()
        if model:
            self._models[model] = setting
        else:
            self._global = setting

    def sample(self, model: str, version: int, request_id: str) -> RequestTrace | None:
        """A trace for the request now seen for `model`, if its setting takes this one."""
        setting = self._models.get(model, self._global)
        if not setting.sample():
            if not setting.valid():
                self.active = any(s.valid() for s in (self._global, *self._models.values()))
            return None
        if setting.count == 0:
            self._used_up()
        trace_id, self._next_id = self._next_id, self._next_id + 1
        return RequestTrace(trace_id, setting, model, version, request_id)

    def snapshot(self) -> dict[str, tuple[int, int, int]]:
        """The settings in force as a front-end worker samples by them ({'' (global) or a model:
        `TraceSetting.sampling()`}), for `adopt` there."""
        return {"": self._global.sampling(), **{name: s.sampling() for name, s in self._models.items()}}

    def adopt(self, global_setting: TraceSetting, models: Mapping[str, TraceSetting]) -> None:
        """Sample by these settings from now on (a front-end worker's copy of the core's)."""
        self._global = global_setting
        self._models = dict(models)
        self.active = any(setting.valid() for setting in (global_setting, *models.values()))

    def accept(self, records: Iterable[tuple[str, int, str, list[tuple[str, int]], list[str]]]) -> None:
        """Traces that front-end workers took ((model, version, request_id, timestamps, tensor
        records) each): each
        counts against its model's trace_count when it arrives here, where it gets its id and is
        written as the core's own are. One that arrives after the count ran out (a worker had not
        heard yet) or after its level became OFF is dropped, so trace_count holds server-wide."""
        used_up = False
        for model, version, request_id, events, tensors in records:
            setting = self._models.get(model, self._global)
            if not setting.valid():
                continue
            if setting.count > 0:
                setting.count -= 1
                used_up = used_up or setting.count == 0
            setting.taken()
            trace_id, self._next_id = self._next_id, self._next_id + 1
            trace = RequestTrace(trace_id, setting, model, version, request_id)
            trace.events, trace.tensors = events, tensors
            setting.finished(trace)
        if used_up:
            self._used_up()

    def _used_up(self) -> None:
        self.active = any(s.valid() for s in (self._global, *self._models.values()))
        if self.used_up is not None:
            self.used_up()

    def close(self) -> None:
        """Write every trace held and close the files (the server stops)."""
        for setting in (self._global, *self._models.values()):
            setting.flush()
        for file in self._files.values():
            file.close()
        self.active = False


def startup_settings(entries: Iterable[str]) -> TraceSetting:
    """The global trace setting that `--trace-config` entries (`[<mode>,]<setting>=<value>`) give,
    on Triton's defaults (level OFF, rate 1000, count -1, log-frequency 0, no file)."""
    level, rate, count, log_frequency, file = OFF, 1000, -1, 0, ""
    for entry in entries:
        mode, comma, setting = entry.partition(",")
        if not comma:
            mode, setting = "", entry
        elif not mode:
            raise ServerError(
                "No trace mode specified. --trace-config option format is <trace mode>,<setting>=<value> or "
                f"<setting>=<value>. Got {entry}"
            )
        key, sep, value = setting.partition("=")
        if not sep or not key or not value:
            raise ServerError(f"--trace-config option format is '<trace mode>,<setting>=<value>'. Got {entry}")
        mode = mode.lower()
        if mode not in ("", "triton", "opentelemetry"):
            raise ServerError(
                f'invalid value for trace mode option: {mode}. Available options are "triton" and "opentelemetry"'
            )
        if mode == "opentelemetry" or (key == "mode" and value.lower() == "opentelemetry"):
            raise Unsupported(
                "--trace-config: the opentelemetry trace mode is not supported by this server; use triton"
            )
        where = f"--trace-config {mode + ',' if mode else ''}{key}"
        if mode == "" and key == "level":
            lowered = value.lower()
            if lowered in ("false", "off"):
                level = OFF
            elif lowered in ("true", "on", "min", "max", "timestamps"):
                level |= TIMESTAMPS
            elif lowered == "tensors":
                level |= TENSORS
            else:
                raise ServerError(f'Bad option: "{where}". invalid value for trace level option: {lowered}')
        elif mode == "" and key in ("rate", "count"):
            number = _integer(value, where)
            if key == "rate":
                rate = number & _UINT32_MAX
            elif number < MIN_TRACE_COUNT:
                raise ServerError(f'Bad option: "{where}". trace count must be -1 (no limit) or more, got {number}')
            else:
                count = number
        elif mode == "triton" and key == "file":
            file = value
        elif mode == "triton" and key == "log-frequency":
            log_frequency = _integer(value, where) & _UINT32_MAX
    return TraceSetting(level, rate, count, log_frequency, TraceFile(file), frozenset())


def _integer(text: str, where: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ServerError(f'Bad option: "{where}". expected an integer, got {text}') from None


def _stoi(name: str, text: str, low: int, high: int, shown_low: int, shown_high: int) -> int:
    """`text` read as C++'s std::stoi reads it (leading blanks, a sign, digits; what follows is
    ignored), in Triton's words when it is no number or out of the int32 range."""
    stripped = text.lstrip(" \t\n\r\f\v")
    digits = 1 if stripped[:1] in ("+", "-") else 0
    while digits < len(stripped) and stripped[digits].isdigit():
        digits += 1
    head = stripped[:digits]
    if not head or head in ("+", "-"):
        raise InvalidArgument(f"Unable to parse '{name}', got: {text}")
    value = int(head)
    if not low <= value <= high:
        raise InvalidArgument(
            f"Unable to parse '{name}', value is out of range [ {shown_low}, {shown_high} ], got: {text}"
        )
    return value


def _number(name: str, text: str, grpc: bool = False) -> int:
    if name == "trace_count":
        count = _stoi(name, text, -(2**31), _INT32_MAX, MIN_TRACE_COUNT, _INT32_MAX)
        if count < MIN_TRACE_COUNT:
            got = f"got: {text}" if grpc else f"got:{text}"  # Triton's two front ends differ by a space
            raise InvalidArgument(f"Unable to parse '{name}'. Expecting value >= {MIN_TRACE_COUNT}, {got}")
        return count
    # Triton keeps rate and log_frequency as uint32 from stoi's int: a negative number wraps.
    return _stoi(name, text, -(2**31), _INT32_MAX, 0, _UINT32_MAX) & _UINT32_MAX


_KEYS = {"trace_level": "level", "trace_rate": "rate", "trace_count": "count", "log_frequency": "log_frequency"}


def _level(names: Iterable[str]) -> int | None:
    names = list(names)
    level: int | None = None
    for name in names:
        if name == "OFF":
            if len(names) != 1:
                raise InvalidArgument("Expect only one trace level 'OFF' is specified")
            level = OFF
        elif name in LEVELS:
            level = (level or 0) | LEVELS[name]
    return level


def changes_from_json(body: Any) -> dict[str, Any]:
    """The changes a `POST .../trace/setting` body asks for, as Triton's HTTP front end reads them:
    a key it does not know and a body that is no object change nothing, null clears a field, a
    value of the wrong JSON type fails with its JSON parser's words (HTTP 500)."""
    if not isinstance(body, dict):
        return {}
    if "trace_file" in body:
        raise Unsupported(_FILE_REFUSED)
    changes: dict[str, Any] = {}
    for key, field in _KEYS.items():
        if key not in body:
            continue
        value = body[key]
        if value is None:
            changes[field] = None
        elif key == "trace_level":
            if not isinstance(value, list):
                raise InternalError("attempt to access JSON non-array as array")
            if not all(isinstance(name, str) for name in value):
                raise InternalError("attempt to access JSON non-string as string")
            level = _level(value)
            if level is not None:
                changes[field] = level
        else:
            if not isinstance(value, str):
                raise InternalError("attempt to access JSON non-string as string")
            changes[field] = _number(key, value)
    return changes


def changes_from_proto(settings: Mapping[str, list[str]]) -> dict[str, Any]:
    """The changes a gRPC `TraceSettingRequest` asks for ({name: its values}), in Triton's gRPC
    words: no value clears a field, more than one is refused but for the level."""
    if "trace_file" in settings:
        raise Unsupported(_FILE_REFUSED)
    changes: dict[str, Any] = {}
    for key, field in _KEYS.items():
        if key not in settings:
            continue
        values = settings[key]
        if not values:
            changes[field] = None
        elif key == "trace_level":
            level = _level(values)
            if level is not None:
                changes[field] = level
        elif len(values) != 1:
            raise InvalidArgument(f"expect only 1 value for '{key}'")
        else:
            changes[field] = _number(key, values[0], grpc=True)
    return changes
