"""Which request-path modules run compiled, and the fallback that keeps the program running when
they cannot.

`pip install -e .` compiles the modules in `COMPILED_MODULES` with mypyc (setup.py) into extension
modules beside their sources (`v2kit/codec.cpython-311-x86_64-linux-gnu.so` next to
`v2kit/codec.py`), and Python's own import system prefers the extension. `install()` puts a finder
in front of it, for those modules only, so that:

- `PERFKIT_PURE_PYTHON=1` at run time imports the `.py` sources (no rebuild needed to debug with
  the interpreter's tracebacks);
- an extension built from another version of its source (edited or checked out since the build:
  the record of the build holds each source's hash) or one that fails to import (built for another Python, its shared group library missing) is reported
  and the source imported instead, rather than running old code or failing.

`describe()` is the line `perfkit --version` and `perfkit-server --version` print. The package
`__init__`s of v2kit and perfkit call `install()`, so the finder is in place before any listed
module is imported. This module itself is never compiled, and imports only the standard library
(setup.py reads it before anything is installed).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

#: The tool that compiles them.
TOOL = "mypyc"

#: The modules compiled at install time, in one mypyc group (`GROUP`): pure computation, typed.
COMPILED_MODULES = (
    # The load generator's request path, in the order of one request's client profile
    # (docs/compiled.md, "The client"): the loop, HTTP/1.1, the reply check, gRPC's send, its
    # channel, connection and streams, and the HTTP/2 engine under them (the server's too).
    "perfkit.load.generator",
    "perfkit.wire.http_pool",
    "perfkit.wire.client",
    "perfkit.wire.replies",
    "perfkit.wire.grpc.client",
    "perfkit.wire.grpc.channel",
    "perfkit.wire.grpc.connection",
    "perfkit.wire.grpc.streaming",
    "v2kit.h2.connection",
    "v2kit.h2.receive",
    "v2kit.h2.events",
    "v2kit.h2.rules",
    "v2kit.codec",
    "v2kit.tensors",
    "v2kit.h2.fields",
    "v2kit.h2.frames",
    "perfkit.load.samples",
    # The server's request path, in the order of a request's profile (docs/compiled.md): the HTTP/1.1
    # front end, the python backend's side of the stub crossing, the scheduler, the data plane (the
    # HTTP/2 engine under the gRPC front end is listed above). Not yet: grpc/server.py and grpc/service.py (async
    # generators, which mypyc does not compile), and grpc/calls.py (compiled, `Context.abort`, which
    # raises a subclass of grpc.aio.AbortError, crashed the process: docs/compiled.md).
    "reference_server.frontends.http.connection",
    "reference_server.frontends.http.pipelined_reads",
    "reference_server.frontends.http.messages",
    "reference_server.frontends.http.rest",
    "reference_server.backends.python.instance",
    "reference_server.backends.python.process",
    "reference_server.backends.python.ipc",
    "reference_server.scheduling.scheduler",
    "reference_server.scheduling.answers",
    "reference_server.scheduling.execute",
    "reference_server.scheduling.stats",
    "reference_server.core.dataplane",
    "reference_server.core.validation",
)

#: mypyc's shared library for the group, `v2kit/_compiled__mypyc.*.so`: the per-module extensions
#: are small shims into it.
GROUP = "v2kit._compiled"

#: The environment variable that keeps (at install) or makes (at run time) everything interpreted.
PURE_PYTHON = "PERFKIT_PURE_PYTHON"

#: What setup.py decided, written beside this module at install time: a first line `mypyc`, then
#: `<module> <sha256 of its source>` for each module compiled; or one line `interpreted: <why>`.
#: Absent in a checkout that was never installed.
BUILD_RECORD = Path(__file__).with_name("_build_record.txt")

#: Why a listed module runs interpreted though its extension is there, by module name.
_FALLBACKS: dict[str, str] = {}


def by_constructor(value: Any) -> tuple[Any, tuple[Any, ...]]:
    """How a dataclass of a compiled module pickles (`return by_constructor(self)` from its
    `__reduce__`): by its constructor, from its fields in their order. Compiled by mypyc, the default
    (setting each field after an empty instance is made) fails with "cannot assign to field"."""
    return type(value), tuple(getattr(value, f.name) for f in dataclasses.fields(value))


def pure_python_forced() -> bool:
    return os.environ.get(PURE_PYTHON) == "1"


class _ExtensionOrSource(importlib.abc.Loader):
    """Loads the extension; if that raises, runs the `.py` beside it instead and records why."""

    def __init__(self, extension: importlib.machinery.ExtensionFileLoader, source: Path) -> None:
        self._extension = extension
        self._source = source
        self._loaded = False

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        try:
            module = self._extension.create_module(spec)
        except Exception as exc:  # any failure of the compiled module falls back to its source
            _FALLBACKS[spec.name] = f"import failed: {type(exc).__name__}: {exc}"
            return None  # the default: an empty module that exec_module fills from the source
        self._loaded = True
        return module

    def exec_module(self, module: ModuleType) -> None:
        if self._loaded:
            self._extension.exec_module(module)
            return
        module.__file__ = str(self._source)
        if module.__spec__ is not None:
            module.__spec__.origin = str(self._source)
        importlib.machinery.SourceFileLoader(module.__name__, str(self._source)).exec_module(module)


class _CompiledFinder(importlib.abc.MetaPathFinder):
    """Finds the listed modules only; every other import goes on to Python's own finders."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in COMPILED_MODULES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.origin is None or not isinstance(spec.loader, importlib.machinery.ExtensionFileLoader):
            return spec
        source = Path(spec.origin).with_name(fullname.rpartition(".")[2] + ".py")
        if not source.is_file():
            return spec  # an installed wheel without sources: the extension is all there is
        if pure_python_forced():
            return importlib.util.spec_from_file_location(fullname, source)
        changed = _changed_since_build(source.parents[fullname.count(".")])
        if changed:
            # Edited (or checked out) since the build: the extensions would run the old code. The
            # whole group falls back, as its compiled modules import each other natively.
            _FALLBACKS[fullname] = f"changed since the build: {', '.join(changed)}; rebuild: pip install -e ."
            return importlib.util.spec_from_file_location(fullname, source)
        wrapped = importlib.machinery.ModuleSpec(fullname, _ExtensionOrSource(spec.loader, source), origin=spec.origin)
        wrapped.has_location = True  # __file__ is the extension's, or the source's once it falls back
        return wrapped


