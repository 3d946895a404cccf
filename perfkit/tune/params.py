"""`perfkit tune --param PATH=VALUES`: any field of the model configuration as a search dimension.

PATH is a dotted path into Triton's `ModelConfig` protobuf (`dynamic_batching.max_queue_delay_microseconds`),
with `[i]` after a repeated message field (`instance_group[0].count`) and `[KEY]` after a map field
(`parameters[intra_op_thread_count].string_value`, `metric_tags[team]`). VALUES is one of:

- a comma list: `0,100,500`, `true,false`, `KIND_CPU,KIND_GPU`, `a,b` for strings;
- an inclusive integer range `A:B` or `A:B:STEP` (`1:4` is 1,2,3,4);
- for a repeated scalar field, bracketed lists, one per alternative: `[4,8]` or `[4],[4,8],[]`.

Everything is checked against the protobuf descriptor before anything is measured (`parse_param`):
the field exists (else the closest names are suggested), it is a scalar, a repeated scalar or a map
entry's scalar (bytes are refused), each map key fits the map's key type, and each value fits its type
(integer bounds, bool, enum names, float). `check_against_config` then checks each `[i]` against the
model's own config: an index past the end of the list is refused, since there is no element whose
other fields a new one could take (a map entry that is absent is created instead); so is a member
of a oneof (sequence_batching) whose sibling (dynamic_batching) the config or another --param
sets. `apply_settings` writes a variant's values into a copy of the config JSON (Triton's shape:
snake_case names, 64-bit integers as numbers), creating absent parent messages such as
`dynamic_batching`, and absent map entries.
"""

from __future__ import annotations

import copy
import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor

from perfkit.errors import PerfkitError
from v2kit.model_config import ModelConfig

__all__ = ["Param", "Setting", "apply_settings", "check_against_config", "label", "parse_param"]

#: One field's value in a variant: (path, value); a repeated scalar's value is a tuple.
Setting = tuple[str, Any]
#: One step of a path: the field's name and its list index (int), map key (str) or None.
Step = tuple[str, int | str | None]

_SEGMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(?:\[([^\[\]]*)\])?$")
_DOT = re.compile(r"\.(?![^\[]*\])")  # a dot outside brackets: map keys may hold dots
_RANGE = re.compile(r"^(-?\d+):(-?\d+)(?::(\d+))?$")
_LIST = re.compile(r"\[([^\[\]]*)\]")
_MAX_VALUES = 1000  # a range this long is a typo, not a search

_INT_BOUNDS = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1), FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1), FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1), FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1), FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1), FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}  # fmt: skip
_FLOATS = (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE)


@dataclass(frozen=True, slots=True)
class Param:
    """One `--param`: the path, its parsed steps (name, index or None), and the values to try."""

    path: str
    steps: tuple[Step, ...]
    values: tuple[Any, ...]
    type_name: str


def label(path: str, value: Any) -> str:
    """`path=value` as variant keys show it (a repeated value as `[4,8]`, a bool as true/false)."""
    return f"{path}={_text(value)}"


