"""The Python a model's stubs run in, and the command that starts one.

By default a stub runs in the server's own interpreter. A model may name another environment, as
Triton's python backend lets it (python_backend README, "Creating Custom Execution Environments"):

    parameters: { key: "EXECUTION_ENV_PATH", value: { string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz" } }

a conda-pack archive (extracted once per server into a `python_env_*` folder under the temporary
directory, and again when the archive's modification time changes; models naming the same archive
share one copy) or an unpacked environment folder. `$$TRITON_MODEL_DIRECTORY` is the model's folder.
The environment must hold `bin/activate`, which is sourced, as Triton does, before its own
`bin/python3` runs the stub. The stub is this server's Python code, so the environment needs only a
Python of 3.10 or later with numpy (Triton's also needs the stub's exact Python version).
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tarfile
import tempfile
import threading
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from reference_server.errors import ModelConfigError

__all__ = ["EXECUTION_ENV_PATH", "REPO_ROOT", "interpreter", "stub_command"]

EXECUTION_ENV_PATH = "EXECUTION_ENV_PATH"
MODEL_DIRECTORY = "$$TRITON_MODEL_DIRECTORY"
REPO_ROOT = str(Path(__file__).resolve().parents[3])

# The stub's program. Importing `reference_server.backends.python.stub` the usual way would first run
# `reference_server/backends/__init__.py`, which loads every backend (onnxruntime, tritonclient's
# protobufs): a quarter second per stub start, and packages another environment need not have. The
# stub needs none of it, so its parent packages are stood in by bare package objects (their folders
# as __path__), and only the stub's own modules (stub, ipc, pb) and v2kit.tensors are imported.
_BOOTSTRAP = """\
import sys, types
from pathlib import Path
root = Path(sys.argv[1])
for name in ("reference_server", "reference_server.backends", "reference_server.backends.python"):
    package = types.ModuleType(name)
    package.__path__ = [str(root.joinpath(*name.split(".")))]
    sys.modules[name] = package
from reference_server.backends.python import stub
stub.run(sys.argv[2:])
"""
# Sources the activation script ($0), then runs the environment's Python with the stub's arguments.
_ACTIVATE_THEN_RUN = 'source "$0" > /dev/null && exec "$@"'


def stub_command(interpreter: tuple[str, ...], arguments: list[str]) -> tuple[list[str], dict[str, str]]:
    """The command line and environment variables of a stub started with `arguments`."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, env.get("PYTHONPATH", "")) if p)
    if interpreter:  # the model's own environment: nothing of the server's interpreter leaks in
        env.pop("PYTHONHOME", None)
        env.pop("VIRTUAL_ENV", None)
    return [*(interpreter or (sys.executable,)), "-c", _BOOTSTRAP, REPO_ROOT, *arguments], env


def interpreter(config: mc.ModelConfig, model_dir: Path) -> tuple[str, ...]:
    """The command that runs Python in the config's EXECUTION_ENV_PATH; () for the server's own.
    Raises ModelConfigError, in Triton's words where it has some, when the environment cannot be used."""
    parameter = config.parameters.get(EXECUTION_ENV_PATH)
    if parameter is None or not parameter.string_value:
        return ()
    path = parameter.string_value.replace(MODEL_DIRECTORY, str(model_dir))
    root = _environments.extracted(path)
    activate = root / "bin" / "activate"
    if not activate.is_file():
        raise ModelConfigError(
            f"Path {activate} does not exist. The Python environment should contain an 'activate' script."
        )
    for name in ("python3", "python"):
        if (root / "bin" / name).exists():
            return ("bash", "-c", _ACTIVATE_THEN_RUN, str(activate), str(root / "bin" / name))
    raise ModelConfigError(
        f"model '{config.name}': the Python environment {root} (EXECUTION_ENV_PATH) has no bin/python3; "
        "point EXECUTION_ENV_PATH at a conda-pack archive or an environment folder with its own Python"
    )


class _Environments:
    """Archives extracted so far: canonical path → (folder, modification time)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._base: Path | None = None
        self._extracted: dict[str, tuple[Path, float]] = {}

    def extracted(self, path: str) -> Path:
        """The environment folder for `path`: itself when a folder, else where the archive was extracted."""
        try:
            canonical = Path(path).resolve(strict=True)
        except (OSError, RuntimeError):
            raise ModelConfigError(f"Failed to get the canonical path for {path}.") from None
        if canonical.is_dir():
            return canonical
        with self._lock:
            mtime = canonical.stat().st_mtime
            known = self._extracted.get(str(canonical))
            if known is not None and known[1] == mtime:
                return known[0]
            target = known[0] if known is not None else self._folder() / str(len(self._extracted))
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir(parents=True)
            try:
                with tarfile.open(canonical) as archive:
                    if hasattr(tarfile, "tar_filter"):  # Python 3.11.4+
                        # "tar": no member outside the folder; links may point anywhere, as a
                        # packed environment's do.
                        archive.extractall(target, filter="tar")
                    else:
                        archive.extractall(target)
            except (OSError, tarfile.TarError) as error:
                shutil.rmtree(target, ignore_errors=True)
                raise ModelConfigError(
                    f"Failed to extract the Python execution environment {canonical}: {error}"
                ) from None
            self._extracted[str(canonical)] = (target, mtime)
            return target

    def _folder(self) -> Path:
        if self._base is None:
            self._base = Path(tempfile.mkdtemp(prefix="python_env_"))
            atexit.register(shutil.rmtree, self._base, True)
        return self._base


_environments = _Environments()
