"""What a load reads from a model folder: which config file, a missing one with auto-complete off, and
the backend Triton picks from the model file's name."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from reference_server.core.model_config import parse_config_text
from reference_server.core.model_source import config_path, fill_backend, read_model_config
from reference_server.core.repository import ModelRepository
from reference_server.errors import ModelConfigError


def _folder(root: Path, *files: str) -> Path:
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("max_batch_size: 2\n" if name.endswith(".pbtxt") else "")
    return root


def test_model_config_name_picks_configs_name_pbtxt_where_it_exists(tmp_path: Path) -> None:
    both = _folder(tmp_path / "both", "config.pbtxt", "configs/alt.pbtxt")
    only_default = _folder(tmp_path / "default", "config.pbtxt")
    assert config_path(both, "alt") == both / "configs" / "alt.pbtxt"
    assert config_path(both, None) == both / "config.pbtxt"
    assert config_path(only_default, "alt") == only_default / "config.pbtxt"


def test_a_folder_without_config_reads_as_none_unless_auto_complete_is_off(tmp_path: Path) -> None:
    folder = _folder(tmp_path / "m", "1/model.py")
    assert read_model_config(folder) is None
    with pytest.raises(ModelConfigError) as caught:
        read_model_config(folder, config_name="alt", auto_complete=False)
    message = str(caught.value)
    assert message.startswith(f"{folder / 'config.pbtxt'}: no model configuration file (nor configs/alt.pbtxt)")
    assert "--disable-auto-complete-config" in message


def test_a_config_file_that_does_not_parse_names_the_file(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    (folder / "configs").mkdir(parents=True)
    (folder / "configs" / "alt.pbtxt").write_text("max_batch_size: [\n")
    with pytest.raises(ModelConfigError, match="alt.pbtxt"):
        read_model_config(folder, config_name="alt")


@pytest.mark.parametrize(
    ("files", "backend"),
    [
        (["1/model.py"], "python"),
        (["1/model.onnx"], "onnxruntime"),
        (["1/model.onnx", "1/model.py"], "onnxruntime"),  # Triton looks for ONNX first
        (["10/model.py", "9/model.onnx"], "python"),  # the first folder by name: "10"
        (["1/weights.bin"], None),
    ],
)
def test_the_backend_comes_from_the_model_file_in_the_first_version_folder(
    tmp_path: Path, files: list[str], backend: str | None
) -> None:
    folder = _folder(tmp_path / "m", *files)
    filled = fill_backend(None, folder)
    assert (filled.backend if filled is not None else None) == backend


def test_a_named_backend_or_filename_wins_and_the_given_config_is_not_changed(tmp_path: Path) -> None:
    folder = _folder(tmp_path / "m", "1/model.onnx")
    named = parse_config_text('backend: "python"\n', folder / "config.pbtxt")
    filled = fill_backend(named, folder)
    assert filled is not None and (filled.backend, filled.default_model_filename) == ("python", "model.py")
    assert named.default_model_filename == ""
    onnx = parse_config_text('platform: "onnxruntime_onnx"\n', folder / "config.pbtxt")
    assert fill_backend(onnx, folder) is onnx
    by_name = parse_config_text('default_model_filename: "model.py"\n', folder / "config.pbtxt")
    filled = fill_backend(by_name, folder)
    assert filled is not None and filled.backend == "python"
    assert by_name.backend == ""  # a load override is kept as the client gave it
    other_name = parse_config_text('default_model_filename: "net.bin"\n', folder / "config.pbtxt")
    assert fill_backend(other_name, folder) is other_name


async def test_an_onnx_folder_without_config_loads_unless_auto_complete_is_off(
    demo_repository: Path, tmp_path: Path
) -> None:
    root = tmp_path / "models"
    shutil.copytree(demo_repository / "identity", root / "identity")
    (root / "identity" / "config.pbtxt").unlink()
    for auto_complete in (True, False):
        repository = ModelRepository(root, auto_complete_config=auto_complete)
        try:
            if auto_complete:
                await repository.load("identity")
                assert repository.get("identity").config.backend == "onnxruntime"
            else:
                with pytest.raises(ModelConfigError, match="failed to load 'identity', failed to poll from model"):
                    await repository.load("identity")
        finally:
            await repository.close(0)


async def test_a_python_version_folder_without_model_py_fails_in_tritons_words(tmp_path: Path) -> None:
    root = tmp_path / "models"
    (root / "nomodel" / "1").mkdir(parents=True)
    (root / "nomodel" / "config.pbtxt").write_text(
        'backend: "python"\n'
        'input [ { name: "I" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "O" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
    )
    repository = ModelRepository(root)
    try:
        with pytest.raises(ModelConfigError) as caught:
            await repository.load("nomodel")
    finally:
        await repository.close(0)
    words = (
        f"Failed to preinitialize Python stub: Python model file not found in '{root / 'nomodel' / '1' / 'model.py'}'"
    )
    prefix = "load failed for model 'nomodel': version 1 is at UNAVAILABLE state: "
    assert str(caught.value).startswith(prefix) and words in str(caught.value)
