"""The server's log: Triton's line format, its settings, and the logging extension's updates.

Every process of the server logs through Python's `logging`, whose records `TritonHandler` writes
as tritonserver writes its own (triton-inference-server/common, src/logging.cc):

    I1129 05:45:55.123456 1234 model.py:12] "message"          (log_format "default")
    2026-11-29T05:45:55Z I 1234 model.py:12] "message"          (log_format "ISO8601")

the severity letter (E, W, I; a verbose message is an I), UTC time, the writing process's id, the
file and line that logged it, and the message as a JSON string (Triton escapes messages so that
one record is one line). A python model's `pb_utils.Logger` records carry the model file's name
and line (`backends/python/process.py` sets them from what the stub sends).

`LogSettings` holds what the logging extension reports and changes at run time (`GET/POST
/v2/logging`, gRPC `LogSettings`): `log_info`, `log_warning` and `log_error` switch those
severities; `log_verbose_level` N lets through verbose records up to level N (`logging.DEBUG` is
level 1; a record's `verbose` attribute names a higher one); `log_format`; and `log_file`, which
only the command line sets (Triton refuses it over the network): empty, every line goes to standard
error. (Triton writes INFO lines to standard output; here standard output carries only the start-up
lines a parent process reads until "Server ready" or "Server not ready" (and, after the latter, one
"Server ready" once the server is), after which perfkit stops reading it, so a log line there could
fill the pipe and stall the server.) Both front ends parse their wire form into
one dict of checked changes (`changes_from_json`, `changes_from_proto`), each in Triton's words
for that protocol, which `LogSettings.apply` applies in the core process; the core then tells its
front-end workers, which apply the same settings to their own log (`workers/hosting.py`).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Mapping
from typing import IO, Any

from reference_server.errors import InternalError, InvalidArgument, ServerError, Unavailable, Unsupported

__all__ = [
    "LOG_FORMATS",
    "LogSettings",
    "TritonHandler",
    "changes_from_json",
    "changes_from_proto",
    "install",
    "installed",
]

LOG_FORMATS = ("default", "ISO8601")
_BOOLS = ("log_info", "log_warning", "log_error")
_FILE_REFUSED = "log file location can not be updated through network protocol"
_FORMATTER = logging.Formatter()  # for a record's traceback


class LogSettings:
    """What the server logs and where; changed at run time through the logging extension."""

    __slots__ = ("log_file", "log_info", "log_warning", "log_error", "log_verbose_level", "log_format")

    def __init__(
        self,
        log_file: str = "",
        log_info: bool = True,
        log_warning: bool = True,
        log_error: bool = True,
        log_verbose_level: int = 0,
        log_format: str = "default",
    ) -> None:
        if log_format not in LOG_FORMATS:
            raise ServerError(f"invalid argument for --log-format, got: {log_format}; give default or ISO8601")
        if log_verbose_level < 0:
            raise ServerError(f"--log-verbose must be 0 or more, got {log_verbose_level}")
        self.log_file = log_file
        self.log_info = log_info
        self.log_warning = log_warning
        self.log_error = log_error
        self.log_verbose_level = log_verbose_level
        self.log_format = log_format

    def as_dict(self) -> dict[str, Any]:
        """The extension's answer, keys in Triton's order."""
        return {name: getattr(self, name) for name in self.__slots__}

    def apply(self, changes: Mapping[str, Any]) -> None:
        """Set what `changes_from_json` or `changes_from_proto` checked."""
        for name, value in changes.items():
            if name not in self.__slots__ or name == "log_file":
                raise InvalidArgument(f"unknown log setting '{name}'")
            setattr(self, name, value)
        if _installed is self:
            _sync_root_level(self)

    def enabled(self, record: logging.LogRecord) -> bool:
        level = record.levelno
        if level >= logging.ERROR:
            return self.log_error
        if level >= logging.WARNING:
            return self.log_warning
        if level >= logging.INFO:
            return self.log_info
        return self.log_verbose_level >= getattr(record, "verbose", 1)


def changes_from_json(body: Any) -> dict[str, Any]:
    """The changes a `POST /v2/logging` body asks for, as Triton's HTTP front end reads them: a key
    it does not know, a null value and a body that is not an object change nothing; a value of the
    wrong JSON type fails with its JSON parser's words (HTTP 500), a log_format it does not know
    with UNAVAILABLE, and `log_file` with UNSUPPORTED."""
    if not isinstance(body, dict):
        return {}
    if body.get("log_file") is not None:
        raise Unsupported(_FILE_REFUSED)
    changes: dict[str, Any] = {}
    for name in _BOOLS:
        value = body.get(name)
        if value is not None:
            if not isinstance(value, bool):
                raise InternalError("attempt to access JSON non-boolean as boolean")
            changes[name] = value
    level = body.get("log_verbose_level")
    if level is not None:
        if isinstance(level, bool) or not isinstance(level, int) or level < 0:
            raise InternalError("attempt to access JSON non-unsigned-integer as unsigned-integer")
        changes["log_verbose_level"] = min(level, 2**31 - 1)
    log_format = body.get("log_format")
    if log_format is not None:
        if not isinstance(log_format, str):
            raise InternalError("attempt to access JSON non-string as string")
        if log_format not in LOG_FORMATS:
            raise Unavailable(f"invalid argument for --log_format, got: {log_format}")
        changes["log_format"] = log_format
    return changes


def changes_from_proto(settings: Mapping[str, tuple[str | None, Any]]) -> dict[str, Any]:
    """The changes a gRPC `LogSettingsRequest` asks for, given as {name: (the `parameter_choice` set,
    or None, its value)}, in Triton's gRPC words (INVALID_ARGUMENT for a wrong kind of value)."""
    if "log_file" in settings:
        raise Unsupported(_FILE_REFUSED)
    changes: dict[str, Any] = {}
    for name, wanted, kind in (
        *((name, "bool_param", "boolean") for name in _BOOLS),
        ("log_verbose_level", "uint32_param", "int32"),
        ("log_format", "string_param", "string"),
    ):
        if name not in settings:
            continue
        choice, value = settings[name]
        if choice != wanted:
            raise InvalidArgument(f"expect {kind} for '{name}'")
        if name == "log_format" and value not in LOG_FORMATS:
            raise InvalidArgument(f"invalid argument for log_format, got: {value}")
        changes[name] = value
    return changes


