"""Triton's own QA python models (`tests/triton_qa/python_models/`, copied unmodified from
qa/L0_backend_python of tritonserver 2.51), run on real Triton and on ours with the requests their
QA tests send, expecting what those tests assert.

`argument_validation` runs a unittest suite inside `execute` (`unittest.main("model", exit=False)`,
which reads `sys.argv`: Triton's embedded interpreter gives [""]) checking that pb_utils refuses
wrong argument types with TypeError, as pybind11 does for Triton's C++ classes, and bad values with
TritonModelException; it answers 1.0 when every case passed (argument_validation/test.sh)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from reference_server.server import running_server
from tests.servers import loopback_config, running_triton

pytestmark = [pytest.mark.integration, pytest.mark.peers]

QA_MODELS = Path(__file__).parent.parent / "triton_qa" / "python_models"
MODELS = ("argument_validation",)


@pytest.fixture(scope="module")
def urls(peers: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """{"triton": grpc url, "ours": grpc url}, both serving one copy of the QA models."""
    root = tmp_path_factory.mktemp("triton_qa") / "models"
    for name in MODELS:
        (root / name / "1").mkdir(parents=True)
        shutil.copy(QA_MODELS / name / "config.pbtxt", root / name / "config.pbtxt")
        shutil.copy(QA_MODELS / name / "model.py", root / name / "1" / "model.py")
    with running_triton(peers, root, auto_complete=False) as triton, running_server(loopback_config(root)) as ours:
        yield {"triton": triton.grpc_url, "ours": f"{ours.config.host}:{ours.grpc_port}"}


@pytest.mark.parametrize("server", ["triton", "ours"])
def test_argument_validation_passes_its_own_unittests(urls: dict[str, str], server: str) -> None:
    client = grpcclient.InferenceServerClient(urls[server])
    try:
        result = client.infer("argument_validation", [])
    finally:
        client.close()
    assert result.as_numpy("OUTPUT0").astype(np.float32).tolist() == [1.0]
