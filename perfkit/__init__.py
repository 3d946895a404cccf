"""perfkit: load testing and performance analysis for KServe v2 / Triton inference servers."""

from perfkit._version import __version__

__all__ = ["__version__"]
