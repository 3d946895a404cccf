"""The server's log (`core/log_settings.py`): Triton's line formats, the severity and verbose
switches, and the logging extension's updates in each front end's words."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import pytest

from reference_server.core import log_settings
from reference_server.core.log_settings import LogSettings, TritonHandler
from reference_server.errors import InternalError, InvalidArgument, ServerError, Unavailable, Unsupported


def record(level: int, message: str, **extra: Any) -> logging.LogRecord:
    made = logging.LogRecord("reference_server.x", level, "/src/dataplane.py", 42, message, (), None)
    made.__dict__.update(extra)
    return made


def test_default_format() -> None:
    handler = TritonHandler(LogSettings())
    line = handler.line(record(logging.WARNING, 'say "hi"\nthere', triton_file="model.py", triton_line=12))
    assert re.fullmatch(r'W\d{4} \d\d:\d\d:\d\d\.\d{6} \d+ model\.py:12\] "say \\"hi\\"\\nthere"', line), line


def test_iso8601_format() -> None:
    handler = TritonHandler(LogSettings(log_format="ISO8601"))
    line = handler.line(record(logging.DEBUG, "v"))
    assert re.fullmatch(r'\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ I \d+ dataplane\.py:42\] "v"', line), line


def test_switches_and_verbose_levels() -> None:
    settings = LogSettings(log_info=False, log_verbose_level=1)
    assert not settings.enabled(record(logging.INFO, "i"))
    assert settings.enabled(record(logging.WARNING, "w"))
    assert settings.enabled(record(logging.DEBUG, "v1"))
    assert not settings.enabled(record(logging.DEBUG, "v2", verbose=2))
    settings.apply({"log_error": False, "log_verbose_level": 0})
    assert not settings.enabled(record(logging.ERROR, "e"))
    assert not settings.enabled(record(logging.DEBUG, "v1"))


def test_the_log_file_gets_the_lines(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    settings = LogSettings(log_file=str(path))
    handler = TritonHandler(settings)
    try:
        handler.emit(record(logging.INFO, "kept"))
        settings.apply({"log_info": False})
        handler.emit(record(logging.INFO, "dropped"))
    finally:
        handler.close()
    assert path.read_text().count("\n") == 1 and '"kept"' in path.read_text()


def test_the_installed_settings_move_the_root_level() -> None:
    root = logging.getLogger()
    handlers, before = list(root.handlers), root.level
    settings = LogSettings()
    try:
        LogSettings().apply({"log_verbose_level": 2})  # not installed: the process's logging is left alone
        assert root.level == before
        handler = log_settings.install(settings)
        assert root.handlers == [handler]
        settings.apply({"log_verbose_level": 2})
        assert root.level == logging.DEBUG
        settings.apply({"log_verbose_level": 0})
        assert root.level == logging.INFO
    finally:
        for added in list(root.handlers):
            root.removeHandler(added)
        for kept in handlers:
            root.addHandler(kept)
        root.setLevel(before)
        log_settings._installed = None


@pytest.mark.parametrize(
    ("body", "error", "message"),
    [
        ({"log_file": "x"}, Unsupported, "log file location can not be updated through network protocol"),
        ({"log_info": "false"}, InternalError, "attempt to access JSON non-boolean as boolean"),
        ({"log_verbose_level": -1}, InternalError, "attempt to access JSON non-unsigned-integer as unsigned-integer"),
        ({"log_verbose_level": True}, InternalError, "attempt to access JSON non-unsigned-integer as unsigned-integer"),
        ({"log_format": 1}, InternalError, "attempt to access JSON non-string as string"),
        ({"log_format": "xml"}, Unavailable, "invalid argument for --log_format, got: xml"),
    ],
)
def test_http_updates_refused_in_tritons_words(body: dict[str, Any], error: type[ServerError], message: str) -> None:
    with pytest.raises(error) as caught:
        log_settings.changes_from_json(body)
    assert caught.value.message == message


def test_http_updates_skip_nulls_and_unknown_keys() -> None:
    body = {"log_info": None, "bogus": 1, "log_file": None, "log_warning": False, "log_verbose_level": 3}
    assert log_settings.changes_from_json(body) == {"log_warning": False, "log_verbose_level": 3}
    assert log_settings.changes_from_json([1]) == {}


@pytest.mark.parametrize(
    ("settings", "error", "message"),
    [
        ({"log_file": ("string_param", "")}, Unsupported, "log file location can not be updated"),
        ({"log_info": (None, None)}, InvalidArgument, "expect boolean for 'log_info'"),
        ({"log_verbose_level": ("bool_param", True)}, InvalidArgument, "expect int32 for 'log_verbose_level'"),
        ({"log_format": ("bool_param", True)}, InvalidArgument, "expect string for 'log_format'"),
        ({"log_format": ("string_param", "xml")}, InvalidArgument, "invalid argument for log_format, got: xml"),
    ],
)
def test_grpc_updates_refused_in_tritons_words(
    settings: dict[str, tuple[str | None, Any]], error: type[ServerError], message: str
) -> None:
    with pytest.raises(error) as caught:
        log_settings.changes_from_proto(settings)
    assert caught.value.message.startswith(message)


def test_grpc_updates() -> None:
    settings = {"log_format": ("string_param", "ISO8601"), "bogus": ("bool_param", True)}
    assert log_settings.changes_from_proto(settings) == {"log_format": "ISO8601"}
