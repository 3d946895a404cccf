"""perfkit: load testing and performance analysis for KServe v2 / Triton inference servers."""

from perfkit._version import __version__
from v2kit import compiled as _compiled

_compiled.install()  # before perfkit.load.samples, which may be compiled (v2kit/compiled.py)

__all__ = ["__version__"]