def _text(value: Any) -> str:
    if isinstance(value, tuple):
        return "[" + ",".join(map(_text, value)) + "]"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _either(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def _type_name(field: FieldDescriptor) -> str:
    if _is_map(field):
        key, value = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
        return f"map<{_type_name(key)}, {_type_name(value).removeprefix('message ')}>"
    if field.type == FieldDescriptor.TYPE_ENUM:
        base = f"enum {field.enum_type.name} ({', '.join(v.name for v in field.enum_type.values)})"
    elif field.type == FieldDescriptor.TYPE_MESSAGE:
        base = f"message {field.message_type.name}"
    else:
        base = {FieldDescriptor.TYPE_BOOL: "bool", FieldDescriptor.TYPE_STRING: "string",
                FieldDescriptor.TYPE_BYTES: "bytes", FieldDescriptor.TYPE_FLOAT: "float",
                FieldDescriptor.TYPE_DOUBLE: "double"}.get(field.type) or _int_name(field)  # fmt: skip
    return f"repeated {base}" if _repeated(field) else base


def _int_name(field: FieldDescriptor) -> str:
    low, _ = _INT_BOUNDS[field.type]
    return ("int" if low < 0 else "uint") + ("64" if field.cpp_type in (2, 4) else "32")


def _repeated(field: FieldDescriptor) -> bool:
    # protobuf >= 5.28 has is_repeated and warns on label; older releases only have label.
    flag = getattr(field, "is_repeated", None)
    return bool(flag) if flag is not None else field.label == FieldDescriptor.LABEL_REPEATED


def _is_map(field: FieldDescriptor) -> bool:
    return field.type == FieldDescriptor.TYPE_MESSAGE and bool(field.message_type.GetOptions().map_entry)


def _resolve(path: str) -> tuple[tuple[Step, ...], FieldDescriptor]:
    """The path's steps and its leaf field, or a PerfkitError naming the fix."""
    where = f"--param {path}"
    message: Descriptor = ModelConfig.DESCRIPTOR
    steps: list[Step] = []
    parts = _DOT.split(path)
    for n, part in enumerate(parts):
        match = _SEGMENT.match(part)
        if match is None:
            raise PerfkitError(
                f"{where}: '{part}' is not a field name (FIELD, FIELD[INDEX] or FIELD[KEY], e.g. instance_group[0])"
            )
        name, selector = match.group(1), match.group(2)
        field = message.fields_by_name.get(name)
        if field is None:
            names = list(message.fields_by_name)
            # A shortened name (max_queue_delay) is nearer its full form than difflib alone judges.
            close = [f for f in names if f.startswith(name)][:3] or difflib.get_close_matches(name, names, 3, 0.5)
            hint = (
                f"did you mean {_either(close)}?" if close else f"fields: {', '.join(sorted(message.fields_by_name))}"
            )
            raise PerfkitError(f"{where}: {message.full_name} has no field '{name}'; {hint}")
        last = n == len(parts) - 1
        if _is_map(field):
            key_field, field = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
            steps.append((name, _map_key(key_field, selector, name, path, field)))
        else:
            steps.append((name, _list_index(field, selector, name, path)))
        is_message = field.type == FieldDescriptor.TYPE_MESSAGE
        if is_message and last:
            sub = sorted(field.message_type.fields_by_name)
            shown = path + ("[0]" if _repeated(field) and selector is None else "")
            raise PerfkitError(
                f"{where}: '{part}' has type {_type_name(field)}; name one of its fields, e.g. {shown}"
                f".{sub[0]} (fields: {', '.join(sub)})"
            )
        if not is_message and not last:
            raise PerfkitError(f"{where}: '{part}' has type {_type_name(field)} and has no fields; end the path there")
        if field.type == FieldDescriptor.TYPE_BYTES:
            raise PerfkitError(f"{where}: '{name}' has type bytes; --param sets numbers, bools, enums and strings")
        if is_message:
            message = field.message_type
    return tuple(steps), field


def _list_index(field: FieldDescriptor, selector: str | None, name: str, path: str) -> int | None:
    where = f"--param {path}"
    is_message = field.type == FieldDescriptor.TYPE_MESSAGE
    if is_message and _repeated(field) and selector is None:
        raise PerfkitError(f"{where}: '{name}' has type {_type_name(field)}; pick an element: {name}[0]")
    if selector is None:
        return None
    if not (is_message and _repeated(field)):
        raise PerfkitError(
            f"{where}: '{name}' has type {_type_name(field)}, not a repeated message: drop [{selector}]"
            + ("; give the whole list as VALUES, e.g. [4,8]" if _repeated(field) else "")
        )
    if not selector.isdigit():
        raise PerfkitError(f"{where}: '{name}' is a list; its index [{selector}] must be a number such as [0]")
    return int(selector)


def _map_key(key_field: FieldDescriptor, selector: str | None, name: str, path: str, value: FieldDescriptor) -> str:
    """The map entry's key as the config's JSON spells it (a string, whatever the key's type)."""
    shown = f"{name}[KEY]" + (".string_value" if value.type == FieldDescriptor.TYPE_MESSAGE else "")
    if not selector:
        raise PerfkitError(f"--param {path}: '{name}' is a map ({_type_name(key_field)} keys); pick an entry: {shown}")
    if key_field.type != FieldDescriptor.TYPE_STRING:
        return str(_scalar(key_field, selector, path))
    return selector


def _scalar(field: FieldDescriptor, token: str, path: str) -> Any:
    token = token.strip()
    fix = f"--param {path}: '{token}' does not fit the field's type {_type_name(field).removeprefix('repeated ')}"
    if field.type == FieldDescriptor.TYPE_BOOL:
        if token.lower() not in ("true", "false"):
            raise PerfkitError(f"{fix}; give true or false")
        return token.lower() == "true"
    if field.type == FieldDescriptor.TYPE_ENUM:
        names = [v.name for v in field.enum_type.values]
        if token.upper() in names:  # Triton parses enums case-insensitively
            return token.upper()
        close = difflib.get_close_matches(token.upper(), names, n=2, cutoff=0.5)
        raise PerfkitError(f"{fix}; did you mean {_either(close)}?" if close else fix)
    if field.type == FieldDescriptor.TYPE_STRING:
        if not token:
            raise PerfkitError(f"--param {path}: an empty value; give a non-empty string")
        return token
    if field.type in _FLOATS:
        try:
            return float(token)
        except ValueError:
            raise PerfkitError(f"{fix}; give a number such as 0.5") from None
    low, high = _INT_BOUNDS[field.type]
    try:
        number = int(token)
    except ValueError:
        raise PerfkitError(f"{fix}; give an integer in {low}..{high}") from None
    if not low <= number <= high:
        raise PerfkitError(f"{fix}: out of range; give an integer in {low}..{high}")
    return number


def _range(match: re.Match[str], field: FieldDescriptor, path: str) -> tuple[Any, ...]:
    start, end, step = int(match.group(1)), int(match.group(2)), int(match.group(3) or 1)
    if field.type not in _INT_BOUNDS:
        raise PerfkitError(f"--param {path}: a range A:B needs an integer field; '{path}' has type {_type_name(field)}")
    if step < 1 or start > end:
        raise PerfkitError(f"--param {path}: range {match.group(0)} needs A <= B and STEP >= 1, e.g. 1:4 or 0:1000:100")
    if (end - start) // step + 1 > _MAX_VALUES:
        raise PerfkitError(f"--param {path}: range {match.group(0)} has over {_MAX_VALUES} values; widen STEP")
    return tuple(_scalar(field, str(v), path) for v in range(start, end + 1, step))


def _lists(text: str, field: FieldDescriptor, path: str) -> tuple[Any, ...]:
    # The lists, separated by commas, must be all there is: '[4,8],[8]' but not '[4,8]x' or '4,8'.
    if not text.startswith("[") or _LIST.sub("", text).replace(",", "").strip():
        raise PerfkitError(
            f"--param {path}: '{path}' has type {_type_name(field)}; give each alternative as a bracketed list, "
            f"e.g. {path}=[4,8] or {path}=[4],[4,8]"
        )
    return tuple(tuple(_scalar(field, t, path) for t in inner.split(",") if t.strip()) for inner in _LIST.findall(text))


def parse_param(text: str) -> Param:
    """`PATH=VALUES` checked against the ModelConfig schema (see the module header)."""
    path, sep, values_text = text.partition("=")
    path, values_text = path.strip(), values_text.strip()
    if not sep or not path or not values_text:
        raise PerfkitError(
            f"--param takes PATH=VALUES, e.g. 'dynamic_batching.max_queue_delay_microseconds=0,100,500'; got '{text}'"
        )
    steps, field = _resolve(path)
    if _repeated(field):
        values = _lists(values_text, field, path)
    elif (match := _RANGE.match(values_text)) is not None:
        values = _range(match, field, path)
    else:
        values = tuple(_scalar(field, token, path) for token in values_text.split(","))
    unique = tuple(dict.fromkeys(values))
    return Param(path, steps, unique, _type_name(field))


def check_against_config(params: Sequence[Param], config: dict[str, Any], source: str) -> None:
    """Each `[i]` of each path names an element `config` has (its JSON, Triton's shape), and no path
    sets a member of a oneof whose other member the config or another --param sets (setting
    sequence_batching on a config with dynamic_batching would make a config Triton refuses)."""
    chosen: dict[tuple[str, str], tuple[str, str]] = {}  # (parent path, oneof) -> (member, --param)
    for param in params:
        node: Any = config
        walked: list[str] = []
        message: Descriptor = ModelConfig.DESCRIPTOR
        for n, (name, index) in enumerate(param.steps):
            field = message.fields_by_name[name]
            oneof = field.containing_oneof
            if oneof is not None:
                where = (".".join(walked), oneof.name)
                other = next((f.name for f in oneof.fields if f.name != name and isinstance(node, dict) and
                              node.get(f.name) not in (None, {}, [], "", 0, False)), None)  # fmt: skip
                if other is not None:
                    raise PerfkitError(
                        f"--param {param.path}: {source} sets {other}, and '{name}' is in the same oneof "
                        f"{oneof.name}: a config has only one of them; remove {other} from the config first"
                    )
                member, by = chosen.setdefault(where, (name, param.path))
                if member != name:
                    raise PerfkitError(
                        f"--param {param.path} and --param {by} set {name} and {member}, which are in the same "
                        f"oneof {oneof.name}: a config has only one of them; search them in separate tunes"
                    )
            if _is_map(field):
                field = field.message_type.fields_by_name["value"]
            if field.type == FieldDescriptor.TYPE_MESSAGE:
                message = field.message_type
            if n == len(param.steps) - 1:
                break
            walked.append(name)
            node = node.get(name) if isinstance(node, dict) else None
            if isinstance(index, str):  # a map entry: an absent one is created, with nothing to check
                node = node.get(index) if isinstance(node, dict) else None
                walked[-1] += f"[{index}]"
                continue
            if index is None:
                continue
            items = node if isinstance(node, list) else []
            if index >= len(items):
                raise PerfkitError(
                    f"--param {param.path}: {source} has {len(items)} {'.'.join(walked)} entr"
                    f"{'y' if len(items) == 1 else 'ies'}, so [{index}] is out of range; add the entry to the "
                    f"config first, or use an index below {len(items)}"
                )
            node = items[index]
            walked[-1] += f"[{index}]"


def apply_settings(config: dict[str, Any], settings: Sequence[Setting]) -> dict[str, Any]:
    """A copy of `config` with each (path, value) set; the paths are those `parse_param` accepted."""
    out = copy.deepcopy(config)
    for path, value in settings:
        node = out
        steps, _ = _resolve(path)
        for name, index in steps[:-1]:
            if isinstance(index, int):
                items = node.get(name) or []
                if index >= len(items):  # check_against_config refuses this before a tune starts
                    raise PerfkitError(f"--param {path}: [{index}] is past the end of the config's {name}")
                node = items[index]
                continue
            node = _child(node, name)  # an absent parent message (dynamic_batching) is created
            if index is not None:
                node = _child(node, index)  # and so is an absent map entry
        name, key = steps[-1]
        if key is not None:
            node, name = _child(node, name), str(key)
        node[name] = list(value) if isinstance(value, tuple) else value
    return out


def _child(node: dict[str, Any], name: str) -> dict[str, Any]:
    child = node.get(name)
    if not isinstance(child, dict):
        child = node[name] = {}
    return child
