"""The compiled request path's fallback and its report (v2kit/compiled.py, setup.py): a module
whose extension cannot run is imported from its source, PERFKIT_PURE_PYTHON=1 forces the sources at
run time, and `--version` says which. The extensions here are fakes (bytes that are no shared
library), so these run the same whether the install compiled or not."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.machinery
import pickle
import runpy
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from perfkit.cli import build_parser as client_parser
from reference_server.config import build_parser as server_parser
from v2kit import compiled

PACKAGE = "compiled_fake_pkg"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A package whose module `mod` has a source and, beside it, an extension that cannot load."""
    package = tmp_path / PACKAGE
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "mod.py").write_text("WHERE = 'source'\n")
    extension = package / ("mod" + importlib.machinery.EXTENSION_SUFFIXES[0])
    extension.write_bytes(b"not a shared library")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(compiled, "COMPILED_MODULES", (*compiled.COMPILED_MODULES, f"{PACKAGE}.mod"))
    monkeypatch.setattr(compiled, "_FALLBACKS", {})
    monkeypatch.delenv(compiled.PURE_PYTHON, raising=False)
    yield extension
    for name in (f"{PACKAGE}.mod", PACKAGE):
        sys.modules.pop(name, None)


def test_an_extension_that_fails_to_import_falls_back_to_its_source(fake: Path) -> None:
    module = importlib.import_module(f"{PACKAGE}.mod")
    assert module.WHERE == "source" and module.__file__ == str(fake.with_name("mod.py"))
    assert compiled._FALLBACKS[f"{PACKAGE}.mod"].startswith("import failed: ImportError")
    assert compiled.describe([PACKAGE]).startswith("interpreted (import failed: ImportError")


def test_without_the_finder_the_same_extension_breaks_the_import(fake: Path) -> None:
    # What the finder prevents: Python's own import prefers the extension and fails on it.
    sys.meta_path.remove(compiled._FINDER)
    try:
        with pytest.raises(ImportError):
            importlib.import_module(f"{PACKAGE}.mod")
    finally:
        compiled.install()


