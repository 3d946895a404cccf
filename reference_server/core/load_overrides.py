"""The repository load API's `file:` overrides: a model loaded from files sent in the request.

Triton's load request may carry, beside `config` (the model configuration as JSON), parameters
named `file:<path>` whose values are the files of a model folder (`file:1/model.onnx`; over HTTP
base64 text, which the REST front end decodes; over gRPC `bytes_param`). Triton then loads the
model from a temporary folder holding those files and the config (its LocalizeRepoAgent), not from
the repository: the model need not be in the repository at all, and the repository is never
written. We do the same:

- `config` is required with files ("Load parameter 'config' must be specified for model file
  override").
- Each path must stay inside the model folder once normalised (`file:../x` is refused, naming the
  parameter and the normalised path, in Triton's words).
- The folder is `<temp>/<model name>/`, so the config's name matches its folder as anywhere else,
  with the config written as config.pbtxt beside the files.
- A staged folder lives while a version loaded from it serves: it is removed when the model is
  loaded again (with other files, or from the repository), unloaded, or when the load fails, and
  with the process at the latest.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from collections.abc import Mapping
from pathlib import Path

from google.protobuf import text_format

from reference_server.errors import InvalidArgument
from v2kit.model_config import CONFIG_FILENAME, ModelConfig

__all__ = ["FILE_PREFIX", "OverrideFolders"]

#: The prefix of a load parameter that carries a model file.
FILE_PREFIX = "file:"


class OverrideFolders:
    """The temporary model folders of the models loaded with `file:` overrides, one per model."""

    def __init__(self) -> None:
        self._root: Path | None = None
        self._folders: dict[str, Path] = {}

    def stage(self, name: str, config: ModelConfig | None, files: Mapping[str, object]) -> Path:
        """Write `files` (load parameter name -> content) and `config` into a new folder for model
        `name` and return that folder; blocking (the files may be large).

        Refused with InvalidArgument, in Triton 2.51's words "failed to load 'NAME', failed to poll
        from model repository" followed by the reason (Triton's words for it, which Triton only
        logs): files without a config, content that is not bytes, a path that leaves the folder.
        Triton answers these with INTERNAL (HTTP 500); a client's mistake is a 400 here, as every
        bad request is (docs/reliability.md, "Bad input")."""
        if config is None:
            raise InvalidArgument(f"{_failed(name)}Load parameter 'config' must be specified for model file override")
        if name in (".", "..") or any(c in name for c in "/\\\x00"):
            raise InvalidArgument(f"invalid model name '{name}', model name must not contain path traversal characters")
        for key, content in files.items():
            if not isinstance(content, bytes):
                raise InvalidArgument(
                    f"{_failed(name)}File parameter '{key}' must have bytes type for its value "
                    "(over HTTP: the file's content base64-encoded in a JSON string)"
                )
        staging = Path(tempfile.mkdtemp(prefix="load-", dir=self._staging_root()))
        model_dir = staging / name
        try:
            # Every path is checked before any file is written.
            targets = [(key, _target(name, model_dir, key), content) for key, content in files.items()]
            model_dir.mkdir()
            (model_dir / CONFIG_FILENAME).write_text(text_format.MessageToString(config))
            for key, path, content in targets:
                assert isinstance(content, bytes)
                _write(name, key, path, content)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return model_dir

    def commit(self, name: str, model_dir: Path | None) -> None:
        """`name` now serves from `model_dir` (None: from the repository, or nothing): the folder it
        was loaded from before is removed."""
        previous = self._folders.pop(name, None)
        if model_dir is not None:
            self._folders[name] = model_dir
        if previous is not None and previous != model_dir:
            self.discard(previous)

    @staticmethod
    def discard(model_dir: Path) -> None:
        """Remove a staged folder (one `stage` returned)."""
        shutil.rmtree(model_dir.parent, ignore_errors=True)

    def _staging_root(self) -> Path:
        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix="perfkit-server-overrides-"))
            # Whatever is still staged goes with the process.
            weakref.finalize(self, shutil.rmtree, str(self._root), True)
        return self._root


def _failed(name: str) -> str:
    return f"failed to load '{name}', failed to poll from model repository: "


def _target(name: str, model_dir: Path, key: str) -> str:
    """Where the file of load parameter `key` goes: inside `model_dir`, or refused."""
    relative = key[len(FILE_PREFIX) :]
    path = os.path.normpath(os.path.join(model_dir, relative))
    if not relative or os.path.commonpath([model_dir, path]) != str(model_dir) or path == str(model_dir):
        raise InvalidArgument(
            f"{_failed(name)}Invalid file parameter '{key}' with normalized path '{path}' must stay "
            "within model directory."
        )
    return path


def _write(name: str, key: str, path: str, content: bytes) -> None:
    parent = os.path.dirname(path)
    if os.path.exists(parent) and not os.path.isdir(parent):
        raise InvalidArgument(f"{_failed(name)}Invalid file parameter '{key}', directory has been created as a file")
    os.makedirs(parent, exist_ok=True)
    if os.path.isdir(path):
        raise InvalidArgument(f"{_failed(name)}Invalid file parameter '{key}' names a directory, not a file")
    with open(path, "wb") as out:
        out.write(content)
