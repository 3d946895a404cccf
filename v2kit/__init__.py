"""The KServe v2 protocol floor shared by perfkit and reference_server."""

from v2kit import compiled as _compiled

# Before any compiled module is imported: PERFKIT_PURE_PYTHON=1 and failed extensions fall back
# to the sources (v2kit/compiled.py).
_compiled.install()
