"""Builds the request path's C extensions at install time; pyproject.toml holds the metadata.

`pip install -e .` (or `pip install .`) compiles the modules listed in `v2kit/compiled.py` with
mypyc when a C compiler and Python's headers are there and PERFKIT_PURE_PYTHON is not 1; otherwise
it installs the same sources, interpreted. Either way the decision is written to
`v2kit/_build_record.txt`, which `perfkit --version` and `perfkit-server --version` read to say why
they run interpreted. docs/compiled.md says more.
"""

from __future__ import annotations

import os
import runpy
import shutil
import sysconfig
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
_LIST = runpy.run_path(str(ROOT / "v2kit" / "compiled.py"))


def _why_not_compiled() -> str | None:
    """None when the extensions can be built, else why not, in words."""
    if os.environ.get(_LIST["PURE_PYTHON"]) == "1":
        return f"installed with {_LIST['PURE_PYTHON']}=1"
    compiler = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        return f"no C compiler when installed: {compiler} not found"
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file():
        return "no Python headers (Python.h) when installed"
    try:
        import mypyc.build  # noqa: F401  # in build-system.requires; absent without build isolation
    except ImportError:
        return "mypyc was not installed in the build environment"
    return None


def _extensions(why_not: str | None) -> list[Any]:
    if why_not is not None:
        return []
    from mypyc.build import mypycify

    paths = [str(Path(*name.split("."))) + ".py" for name in _LIST["COMPILED_MODULES"]]
    # The build environment has numpy and hpack (pyproject.toml's build requirements) but not the
    # other runtime packages: their types read as Any there, which leaves some of CI's
    # `type: ignore`s unused, harmless for the build.
    # multi_file: one C file per module (and mypyc's runtime in files of its own) instead of one
    # file for the whole group, so that _ParallelBuildExt can give them to one gcc per core; still
    # one group, one shared library, modules calling each other natively (docs/compiled.md, Install).
    extensions = mypycify(
        ["--no-warn-unused-ignores", *paths], opt_level="3", group_name=_LIST["GROUP"], multi_file=True
    )
    # mypyc writes a dotted group's headers under its package folder (build/v2kit/) but the modules'
    # C files, which include them, at the top of build/.
    headers = str(Path("build", *_LIST["GROUP"].split(".")[:-1]))
    for extension in extensions:
        extension.include_dirs.append(headers)
    return extensions


def _compile_in_parallel(compile_all: Callable[..., list[str]], jobs: int) -> Callable[..., list[str]]:
    """A compiler's `compile` that runs one compiler process per source file, `jobs` at a time (the
    objects in the sources' order, as `compile` returns them): setuptools compiles an extension's
    sources one after the other, and pip passes no -j."""

    def compile_each(sources: list[str], *args: Any, **kwargs: Any) -> list[str]:
        if len(sources) < 2 or jobs < 2:
            return compile_all(sources, *args, **kwargs)
        largest_first = sorted(sources, key=lambda source: -Path(source).stat().st_size)
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            objects = dict(zip(largest_first, pool.map(lambda one: compile_all([one], *args, **kwargs), largest_first)))
        return [obj for source in sources for obj in objects[source]]

    return compile_each


class _ParallelBuildExt(build_ext):
    """build_ext whose C compiles use every core the install may use."""

    def build_extensions(self) -> None:
        compile_all = self.compiler.compile
        self.compiler.compile = _compile_in_parallel(compile_all, _build_jobs())
        try:
            super().build_extensions()
        finally:
            self.compiler.compile = compile_all


def _build_jobs() -> int:
    """The cores this process may run on (a container's or taskset's limit, not the machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _record(why_not: str | None) -> str:
    """What v2kit/compiled.py reads back: the tool and each compiled source's hash (a source that
    no longer matches is imported instead of its extension), or why nothing was compiled."""
    if why_not is not None:
        return f"interpreted: {why_not}\n"
    hashes = [
        f"{name} {_LIST['source_hash'](ROOT.joinpath(*name.split('.')).with_suffix('.py'))}\n"
        for name in _LIST["COMPILED_MODULES"]
    ]
    return f"{_LIST['TOOL']}\n" + "".join(hashes)


def _remove_built() -> None:
    """Delete extensions an earlier compiled install left beside the sources: Python would prefer
    them to the sources this install means to run."""
    for name in [*_LIST["COMPILED_MODULES"], _LIST["GROUP"] + "__mypyc"]:
        module = ROOT.joinpath(*name.split("."))
        for built in module.parent.glob(module.name + ".*.so"):
            built.unlink()


def _remove_unlisted(root: Path) -> None:
    """Delete extensions beside the sources of modules no longer listed (taken off the list since
    an earlier build): Python would import them, stale, instead of their sources."""
    listed = {*_LIST["COMPILED_MODULES"], _LIST["GROUP"] + "__mypyc"}
    for package in ("v2kit", "perfkit", "reference_server"):
        for built in (root / package).rglob("*.so"):
            name = ".".join((*built.relative_to(root).parent.parts, built.name.split(".", 1)[0]))
            if name not in listed and built.with_name(built.name.split(".", 1)[0] + ".py").is_file():
                built.unlink()


if __name__ == "__main__":
    why_not = _why_not_compiled()
    _remove_unlisted(ROOT)
    if why_not is not None:
        _remove_built()
    (ROOT / "v2kit" / "_build_record.txt").write_text(_record(why_not))
    setup(
        ext_modules=_extensions(why_not),
        cmdclass={"build_ext": _ParallelBuildExt},
        package_data={"v2kit": ["_build_record.txt"]},
    )
