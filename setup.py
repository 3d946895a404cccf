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
from pathlib import Path
from typing import Any

from setuptools import setup

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
    # The build environment has numpy (build-system.requires: its types are needed for the type
    # aliases) but not the other runtime packages (hpack): their types read as Any there, which
    # leaves some of CI's `type: ignore`s unused, harmless for the build.
    return mypycify(["--no-warn-unused-ignores", *paths], opt_level="3", group_name=_LIST["GROUP"])


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


if __name__ == "__main__":
    why_not = _why_not_compiled()
    if why_not is not None:
        _remove_built()
    (ROOT / "v2kit" / "_build_record.txt").write_text(_record(why_not))
    setup(ext_modules=_extensions(why_not), package_data={"v2kit": ["_build_record.txt"]})
