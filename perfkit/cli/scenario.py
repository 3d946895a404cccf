"""Scenario files: a measurement and its gates, written down once in TOML and run with `perfkit run`.

A scenario names the server (a running one by URL, or the bundled reference server to start on a
model repository), the settings of a `perfkit sweep` or `perfkit tune`, and the gates the result
must pass (a baseline to compare with, an SLO). The schema is documented in `scenarios/README.md`:

    name = "smoke"                       # optional; default: the file's name
    description = "..."                  # optional
    command = "sweep"                    # or "tune"

    [server]                             # optional; default: the bundled server on the demo models
    url = "HOST:PORT"                    # target a running server, or
    start = "reference"                  # start the bundled reference server
    model_repository = "demo"            # "demo" or a folder, relative to this file
    args = ["--backend-config", "..."]   # extra flags for the started server

    [sweep]                              # (or [tune]) the command's flags, long names, - or _
    concurrency_range = "1:4"
    measurement_interval = 500

    [gates]                              # optional
    baseline = "../reports/baselines/x.json"   # relative to this file
    max_throughput_drop = "5%"
    max_latency_increase = "10%"
    metrics = ["throughput", "p99"]
    alpha = 0.05
    junit = "reports/perf-gate.xml"      # relative to the working directory, like every output
    slo_p99_ms = 20.0                    # drawn in the report; with min_throughput_at_slo, a gate
    min_throughput_at_slo = 400.0
    allow_unstable = false               # a level that never stabilised fails the run unless true
    min_goodput_per_s = 50.0             # with the sweep's goodput = "...": some level must reach it

The command's settings become command-line flags for that command's own parser (STYLE practice
12): every check and error message of `perfkit sweep` applies unchanged, and flags given to
`perfkit run` after the scenario come later on the command line, so they win. Precedence is
therefore defaults < file < command line. When the command line sets one member of a group of
mutually exclusive flags (`--concurrency-range` / `--request-rate-range` / `--request-intervals`),
the file's members of that group are dropped rather than reported as a conflict.
"""

from __future__ import annotations

import argparse
import difflib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfkit.analysis.compare import GATE_METRICS, Thresholds, gated, parse_percent
from perfkit.errors import PerfkitError

__all__ = [
    "COMMANDS",
    "GateSpec",
    "Scenario",
    "ServerSection",
    "command_argv",
    "expand_demo",
    "load_scenario",
    "merge_argv",
    "parse_scenario",
    "touched_dests",
]

COMMANDS = ("sweep", "tune")
#: Settings that name input files: resolved against the scenario's folder.
_INPUT_PATHS = {"request_intervals", "input_data", "config", "input_file"}
_INPUT_DATA_WORDS = {"random", "zero"}
#: Stands for the demo model repository's folder in a setting, e.g. "{demo}/mlp/config.pbtxt".
DEMO_PLACEHOLDER = "{demo}"
#: Settings that belong to [server], not to the command's table.
_SERVER_KEYS = {"url"}


@dataclass(frozen=True, slots=True)
class ServerSection:
    url: str | None = None
    start: str | None = None  # "reference" or None
    model_repository: str = "demo"  # "demo" or a resolved path
    args: tuple[str, ...] = ()

    @property
    def needs_start(self) -> bool:
        """`perfkit run` starts the server itself: a model repository or flags the sweep's own
        embedded default (the demo models, no flags) does not cover."""
        return self.url is None and (self.model_repository != "demo" or bool(self.args))


@dataclass(frozen=True, slots=True)
class GateSpec:
    baseline: Path | None = None
    thresholds: Thresholds = field(default_factory=Thresholds)
    junit: Path | None = None
    slo_p99_ms: float | None = None
    min_throughput_at_slo: float | None = None
    allow_unstable: bool = False
    min_goodput_per_s: float | None = None


@dataclass(frozen=True, slots=True)
class Scenario:
    path: Path
    name: str
    description: str
    command: str
    server: ServerSection
    settings: dict[str, Any]
    gates: GateSpec


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError:
            raise PerfkitError("reading scenario files needs Python 3.11, or `pip install tomli`") from None
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PerfkitError(f"cannot read scenario {path}: {exc.strerror or exc}") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PerfkitError(f"{path}: not valid TOML: {exc}") from None


def _take(table: dict[str, Any], key: str, kinds: type | tuple[type, ...], where: str, default: Any = None) -> Any:
    value = table.pop(key, default)
    if value is default:
        return value
    if isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,)):
        raise PerfkitError(f"{where}: {key} must not be true/false")
    if not isinstance(value, kinds):
        names = " or ".join(k.__name__ for k in (kinds if isinstance(kinds, tuple) else (kinds,)))
        raise PerfkitError(f"{where}: {key} must be a {names}, not {value!r}")
    return value


