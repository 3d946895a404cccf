"""model_warmup: samples built as Triton builds them, run on every instance, failures fail the load."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from reference_server.backends.warmup import run_warmup
from reference_server.core import repository as repository_module
from reference_server.core.model_config import parse_config_text
from reference_server.core.repository import ModelRepository
from reference_server.errors import ModelConfigError

MLP = """
name: "mlp"
max_batch_size: 64
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 256 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 10 ] } ]
"""

UNBATCHED = """
name: "flat"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]
"""


class FakeInstance:
    """Records what it was asked to run; raises `error` if given."""

    def __init__(self, name: str = "fake_0", error: Exception | None = None) -> None:
        self.name = name
        self.error = error
        self.calls: list[dict[str, np.ndarray]] = []

    def run(self, inputs: dict[str, np.ndarray], output_names: Sequence[str]) -> dict[str, np.ndarray]:
        self.calls.append({name: array.copy() for name, array in inputs.items()})
        if self.error is not None:
            raise self.error
        return {}


def config_with(base: str, warmup: str) -> mc.ModelConfig:
    return parse_config_text(base + warmup, Path("config.pbtxt"))


def fp32_input(source: str, dims: str = "[ 256 ]") -> str:
    return f'inputs {{ key: "INPUT0" value {{ data_type: TYPE_FP32 dims: {dims} {source} }} }}'


def test_zero_data_runs_count_times_on_every_instance_with_a_batch_dimension(tmp_path: Path) -> None:
    config = config_with(
        MLP, f'model_warmup [ {{ name: "zeros" batch_size: 4 count: 3 {fp32_input("zero_data: true")} }} ]'
    )
    instances = [FakeInstance("a"), FakeInstance("b")]
    assert run_warmup(config, instances, tmp_path) == 6
    for instance in instances:
        assert len(instance.calls) == 3
        for call in instance.calls:
            assert call["INPUT0"].shape == (4, 256) and call["INPUT0"].dtype == np.float32
            assert not call["INPUT0"].any()


def test_count_zero_runs_once_and_batch_size_zero_is_skipped(tmp_path: Path) -> None:
    config = config_with(
        MLP,
        f'model_warmup [ {{ name: "once" batch_size: 1 {fp32_input("random_data: true")} }},'
        f' {{ name: "skipped" batch_size: 0 {fp32_input("zero_data: true")} }} ]',
    )
    instance = FakeInstance()
    assert run_warmup(config, [instance], tmp_path) == 1
    (call,) = instance.calls
    data = call["INPUT0"]
    assert data.shape == (1, 256) and data.dtype == np.float32
    assert np.all((data >= 0) & (data < 1)) and data.std() > 0  # random, finite, no NaN


def test_input_data_file_is_one_sample_repeated_over_the_batch(tmp_path: Path) -> None:
    sample = np.arange(256, dtype="<f4")
    (tmp_path / "warmup").mkdir()
    # Longer than needed: Triton uses the first bytes.
    (tmp_path / "warmup" / "sample.bin").write_bytes(sample.tobytes() + b"extra")
    source = fp32_input('input_data_file: "sample.bin"')
    config = config_with(MLP, f'model_warmup [ {{ name: "file" batch_size: 3 {source} }} ]')
    instance = FakeInstance()
    run_warmup(config, [instance], tmp_path)
    np.testing.assert_array_equal(instance.calls[0]["INPUT0"], np.stack([sample] * 3))


def test_unbatched_model_runs_the_sample_batch_size_times(tmp_path: Path) -> None:
    warmup = (
        'model_warmup [ { name: "w" batch_size: 2 count: 2 '
        'inputs { key: "INPUT0" value { data_type: TYPE_INT32 dims: [ 5 ] random_data: true } } } ]'
    )
    instance = FakeInstance()
    assert run_warmup(config_with(UNBATCHED, warmup), [instance], tmp_path) == 4
    for call in instance.calls:
        assert call["INPUT0"].shape == (5,) and call["INPUT0"].dtype == np.int32
        assert call["INPUT0"].min() >= 0 and call["INPUT0"].max() < 100


@pytest.mark.parametrize(
    ("inputs", "batch_size", "fragment"),
    [
        (fp32_input("zero_data: true", "[ -1 ]"), 1, "must all be concrete"),
        (fp32_input("zero_data: true", "[ 16, 16 ]"), 1, "do not fit the input's dims [256]"),
        (fp32_input("zero_data: true", "[ 300 ]"), 1, "do not fit the input's dims [256]"),
        (fp32_input("zero_data: true"), 65, "larger than max_batch_size 64"),
        (fp32_input(""), 1, "set one of zero_data, random_data or input_data_file"),
        ('inputs { key: "INPUT1" value { data_type: TYPE_FP32 dims: [ 256 ] zero_data: true } }', 1, "not an input"),
        ('inputs { key: "INPUT0" value { data_type: TYPE_INT64 dims: [ 256 ] zero_data: true } }', 1, "TYPE_INT64"),
        ("", 1, "gives no data for model input(s) ['INPUT0']"),
        (fp32_input('input_data_file: "missing.bin"'), 1, "cannot read input_data_file"),
        (fp32_input('input_data_file: "short.bin"'), 1, "need 1024 bytes"),
        (fp32_input('input_data_file: "../config.pbtxt"'), 1, "must name a file inside"),
        (fp32_input('input_data_file: "/etc/hostname"'), 1, "must name a file inside"),
        (fp32_input('input_data_file: "link.bin"'), 1, "must name a file inside"),
        (fp32_input('input_data_file: ""'), 1, "must name a file inside"),
    ],
)
def test_bad_warmup_fails_naming_model_and_entry(tmp_path: Path, inputs: str, batch_size: int, fragment: str) -> None:
    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup" / "short.bin").write_bytes(b"\0" * 1000)
    (tmp_path / "config.pbtxt").write_text(MLP)
    (tmp_path / "outside.bin").write_bytes(b"\0" * 1024)
    (tmp_path / "warmup" / "link.bin").symlink_to(tmp_path / "outside.bin")
    config = config_with(MLP, f'model_warmup [ {{ name: "w" batch_size: {batch_size} {inputs} }} ]')
    instance = FakeInstance()
    with pytest.raises(ModelConfigError) as info:
        run_warmup(config, [instance], tmp_path)
    message = str(info.value)
    assert "model 'mlp' model_warmup 'w'" in message and fragment in message
    assert instance.calls == []  # samples are checked before anything runs


def test_a_run_error_names_the_instance(tmp_path: Path) -> None:
    config = config_with(MLP, f"model_warmup [ {{ batch_size: 2 {fp32_input('zero_data: true')} }} ]")
    with pytest.raises(ModelConfigError, match=r"model 'mlp' model_warmup '0': warmup failed on instance 'b': "):
        run_warmup(config, [FakeInstance("a"), FakeInstance("b", RuntimeError("device lost"))], tmp_path)


# --- with onnxruntime, through the repository ---------------------------------------------------------


def identity_repository(demo_repository: Path, tmp_path: Path, warmup: str, count: int = 1) -> Path:
    root = tmp_path / "models"
    shutil.copytree(demo_repository / "identity", root / "identity")
    config = root / "identity" / "config.pbtxt"
    text = config.read_text().replace("instance_group [ { count: 1 } ]", f"instance_group [ {{ count: {count} }} ]")
    config.write_text(text + warmup)
    return root


async def test_ready_only_after_warmup_and_warmup_is_not_counted(
    demo_repository: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    warmup = (
        'model_warmup [ { name: "w" batch_size: 8 count: 3 '
        'inputs { key: "INPUT0" value { data_type: TYPE_FP32 dims: [ 16 ] random_data: true } } } ]'
    )
    repository = ModelRepository(identity_repository(demo_repository, tmp_path, warmup, count=2))
    observed: list[Any] = []

    def watched(config: mc.ModelConfig, instances: Sequence[Any], model_dir: Path) -> int:
        ready_before = repository.is_ready("identity")
        runs = run_warmup(config, instances, model_dir)
        observed.append((ready_before, len(instances), runs))
        return runs

    monkeypatch.setattr(repository_module, "run_warmup", watched)
    try:
        await repository.load("identity")
        assert observed == [(False, 2, 6)]  # 3 iterations on each of 2 instances, before ready
        assert repository.is_ready("identity")
        stats = repository.get("identity").stats.to_dict("identity", "1")
        # Triton does not count warmup in the statistics.
        assert stats["execution_count"] == 0 and stats["inference_count"] == 0
        assert stats["inference_stats"]["success"]["count"] == 0 and stats["batch_stats"] == []
    finally:
        await repository.close(0)


async def test_failed_warmup_fails_the_load(demo_repository: Path, tmp_path: Path) -> None:
    warmup = (
        'model_warmup [ { name: "from_file" batch_size: 1 '
        'inputs { key: "INPUT0" value { data_type: TYPE_FP32 dims: [ 4 ] input_data_file: "nope.bin" } } } ]'
    )
    repository = ModelRepository(identity_repository(demo_repository, tmp_path, warmup))
    try:
        with pytest.raises(ModelConfigError, match=r"model 'identity' model_warmup 'from_file'.*nope\.bin"):
            await repository.load("identity")
        assert not repository.is_ready("identity")
        (entry,) = repository.index()
        assert entry["state"] == "UNAVAILABLE" and "from_file" in entry["reason"]
    finally:
        await repository.close(0)


def test_hostile_counts_and_sizes_are_refused_before_anything_runs(tmp_path: Path) -> None:
    instance = FakeInstance()
    many = config_with(
        MLP, f'model_warmup [ {{ name: "many" batch_size: 1 count: 1000000 {fp32_input("zero_data: true")} }} ]'
    )
    with pytest.raises(ModelConfigError, match=r"'many'.*1000000 warmup runs"):
        run_warmup(many, [instance], tmp_path)
    huge = config_with(
        UNBATCHED,
        'model_warmup [ { name: "huge" batch_size: 1 inputs { key: "INPUT0" value { data_type: TYPE_INT32 '
        "dims: [ 1000000000 ] zero_data: true } } } ]",
    )
    with pytest.raises(ModelConfigError, match=r"'huge'.*over \d+ elements"):
        run_warmup(huge, [instance], tmp_path)
    assert instance.calls == []