class TritonHandler(logging.Handler):
    """Writes the records `settings` lets through, in Triton's format, to `settings.log_file` (opened
    for appending, so the front-end workers can share it) or to standard error."""

    def __init__(self, settings: LogSettings) -> None:
        super().__init__(logging.DEBUG)
        self.settings = settings
        self._file: IO[str] | None = None
        self._file_name = ""
        self._pid = os.getpid()

    def emit(self, record: logging.LogRecord) -> None:
        settings = self.settings
        if not settings.enabled(record):
            return
        try:
            line = self.line(record)
            stream = self._stream()
            stream.write(line + "\n")
            stream.flush()
        except Exception:
            self.handleError(record)

    def line(self, record: logging.LogRecord) -> str:
        """One record as Triton writes it."""
        letter = "E" if record.levelno >= logging.ERROR else "W" if record.levelno >= logging.WARNING else "I"
        seconds = int(record.created)
        utc = time.gmtime(seconds)
        where = f"{self._pid} {getattr(record, 'triton_file', record.filename)}:{getattr(record, 'triton_line', record.lineno)}]"
        message = record.getMessage()
        if record.exc_info:
            message = f"{message}\n{_FORMATTER.formatException(record.exc_info)}"
        text = json.dumps(message, ensure_ascii=False)
        if self.settings.log_format == "ISO8601":
            return f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', utc)} {letter} {where} {text}"
        micros = int((record.created - seconds) * 1_000_000)
        return f"{letter}{time.strftime('%m%d %H:%M:%S', utc)}.{micros:06d} {where} {text}"

    def _stream(self) -> IO[str]:
        name = self.settings.log_file
        if not name:
            return sys.stderr
        if self._file is None or self._file_name != name:
            if self._file is not None:
                self._file.close()
            self._file = open(name, "a", encoding="utf-8")  # held open until close()
            self._file_name = name
        return self._file

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        super().close()


def install(settings: LogSettings) -> TritonHandler:
    """Make `settings` this process's log: the root logger's one handler, in Triton's format.

    Raises OSError when the log file cannot be opened, at start rather than at the first record."""
    handler = TritonHandler(settings)
    if settings.log_file:
        handler._stream()
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    global _installed
    _installed = settings
    _sync_root_level(settings)
    return handler


#: The settings `install` made this process's log: only theirs move the root logger's level.
_installed: LogSettings | None = None


def installed() -> LogSettings | None:
    """The settings `install` made this process's log (a front-end worker applies the core's
    changes to them), or None."""
    return _installed


def _sync_root_level(settings: LogSettings) -> None:
    # Debug records are only made while verbose logging is on: off, `log.debug` costs one level check.
    logging.getLogger().setLevel(logging.DEBUG if settings.log_verbose_level > 0 else logging.INFO)