def _did_you_mean(key: str, known: Sequence[str]) -> str:
    """ " (did you mean 'x'?)" for a misspelt key, else ""."""
    by_spelling = {k.replace("-", "_").lower(): k for k in known}
    close = difflib.get_close_matches(key.replace("-", "_").lower(), list(by_spelling), n=1, cutoff=0.6)
    return f" (did you mean '{by_spelling[close[0]]}'?)" if close else ""


def _no_leftovers(table: dict[str, Any], where: str, allowed: Sequence[str]) -> None:
    if table:
        first = sorted(table)[0]
        raise PerfkitError(f"{where}: unknown key(s) {', '.join(sorted(table))}{_did_you_mean(first, allowed)}; "
                           f"expected {', '.join(allowed)}")  # fmt: skip


def _server(table: dict[str, Any], base: Path, where: str) -> ServerSection:
    table = dict(table)
    url = _take(table, "url", str, where)
    start = _take(table, "start", str, where)
    repository = _take(table, "model_repository", str, where, "demo")
    args = _take(table, "args", list, where, [])
    _no_leftovers(table, where, ("url", "start", "model_repository", "args"))
    if url and start:
        raise PerfkitError(f"{where}: give url (a running server) or start (one to start), not both")
    if start not in (None, "reference"):
        raise PerfkitError(f'{where}: start = {start!r}; perfkit can start "reference" (the bundled server)')
    if url and (repository != "demo" or args):
        raise PerfkitError(f"{where}: model_repository and args apply to a started server; drop them or url")
    if repository != "demo":
        repository = str((base / repository).resolve())
    return ServerSection(url, start, repository, tuple(str(a) for a in args))


def _gates(table: dict[str, Any], base: Path, where: str) -> GateSpec:
    table = dict(table)
    baseline = _take(table, "baseline", str, where)
    drop = _take(table, "max_throughput_drop", (str, int, float), where, "5%")
    increase = _take(table, "max_latency_increase", (str, int, float), where, "10%")
    metrics = _take(table, "metrics", list, where, ["throughput", "p99"])
    alpha = _take(table, "alpha", (int, float), where, 0.05)
    junit = _take(table, "junit", str, where)
    slo = _take(table, "slo_p99_ms", (int, float), where)
    min_tp = _take(table, "min_throughput_at_slo", (int, float), where)
    allow_unstable = _take(table, "allow_unstable", bool, where, False)
    min_goodput = _take(table, "min_goodput_per_s", (int, float), where)
    _no_leftovers(table, where, ("baseline", "max_throughput_drop", "max_latency_increase", "metrics", "alpha",
                                 "junit", "slo_p99_ms", "min_throughput_at_slo", "allow_unstable",
                                 "min_goodput_per_s"))  # fmt: skip
    thresholds = Thresholds(
        parse_percent(drop, f"{where}: max_throughput_drop"),
        parse_percent(increase, f"{where}: max_latency_increase"),
        tuple(str(m) for m in metrics),
        float(alpha),
    )
    unknown = [m for m in thresholds.metrics if gated(m) is None]
    if unknown:
        raise PerfkitError(f"{where}: metrics {unknown}: choose from {', '.join(GATE_METRICS)}")
    if min_tp is not None and slo is None:
        raise PerfkitError(f"{where}: min_throughput_at_slo needs slo_p99_ms")
    for name, value in (("slo_p99_ms", slo), ("min_throughput_at_slo", min_tp), ("min_goodput_per_s", min_goodput)):
        if value is not None and (not math.isfinite(value) or value <= 0):
            raise PerfkitError(f"{where}: {name} must be a positive number")
    return GateSpec(
        baseline=None if baseline is None else (base / baseline).resolve(),
        thresholds=thresholds,
        junit=None if junit is None else Path(junit),
        slo_p99_ms=None if slo is None else float(slo),
        min_throughput_at_slo=None if min_tp is None else float(min_tp),
        allow_unstable=allow_unstable,
        min_goodput_per_s=None if min_goodput is None else float(min_goodput),
    )


def parse_scenario(data: dict[str, Any], path: Path) -> Scenario:
    """A scenario from its parsed TOML; `path` names it in errors and anchors relative inputs."""
    data = dict(data)
    where = str(path)
    base = path.resolve().parent
    name = _take(data, "name", str, where, path.stem)
    description = _take(data, "description", str, where, "")
    command = _take(data, "command", str, where, "sweep")
    if command not in COMMANDS:
        raise PerfkitError(f"{where}: command = {command!r}; choose {' or '.join(COMMANDS)}")
    server = _server(_take(data, "server", dict, f"{where} [server]", {}), base, f"{where} [server]")
    settings = dict(_take(data, command, dict, f"{where} [{command}]", {}))
    gates = _gates(_take(data, "gates", dict, f"{where} [gates]", {}), base, f"{where} [gates]")
    other = [key for key in COMMANDS if key != command and key in data]
    if other:
        raise PerfkitError(f"{where}: command = {command!r} but the file has a [{other[0]}] table; keep one")
    _no_leftovers(data, where, ("name", "description", "command", "server", command, "gates"))
    settings = {key.replace("-", "_"): value for key, value in settings.items()}
    misplaced = sorted(_SERVER_KEYS & settings.keys())
    if misplaced:
        raise PerfkitError(f"{where} [{command}]: {', '.join(misplaced)} belongs under [server]")
    for key in _INPUT_PATHS & settings.keys():
        value = settings[key]
        if isinstance(value, str) and value not in _INPUT_DATA_WORDS and not value.startswith(DEMO_PLACEHOLDER):
            settings[key] = str((base / value).resolve())
    return Scenario(path, name, description, command, server, settings, gates)


