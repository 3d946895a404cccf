"""Triton model configuration as text: config.pbtxt and the repository load API's JSON, to and from
tritonclient's `ModelConfig`, printed as Triton prints it.

Both ends use it: the server reads a repository's `config.pbtxt` and a load request's JSON, and
`perfkit tune` reads the config it varies and writes the best one back. Completing a config from
a model file, and checking it against the model, is the server's business, not this module's.

A malformed config raises `ConfigError` naming the file (and line and column where the parser
knows them), so the message alone says what to fix.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, TypeAlias

from google.protobuf import json_format, text_format
from google.protobuf.descriptor import FieldDescriptor
from tritonclient.grpc import model_config_pb2

from v2kit.grpc_proto import map_json_scalars, message_to_json

__all__ = [
    "CONFIG_FILENAME",
    "ConfigError",
    "ModelConfig",
    "config_from_json",
    "config_parameter",
    "config_to_json",
    "parse_config_text",
    "read_config",
]

ModelConfig: TypeAlias = model_config_pb2.ModelConfig

CONFIG_FILENAME = "config.pbtxt"

_PARSE_LOCATION = re.compile(r"^\d+(?::\d+)? : ")


class ConfigError(ValueError):
    """A model configuration that cannot be read or parsed; the message names its source."""

# --------------------------------------------------------------------------------------------
# Parsing and printing


def parse_config_text(text: str, path: Path) -> ModelConfig:
    """Parse config.pbtxt text; a syntax error names `path:line:column` and the parser's reason."""
    config = ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        # The parser prefixes its message with "line:col : "; we put the file in front instead.
        reason = _PARSE_LOCATION.sub("", str(exc))
        location = ":".join(str(n) for n in (exc.GetLine(), exc.GetColumn()) if n is not None)
        where = f"{path}:{location}" if location else str(path)
        raise ConfigError(f"{where}: {reason}") from None
    return config


def read_config(model_dir: Path, filename: str = CONFIG_FILENAME) -> ModelConfig | None:
    """Read `<model_dir>/config.pbtxt` (or `filename` there); None when there is none (Triton then
    auto-completes)."""
    path = model_dir / filename
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        reason = exc.strerror or exc
        raise ConfigError(f"{path}: cannot read the model configuration: {reason}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not valid UTF-8 (byte offset {exc.start})") from None
    return parse_config_text(text, path)


def config_from_json(text: str | bytes, source: str) -> ModelConfig:
    """Parse the JSON `ModelConfig` that Triton's repository load API takes as `config`.

    Like Triton, unknown fields are errors, 64-bit integers may be numbers or strings, and enum
    names are matched case-insensitively ("type_fp32" works). Errors name `source`.
    """
    try:
        document = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{source}: the model configuration is not valid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise ConfigError(f"{source}: the model configuration must be a JSON object")
    document = map_json_scalars(document, ModelConfig.DESCRIPTOR, _upper_case_enum)
    try:
        return json_format.ParseDict(document, ModelConfig())
    except json_format.ParseError as exc:
        # The first line is the reason; the rest lists every field name in camelCase.
        raise ConfigError(f"{source}: {str(exc).splitlines()[0]}") from None


def config_to_json(config: ModelConfig) -> dict[str, Any]:
    """The model configuration as Triton's `GET /v2/models/{m}/config` returns it (see
    `v2kit.grpc_proto.message_to_json`)."""
    return message_to_json(config)


def _upper_case_enum(field: FieldDescriptor, value: Any) -> Any:
    # Triton parses with protobuf's case_insensitive_enum_parsing; Python's json_format cannot.
    if field.enum_type is not None and isinstance(value, str) and value not in field.enum_type.values_by_name:
        if value.upper() in field.enum_type.values_by_name:
            return value.upper()
    return value


def config_parameter(config: ModelConfig, key: str) -> str | None:
    """The `string_value` of `parameters { key: KEY ... }`, or None when the key is absent."""
    if key in config.parameters:  # `in` does not insert, unlike indexing a protobuf map
        return str(config.parameters[key].string_value)
    return None