def test_pure_python_at_run_time_imports_the_source(fake: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(compiled.PURE_PYTHON, "1")
    assert importlib.import_module(f"{PACKAGE}.mod").WHERE == "source"
    assert compiled._FALLBACKS == {}  # chosen, not failed
    assert compiled.describe([PACKAGE]) == "interpreted (PERFKIT_PURE_PYTHON=1)"


def test_a_source_changed_since_the_build_is_imported_instead(
    fake: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = tmp_path / "record.txt"
    monkeypatch.setattr(compiled, "BUILD_RECORD", record)
    monkeypatch.setattr(compiled, "_CHANGED", {})
    record.write_text(f"mypyc\n{PACKAGE}.mod {'0' * 64}\n")  # built from other bytes than mod.py's
    assert importlib.import_module(f"{PACKAGE}.mod").WHERE == "source"
    said = compiled.describe([PACKAGE])
    assert f"changed since the build: {PACKAGE}.mod; rebuild: pip install -e ." in said
    sys.modules.pop(f"{PACKAGE}.mod")
    monkeypatch.setattr(compiled, "_FALLBACKS", {})
    monkeypatch.setattr(compiled, "_CHANGED", {})
    record.write_text(f"mypyc\n{PACKAGE}.mod {compiled.source_hash(fake.with_name('mod.py'))}\n")
    importlib.import_module(f"{PACKAGE}.mod")  # the same bytes: the extension is tried (and fails)
    assert compiled._FALLBACKS[f"{PACKAGE}.mod"].startswith("import failed")


def test_without_extensions_the_install_record_says_why(fake: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake.unlink()
    record = fake.with_name("record.txt")
    record.write_text("interpreted: no C compiler when installed: cc not found\n")
    monkeypatch.setattr(compiled, "BUILD_RECORD", record)
    assert compiled.describe([PACKAGE]) == "interpreted (no C compiler when installed: cc not found)"


@pytest.mark.parametrize(("parser", "program"), [(client_parser, "perfkit"), (server_parser, "perfkit-server")])
def test_version_says_compiled_or_interpreted(
    parser: object, program: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(SystemExit) as exited:
        parser().parse_args(["--version"])  # type: ignore[operator]
    assert exited.value.code == 0
    said = capsys.readouterr().out
    assert said.startswith(f"{program} 0.1.0, ")
    if compiled._recorded() == compiled.TOOL and not compiled.pure_python_forced():
        # The install compiled: every listed module of the program must be running compiled.
        assert said.endswith(" modules\n") and ", compiled (mypyc): " in said, said
    monkeypatch.setenv(compiled.PURE_PYTHON, "1")
    with pytest.raises(SystemExit):
        parser().parse_args(["--version"])  # type: ignore[operator]
    assert capsys.readouterr().out == f"{program} 0.1.0, interpreted (PERFKIT_PURE_PYTHON=1)\n"


def test_setup_builds_unless_told_not_to_or_without_a_compiler(monkeypatch: pytest.MonkeyPatch) -> None:
    setup = runpy.run_path(str(ROOT / "setup.py"), run_name="setup_under_test")  # defines, builds nothing
    monkeypatch.setenv(compiled.PURE_PYTHON, "1")
    assert setup["_why_not_compiled"]() == "installed with PERFKIT_PURE_PYTHON=1"
    monkeypatch.delenv(compiled.PURE_PYTHON)
    monkeypatch.setenv("CC", "/nonexistent/cc -O2")
    assert setup["_why_not_compiled"]() == "no C compiler when installed: /nonexistent/cc not found"


CLIENT_PATH = ("perfkit.load.generator", "perfkit.wire.http_pool", "perfkit.wire.client", "perfkit.wire.replies",
               "perfkit.wire.grpc.client", "perfkit.wire.grpc.channel", "perfkit.wire.grpc.connection",
               "perfkit.wire.grpc.streaming", "v2kit.h2.connection", "v2kit.h2.receive", "v2kit.h2.events")  # fmt: skip


def test_the_load_generators_request_path_is_compiled_when_the_install_compiled() -> None:
    assert set(CLIENT_PATH) <= set(compiled.COMPILED_MODULES)
    if compiled._recorded() == compiled.TOOL and not compiled.pure_python_forced():
        running = [name for name in CLIENT_PATH if not compiled.is_compiled(importlib.import_module(name))]
        assert not running, f"interpreted though the install compiled: {running}"


def test_setup_removes_the_extension_of_a_module_taken_off_the_list(tmp_path: Path) -> None:
    setup = runpy.run_path(str(ROOT / "setup.py"), run_name="setup_under_test")
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    (tmp_path / "perfkit" / "wire").mkdir(parents=True)
    for module in ("wire/replies", "wire/sniff", "stray"):
        (tmp_path / "perfkit" / f"{module}.py").write_text("")
        (tmp_path / "perfkit" / f"{module}{suffix}").write_bytes(b"")
    (tmp_path / "perfkit" / f"no_source{suffix}").write_bytes(b"")  # not beside a source: not ours to judge
    setup["_remove_unlisted"](tmp_path)
    assert sorted(path.name for path in tmp_path.rglob(f"*{suffix}")) == [f"no_source{suffix}", f"replies{suffix}"]


def test_setup_compiles_an_extensions_sources_side_by_side_in_their_order(tmp_path: Path) -> None:
    # setuptools compiles an extension's C files one after the other; setup.py's build runs one
    # compiler per file, a core each. Two calls meeting at a barrier prove two ran at once.
    setup = runpy.run_path(str(ROOT / "setup.py"), run_name="setup_under_test")
    sources = []
    for name, size in (("small.c", 1), ("large.c", 3), ("middle.c", 2)):
        (tmp_path / name).write_bytes(b"x" * size)
        sources.append(str(tmp_path / name))
    both_running = threading.Barrier(2, timeout=10)
    calls: list[tuple[list[str], str]] = []

    def compile_all(files: list[str], output_dir: str) -> list[str]:
        calls.append((files, output_dir))
        if files == [sources[1]] or files == [sources[2]]:  # the two largest, started first
            both_running.wait()
        return [file.replace(".c", ".o") for file in files]

    compile_each = setup["_compile_in_parallel"](compile_all, 2)
    assert compile_each(sources, output_dir="out") == [source.replace(".c", ".o") for source in sources]
    assert sorted(calls) == sorted(([source], "out") for source in sources)
    assert setup["_compile_in_parallel"](compile_all, 1)(sources, output_dir="o") == compile_all(sources, "o")


def test_every_frozen_dataclass_of_a_compiled_module_survives_pickling() -> None:
    # The server pickles its HTTP/2 limits to each front-end worker and ray pickles samples; a
    # frozen dataclass compiled by mypyc cannot be unpickled field by field ("cannot assign to
    # field"), so each needs its __reduce__. Checked on every one whose fields all have defaults.
    checked = []
    for name in compiled.COMPILED_MODULES:
        module = importlib.import_module(name)
        for value in vars(module).values():
            params = getattr(value, "__dataclass_params__", None)
            if not isinstance(value, type) or value.__module__ != name or params is None or not params.frozen:
                continue
            fields = dataclasses.fields(value)
            if any(f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING for f in fields):
                continue
            instance = value()
            assert pickle.loads(pickle.dumps(instance)) == instance, value.__qualname__
            checked.append(value.__qualname__)
    assert "H2Limits" in checked
