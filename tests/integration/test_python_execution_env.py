"""A python model's `EXECUTION_ENV_PATH` (Triton's python_backend README, "Creating Custom Execution
Environments"): its stubs run in the environment it names, packed (`$$TRITON_MODEL_DIRECTORY/env.tar.gz`)
or unpacked, with a package only that environment has; models naming one archive share one copy;
an environment that cannot be used leaves its model unavailable with the reason, in Triton's words
where it has some, and the others serve.

The environment is a venv of the test's own Python (with `--without-pip`; numpy reaches it through
a .pth file, as it is not installed there) packed with tar, as conda-pack packs one: files at the
archive's root, `bin/activate` among them."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from reference_server.server import running_server
from tests.servers import loopback_config

pytestmark = pytest.mark.integration

MODEL = """\
import json
import os
import sys

import numpy as np
import env_marker  # only the execution environment has it
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        facts = {"marker": env_marker.WHERE, "prefix": sys.prefix, "executable": sys.executable,
                 "activated": os.environ.get("VIRTUAL_ENV", "")}
        info = np.array([json.dumps(facts).encode()], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("INFO", info)]) for _ in requests]
"""


def _config(name: str, env_path: str | None) -> str:
    parameter = f'parameters: {{ key: "EXECUTION_ENV_PATH", value: {{ string_value: "{env_path}" }} }}\n'
    return (
        f'name: "{name}"\nbackend: "python"\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "INFO" data_type: TYPE_STRING dims: [ 1 ] } ]\n' + (parameter if env_path is not None else "")
    )


def _make_environment(folder: Path) -> Path:
    """A venv whose site-packages holds `env_marker` and sees this Python's numpy."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120)
    (site,) = folder.glob("lib/python3*/site-packages")
    (site / "env_marker.py").write_text('WHERE = "execution environment"\n')
    (site / "server_numpy.pth").write_text(str(Path(np.__file__).resolve().parents[1]) + "\n")
    return folder


def _model(repository: Path, name: str, env_path: str | None) -> Path:
    folder = repository / name
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(MODEL)
    (folder / "config.pbtxt").write_text(_config(name, env_path))
    return folder


def _facts(http_url: str, model: str) -> dict[str, str]:
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1.0]}]}
    request = urllib.request.Request(
        f"http://{http_url}/v2/models/{model}/infer", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        (output,) = json.loads(response.read())["outputs"]
    facts: dict[str, str] = json.loads(output["data"][0])
    return facts


def _load(http_url: str, model: str) -> tuple[int, str]:
    request = urllib.request.Request(f"http://{http_url}/v2/repository/models/{model}/load", b"{}", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_stubs_run_in_the_environment_the_model_names(tmp_path: Path) -> None:
    environment = _make_environment(tmp_path / "build" / "env")
    repository = tmp_path / "models"
    packed = _model(repository, "packed", "$$TRITON_MODEL_DIRECTORY/env.tar.gz")
    with tarfile.open(packed / "env.tar.gz", "w:gz") as archive:
        archive.add(environment, arcname=".")
    _model(repository, "packed_too", str(packed / "env.tar.gz"))  # the same archive, by absolute path
    _model(repository, "unpacked", str(environment))
    _model(repository, "no_activate", str(tmp_path / "build" / "env" / "lib"))
    _model(repository, "missing", "$$TRITON_MODEL_DIRECTORY/absent.tar.gz")
    _model(repository, "servers_own", None)
    with running_server(loopback_config(repository, load=("packed", "packed_too", "unpacked"))) as server:
        packed_facts = _facts(server.http_url, "packed")
        assert packed_facts["marker"] == "execution environment"
        extracted = Path(packed_facts["prefix"])
        assert extracted.parent.name.startswith("python_env_") and (extracted / "bin" / "activate").is_file()
        assert packed_facts["activated"]  # bin/activate was sourced
        assert _facts(server.http_url, "packed_too")["prefix"] == str(extracted)  # extracted once
        unpacked = _facts(server.http_url, "unpacked")
        assert unpacked["prefix"] == str(environment.resolve()) and unpacked["marker"] == "execution environment"

        status, text = _load(server.http_url, "servers_own")  # no parameter: the server's Python
        assert status == 400 and "No module named 'env_marker'" in text, text
        status, text = _load(server.http_url, "no_activate")
        assert status == 400 and f"Path {environment.resolve() / 'lib' / 'bin' / 'activate'} does not exist" in text
        assert "The Python environment should contain an 'activate' script." in text
        status, text = _load(server.http_url, "missing")
        assert status == 400 and "Failed to get the canonical path for " in text and "absent.tar.gz" in text
        assert _facts(server.http_url, "packed")["marker"] == "execution environment"  # the others serve
