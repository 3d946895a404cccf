"""reference_server.errors: v2kit's errors become the server's in one place."""

from __future__ import annotations

from pathlib import Path

import pytest

from reference_server.errors import (
    InvalidArgument,
    ModelConfigError,
    NotFound,
    raising_server_errors,
    server_error,
)
from v2kit.codec import CodecError
from v2kit.model_config import ConfigError, parse_config_text


@pytest.mark.parametrize(
    ("exc", "kind", "status"),
    [
        (CodecError("bad shape"), InvalidArgument, 400),
        (ConfigError("config.pbtxt:1:2: bad"), ModelConfigError, 400),
        (NotFound("no model"), NotFound, 404),
    ],
)
def test_server_error_maps_v2kit_errors(exc: Exception, kind: type, status: int) -> None:
    error = server_error(exc)
    assert type(error) is kind and error.message == str(exc) and error.http_status == status


def test_server_error_leaves_bugs_alone() -> None:
    assert server_error(RuntimeError("boom")) is None


def test_raising_server_errors_wraps_a_v2kit_function() -> None:
    parse = raising_server_errors(parse_config_text)
    assert parse("max_batch_size: 2", Path("c.pbtxt")).max_batch_size == 2
    with pytest.raises(ModelConfigError, match=r"^c\.pbtxt:1:"):
        parse("max_batch_size: [", Path("c.pbtxt"))
    assert parse.__doc__ == parse_config_text.__doc__
