"""--server-name: the name the server metadata reports (ours by default; 'triton' for clients that
look for Triton by name), over both front ends' shared data plane."""

from __future__ import annotations

from pathlib import Path

import pytest

from reference_server.config import config_from_args
from reference_server.core.dataplane import SERVER_NAME, DataPlane
from reference_server.core.repository import ModelRepository


def test_the_default_stays_ours(tmp_path: Path) -> None:
    config = config_from_args(["--model-repository", str(tmp_path)])
    assert config.server_name == SERVER_NAME == "perfkit-reference-server"
    assert DataPlane(ModelRepository(tmp_path)).server_metadata()["name"] == SERVER_NAME


def test_the_flag_sets_the_metadata_name(tmp_path: Path) -> None:
    config = config_from_args(["--model-repository", str(tmp_path), "--server-name", "triton"])
    plane = DataPlane(ModelRepository(tmp_path), server_name=config.server_name)
    metadata = plane.server_metadata()
    assert metadata["name"] == "triton" and "binary_tensor_data" in metadata["extensions"]


def test_an_empty_name_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        config_from_args(["--model-repository", str(tmp_path), "--server-name", " "])
    assert "--server-name must not be empty" in capsys.readouterr().err