def load_scenario(path: Path) -> Scenario:
    return parse_scenario(_read_toml(path), path)


# --------------------------------------------------------------------------------------------------
# Settings → the command's own flags


def _long_option(action: argparse.Action) -> str:
    longs = [s for s in action.option_strings if s.startswith("--")]
    return max(longs, key=len) if longs else action.option_strings[0]


def _arguments(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The parser's arguments by dest (what a scenario key names), positionals included."""
    return {a.dest: a for a in parser._actions if a.dest not in ("help", argparse.SUPPRESS)}


def command_argv(parser: argparse.ArgumentParser, settings: dict[str, Any], where: str) -> list[str]:
    """The command-line arguments that say what `settings` say, for `parser` (the command's
    parser): positionals first, in the parser's order, then one flag per setting."""
    arguments = _arguments(parser)
    positionals: list[str] = []
    argv: list[str] = []
    for key, value in settings.items():
        action = arguments.get(key)
        if action is None:
            known = ", ".join(sorted(arguments))
            hint = _did_you_mean(key, sorted(arguments))
            raise PerfkitError(f"{where}: '{key}' is not an argument of this command{hint}; known: {known}")
        if action.nargs == 0:  # store_true and the like
            if not isinstance(value, bool):
                raise PerfkitError(f"{where}: {key} is a switch: write {key} = true or false")
            if value != bool(action.default):
                argv.append(_long_option(action))
            continue
        values = value if isinstance(value, list) else [value]
        if isinstance(value, list) and not isinstance(action, argparse._AppendAction) and action.nargs is None:
            raise PerfkitError(f"{where}: {key} takes one value, not a list")
        for item in values:
            if isinstance(item, (dict, list, bool)):
                raise PerfkitError(f"{where}: {key} = {item!r}: write a number or a string")
            if action.option_strings:
                argv += [_long_option(action), str(item)]
            else:
                positionals.append(str(item))
    return positionals + argv


def expand_demo(argv: Sequence[str]) -> list[str]:
    """Replace `{demo}` by the built demo model repository's folder (built on first use)."""
    if not any(DEMO_PLACEHOLDER in token for token in argv):
        return list(argv)
    from v2kit.demo import ensure_demo_repository  # it loads onnx: only when a scenario names {demo}

    demo = str(ensure_demo_repository())
    return [token.replace(DEMO_PLACEHOLDER, demo) for token in argv]


def touched_dests(parser: argparse.ArgumentParser, argv: Sequence[str]) -> set[str]:
    """The dests of the options that appear in argv (long, --opt=value and -xVALUE forms)."""
    lookup = parser._option_string_actions
    dests = set()
    for token in argv:
        if not token.startswith("-") or token == "-":
            continue
        name = token.split("=", 1)[0]
        action = lookup.get(name) or (lookup.get(token[:2]) if not token.startswith("--") else None)
        if action is not None:
            dests.add(action.dest)
    return dests


def merge_argv(parser: argparse.ArgumentParser, from_file: list[str], from_cli: Sequence[str]) -> list[str]:
    """The file's flags followed by the command line's, so the command line wins. A flag the
    command line gives again loses the file's value (so the command echoed says each once, unless
    the flag is repeatable); a mutually exclusive group the command line touches loses the file's
    members."""
    touched = touched_dests(parser, from_cli)
    repeatable = {a.dest for a in parser._actions if isinstance(a, (argparse._AppendAction, argparse._CountAction))}
    dropped: set[str] = touched - repeatable
    for group in parser._mutually_exclusive_groups:
        members = {a.dest for a in group._group_actions}
        if members & touched:
            dropped |= members - touched
    kept: list[str] = []
    i = 0
    while i < len(from_file):
        action = parser._option_string_actions.get(from_file[i])
        if action is None:  # a positional (command_argv puts them first)
            kept.append(from_file[i])
            i += 1
            continue
        width = 1 if action.nargs == 0 else 2
        if action.dest not in dropped:
            kept += from_file[i : i + width]
        i += width
    return [*kept, *from_cli]
