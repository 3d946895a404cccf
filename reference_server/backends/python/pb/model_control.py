"""`pb_utils.load_model`, `unload_model` and `is_model_ready`: the model loading API of Triton's
python backend (README, "Model Loading API"), for a model that manages the models it calls.

They are the server's repository API (`POST /v2/repository/models/<name>/load` and `unload`,
`GET /v2/models/<name>/ready`), so load and unload need the server in explicit model control mode
(`--model-control-mode explicit`), as in Triton. `config` is a model config in JSON that replaces
the one on disk; `files` maps "file:<path in the model folder>" to that file's bytes, and the model
is loaded from a folder of those files (then `config` is required), as with the load API's
parameters. Failures raise TritonModelException with the server's words.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# Imported by pb_utils, which this module needs at call time only: import pb_utils, not this.
from reference_server.backends.python.pb import triton_python_backend_utils as pb

__all__ = ["is_model_ready", "load_model", "unload_model"]


def _call(call: str, prefix: str, tensors: dict[str, Any] | None = None, **args: Any) -> Any:
    try:
        return pb._bridge().call_server(call, args, tensors)
    except pb.TritonModelException as exc:
        raise pb.TritonModelException(prefix + str(exc)) from None


def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Load (or reload) `model_name`; with `config` (JSON) and `files` as the load API takes them."""
    contents: dict[str, Any] = {}
    if files is not None:
        if not isinstance(files, dict):
            raise pb.TritonModelException(
                f"failed to load model '{model_name}', files should be a dictionary of file paths and file contents"
            )
        # Through shared memory, as bytes: a model file may be far larger than a control message.
        contents = {str(path): np.frombuffer(bytes(content), dtype=np.uint8) for path, content in files.items()}
    _call("load_model", "Failed to load model: ", contents, model_name=model_name, config=config)


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    """Unload `model_name` (with `unload_dependents`, the ensembles that use it too)."""
    _call("unload_model", "Failed to unload model: ", model_name=model_name, unload_dependents=unload_dependents)


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    """Whether `model_name` (at `model_version`, "" for the server's choice) is ready for requests."""
    ready: bool = _call(
        "is_model_ready", "Failed to check model readiness: ", model_name=model_name, model_version=model_version
    )
    return ready