_FINDER = _CompiledFinder()


def install() -> None:
    """Put the finder first on `sys.meta_path`, once."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def is_compiled(module: ModuleType) -> bool:
    return any(str(module.__file__ or "").endswith(suffix) for suffix in importlib.machinery.EXTENSION_SUFFIXES)


def source_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _record_lines() -> list[str]:
    try:
        return BUILD_RECORD.read_text().splitlines()
    except OSError:
        return []


def _recorded() -> str:
    """The record's first line: the tool, or 'interpreted: <why>' ('' without a record)."""
    lines = _record_lines()
    return lines[0].strip() if lines else ""


def _built_hashes() -> dict[str, str]:
    """The source hash each module was compiled from, by module name."""
    return dict(line.split(" ", 1) for line in _record_lines()[1:] if " " in line)


_CHANGED: dict[Path, list[str]] = {}


def _changed_since_build(root: Path) -> list[str]:
    """The recorded modules whose source under `root` (the folder holding the packages) no longer
    has the hash they were compiled from; worked out once per process."""
    if root not in _CHANGED:
        _CHANGED[root] = [
            name
            for name, built in _built_hashes().items()
            if (path := root.joinpath(*name.split(".")).with_suffix(".py")).is_file() and source_hash(path) != built
        ]
    return _CHANGED[root]


def _failures(names: Sequence[str]) -> str:
    """The modules of `names` that fell back, grouped by why: '<why>: a, b; <why>: c' ('<why>' alone
    when all of them did, for one reason)."""
    by_reason: dict[str, list[str]] = {}
    for name in names:
        if name in _FALLBACKS:
            by_reason.setdefault(_FALLBACKS[name], []).append(name)
    return "; ".join(
        reason if len(modules) == len(names) else f"{reason}: {', '.join(modules)}"
        for reason, modules in by_reason.items()
    )


def describe(packages: Sequence[str]) -> str:
    """How the listed modules of `packages` run: 'compiled (mypyc): N modules' or 'interpreted (why)'.
    Imports them (a program that asks imports them anyway)."""
    names = [name for name in COMPILED_MODULES if name.partition(".")[0] in packages]
    if pure_python_forced():
        return f"interpreted ({PURE_PYTHON}=1)"
    compiled = [name for name in names if is_compiled(importlib.import_module(name))]
    failed = _failures(names)
    if len(compiled) == len(names):
        return f"compiled ({TOOL}): {len(names)} modules"
    if compiled:
        rest = failed or "the others were not built"
        return f"compiled ({TOOL}): {len(compiled)} of {len(names)} modules ({rest})"
    if failed:
        return f"interpreted ({failed})"
    recorded = _recorded()
    if recorded.startswith("interpreted: "):
        return f"interpreted ({recorded.removeprefix('interpreted: ')})"
    return "interpreted (not built: run `pip install -e .` with a C compiler to compile)"


def version_action(program: str, version: str, packages: Sequence[str]) -> type[argparse.Action]:
    """An argparse `--version` action printing '<program> <version>, <describe(packages)>', worked
    out only when asked (it imports the compiled modules)."""

    class _Version(argparse.Action):
        def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
            kwargs.setdefault("help", "show the version and whether the request path is compiled, and exit")
            super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

        def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
            print(f"{program} {version}, {describe(packages)}")  # to stdout, as argparse's own version action
            parser.exit()

    return _Version
