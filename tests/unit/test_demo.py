"""The demo model repository: built locally, valid ONNX, consistent configs, cached once."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from reference_server.backends.onnxruntime import signature_from_session
from reference_server.core.model_config import complete_config, read_config
from v2kit import demo

# name → (input shape for a batch of 3, output shape, config input dims, max_batch_size,
#          dynamic batching delay or None for no dynamic batching)
EXPECTED = {
    "mlp": ((3, 256), (3, 10), [256], 64, 100),
    "convnet": ((3, 1, 28, 28), (3, 10), [1, 28, 28], 32, 0),
    "identity": ((3, 7), (3, 7), [-1], 8, None),
    "preprocess": ((3, 256), (3, 256), [256], 64, 100),
}


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo.build_demo_repository(tmp_path_factory.mktemp("demo"))


def test_layout(repository: Path) -> None:
    files = sorted(str(p.relative_to(repository)) for p in repository.rglob("*") if p.is_file())
    assert files == [
        "convnet/1/model.onnx",
        "convnet/config.pbtxt",
        "identity/1/model.onnx",
        "identity/config.pbtxt",
        "mlp/1/model.onnx",
        "mlp/config.pbtxt",
        "mlp_pipeline/config.pbtxt",
        "preprocess/1/model.onnx",
        "preprocess/config.pbtxt",
        "python_linear/1/bias.npy",
        "python_linear/1/model.py",
        "python_linear/1/weights.npy",
        "python_linear/config.pbtxt",
    ]
    assert (repository / "mlp_pipeline" / "1").is_dir()  # empty, as Triton wants for an ensemble
    assert (repository / "mlp" / "1" / "model.onnx").stat().st_size < 6_000_000


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_model_runs_and_matches_its_config(repository: Path, name: str) -> None:
    in_shape, out_shape, input_dims, max_batch_size, delay_us = EXPECTED[name]
    path = repository / name / "1" / "model.onnx"
    model = onnx.load(path)
    onnx.checker.check_model(model, full_check=True)
    assert model.opset_import[0].version == demo.OPSET and model.ir_version == demo.IR_VERSION

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal(in_shape).astype(np.float32)
    (y,) = session.run(["OUTPUT0"], {"INPUT0": x})
    assert y.shape == out_shape and y.dtype == np.float32
    assert np.isfinite(y).all()
    # Not degenerate: outputs vary across the batch and within a row.
    assert not np.allclose(y[0], y[1]) and np.std(y[0]) > 1e-3

    config = complete_config(
        read_config(repository / name),
        *signature_from_session(session),
        model_name=name,
        config_path=repository / name / "config.pbtxt",
        model_path=path,
    )
    assert config.max_batch_size == max_batch_size
    assert [(t.name, list(t.dims)) for t in config.input] == [("INPUT0", input_dims)]
    assert config.HasField("dynamic_batching") == (delay_us is not None)
    if delay_us is not None:
        assert config.dynamic_batching.max_queue_delay_microseconds == delay_us
    assert [g.count for g in config.instance_group] == [1]
    assert "intra_op_thread_count" not in config.parameters


def test_build_is_deterministic(repository: Path, tmp_path: Path) -> None:
    again = demo.build_demo_repository(tmp_path / "again")
    for name in EXPECTED:
        for relative in (f"{name}/1/model.onnx", f"{name}/config.pbtxt"):
            assert (again / relative).read_bytes() == (repository / relative).read_bytes()


def test_ensure_demo_repository_builds_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PERFKIT_CACHE_DIR", str(tmp_path))
    first = demo.ensure_demo_repository()
    assert first == tmp_path / f"demo-models-v{demo.BUILDER_VERSION}"
    assert (first / "mlp" / "1" / "model.onnx").is_file()

    def fail(dest: Path) -> Path:
        raise AssertionError("rebuilt a cached repository")

    monkeypatch.setattr(demo, "build_demo_repository", fail)
    assert demo.ensure_demo_repository() == first
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no staging folders left behind


def test_ensure_demo_repository_loses_a_race_cleanly(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PERFKIT_CACHE_DIR", str(tmp_path))
    target = tmp_path / f"demo-models-v{demo.BUILDER_VERSION}"
    build = demo.build_demo_repository

    def build_while_another_process_finishes(dest: Path, *, genai: bool = False) -> Path:
        build(target)  # the other process's build lands first
        return build(dest, genai=genai)

    monkeypatch.setattr(demo, "build_demo_repository", build_while_another_process_finishes)
    assert demo.ensure_demo_repository() == target
    assert [p.name for p in tmp_path.iterdir()] == [target.name]


def test_main_builds_into_dest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.main([str(tmp_path / "repo")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "repo")
    assert (tmp_path / "repo" / "identity" / "config.pbtxt").is_file()


def test_genai_models_are_built_only_when_asked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.main([str(tmp_path / "plain")]) == 0
    assert not (tmp_path / "plain" / "sim_llm").exists()
    assert demo.main([str(tmp_path / "genai"), "--genai"]) == 0
    for name, files in (
        ("sim_llm", {"model.py", "llm_io.py", "pb_io.py", "sim_engine.py"}),
        ("tiny_decoder", {"model.py", "llm_io.py", "pb_io.py", "model.onnx"}),
    ):
        folder = tmp_path / "genai" / name
        assert {p.name for p in (folder / "1").iterdir()} == files
        assert "decoupled: true" in (folder / "config.pbtxt").read_text()
