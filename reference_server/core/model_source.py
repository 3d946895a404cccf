"""What a load reads from a model folder: its configuration file, the backend its files name, and
the fingerprint that poll mode compares.

Which file (Triton's "Custom Model Configuration"): with `--model-config-name NAME`,
`<model>/configs/NAME.pbtxt` where it exists, else `<model>/config.pbtxt`. A folder without one
loads only while auto-complete is on (the default); with `--disable-auto-complete-config` or
`--strict-model-config true` Triton fails to poll it, and so do we.

Which backend (Triton's server-side autofill, `AutoCompleteBackendFields`, for the backends served
here): a config that names no backend and no platform, or no config at all, gets the backend of its
`default_model_filename`, else of the file found in the first version folder (by name, as Triton
lists them): `model.onnx` for ONNX Runtime, checked first, then `model.py` for python. The backend
then completes the rest (the graph's signature, python's `auto_complete_config`).
"""

from __future__ import annotations

import os
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from reference_server.backends.onnxruntime import ONNX_BACKEND
from reference_server.backends.python import PYTHON_BACKEND, PYTHON_MODEL_FILENAME
from reference_server.core.model_config import CONFIG_FILENAME, DEFAULT_MODEL_FILENAME, read_config
from reference_server.errors import ModelConfigError

__all__ = ["CONFIGS_FOLDER", "Fingerprint", "config_path", "fill_backend", "model_fingerprint", "read_model_config"]

#: Where `--model-config-name NAME` looks for `NAME.pbtxt`, inside the model folder.
CONFIGS_FOLDER = "configs"

_AUTO_COMPLETE_OFF = "--disable-auto-complete-config or --strict-model-config true"


def config_path(model_dir: Path, config_name: str | None = None) -> Path:
    """The configuration file a load of `model_dir` reads, whether or not it exists."""
    if config_name:
        custom = model_dir / CONFIGS_FOLDER / f"{config_name}.pbtxt"
        if custom.is_file():
            return custom
    return model_dir / CONFIG_FILENAME


def read_model_config(
    model_dir: Path, *, config_name: str | None = None, auto_complete: bool = True
) -> mc.ModelConfig | None:
    """The model's configuration file, parsed; None when there is none and auto-complete is on.

    Raises ModelConfigError naming the file when it cannot be read or parsed, or is missing while
    auto-complete is off.
    """
    path = config_path(model_dir, config_name)
    config = read_config(model_dir, str(path.relative_to(model_dir)))
    if config is None and not auto_complete:
        custom = f" (nor {CONFIGS_FOLDER}/{config_name}.pbtxt)" if config_name else ""
        raise ModelConfigError(
            f"{path}: no model configuration file{custom}, and auto-complete is off ({_AUTO_COMPLETE_OFF}); "
            f"write {CONFIG_FILENAME} or turn auto-complete on"
        )
    return config


def fill_backend(config: mc.ModelConfig | None, model_dir: Path) -> mc.ModelConfig | None:
    """`config` with the backend its model files name, where it names no backend and no platform,
    and a python model's `default_model_filename`, as Triton fills them before the model's
    `auto_complete_config` sees the config.

    Returns `config` itself when there is nothing to fill, else a filled copy (never modifying the
    caller's, which may be a load override kept for reloads).
    """
    filename = config.default_model_filename if config is not None else ""
    backend = None
    if config is None or not (config.backend or config.platform):
        backend = _backend_of_file(filename) or (
            None if filename else _backend_of_file_in(_first_version_dir(model_dir))
        )
    python = PYTHON_BACKEND in (backend, config.backend if config is not None else None)
    if backend is None and (filename or not python):
        return config
    filled = mc.ModelConfig()
    if config is not None:
        filled.CopyFrom(config)
    filled.backend = backend or filled.backend
    if python and not filename:
        filled.default_model_filename = PYTHON_MODEL_FILENAME
    return filled


def _backend_of_file(filename: str) -> str | None:
    return {DEFAULT_MODEL_FILENAME: ONNX_BACKEND, PYTHON_MODEL_FILENAME: PYTHON_BACKEND}.get(filename)


def _backend_of_file_in(version_dir: Path | None) -> str | None:
    if version_dir is None:
        return None
    for filename in (DEFAULT_MODEL_FILENAME, PYTHON_MODEL_FILENAME):
        if (version_dir / filename).is_file():
            return _backend_of_file(filename)
    return None


def _first_version_dir(model_dir: Path) -> Path | None:
    # Triton inspects the first sub-folder by name ("10" before "9"), whatever it is.
    try:
        folders = sorted(entry.name for entry in os.scandir(model_dir) if entry.is_dir())
    except OSError:
        return None
    return model_dir / folders[0] if folders else None


#: (path relative to the model folder, size, mtime_ns, inode) of every entry, sorted.
Fingerprint = tuple[tuple[str, int, int, int], ...]


def model_fingerprint(model_dir: Path) -> Fingerprint:
    """Every entry under the model folder with its size, modification time and inode.

    stat() only: hashing multi-gigabyte model files on every poll would cost more than the reloads
    it could save. As in Triton, which compares modification times, a rewrite that keeps the size,
    the mtime (in ns) and the inode goes unnoticed. Hidden entries (editor swap files) are skipped.
    """
    entries: list[tuple[str, int, int, int]] = []
    for dirpath, dirnames, filenames in os.walk(model_dir):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for entry in (*dirnames, *filenames):
            if entry.startswith("."):
                continue
            path = os.path.join(dirpath, entry)
            relative = os.path.relpath(path, model_dir)
            try:
                st = os.stat(path)  # follows links: pointing a link elsewhere is a change
            except OSError:
                entries.append((relative, -1, -1, -1))  # a dangling link, or removed while we walk
                continue
            entries.append((relative, st.st_size, st.st_mtime_ns, st.st_ino))
    return tuple(sorted(entries))
