"""instance_group expands into instances placed as Triton places them, by the backend the config names."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from reference_server.backends import instance_factory, onnxruntime, python
from reference_server.backends.placement import Placement, plan_instances, show_placed_kinds
from reference_server.errors import ModelConfigError

CONFIG = Path("models/m/config.pbtxt")


def plan(text: str, gpus: int) -> list[Placement]:
    config = text_format.Parse('name: "m"\n' + text, mc.ModelConfig())
    return plan_instances(config, gpus, CONFIG)


def devices(placements: list[Placement]) -> list[tuple[str, int | None]]:
    return [(p.device, p.gpu) for p in placements]


def test_no_group_is_one_instance_on_gpu_when_present_else_cpu() -> None:
    assert devices(plan("", 0)) == [("CPU", None)]
    assert devices(plan("", 2)) == [("GPU", 0), ("GPU", 1)]


def test_count_is_per_listed_gpu() -> None:
    placements = plan(
        "instance_group [ { count: 1, kind: KIND_GPU, gpus: [0] }, { count: 2, kind: KIND_GPU, gpus: [1, 2] } ]", 3
    )
    assert devices(placements) == [("GPU", 0), ("GPU", 1), ("GPU", 1), ("GPU", 2), ("GPU", 2)]
    # Triton names an instance within its group, the same on each of the group's GPUs.
    assert [p.name for p in placements] == ["m_0_0", "m_1_0", "m_1_1", "m_1_0", "m_1_1"]


@pytest.mark.parametrize(
    ("text", "names"),
    [
        # As tritonserver 2.51 names them in "Failed to process the request(s) for model '...'".
        ("", ["m_0"]),
        ("instance_group [ { count: 1, kind: KIND_CPU } ]", ["m_0_0"]),
        ("instance_group [ { count: 2, kind: KIND_CPU } ]", ["m_0_0", "m_0_1"]),
        ('instance_group [ { name: "grp", count: 2, kind: KIND_CPU } ]', ["grp_0", "grp_1"]),
        ("instance_group [ { count: 1, kind: KIND_CPU }, { count: 2, kind: KIND_CPU } ]", ["m_0_0", "m_1_0", "m_1_1"]),
    ],
)
def test_instances_are_named_as_triton_names_them(text: str, names: list[str]) -> None:
    assert [p.name for p in plan(text, 0)] == names


def test_gpu_group_without_gpus_uses_every_gpu() -> None:
    assert devices(plan("instance_group [ { count: 2, kind: KIND_GPU } ]", 2)) == [
        ("GPU", 0),
        ("GPU", 0),
        ("GPU", 1),
        ("GPU", 1),
    ]


def test_cpu_groups_and_mixed_groups() -> None:
    assert devices(plan("instance_group [ { count: 3, kind: KIND_CPU } ]", 1)) == [("CPU", None)] * 3
    mixed = plan("instance_group [ { count: 1, kind: KIND_CPU }, { count: 1, kind: KIND_GPU, gpus: [0] } ]", 1)
    assert devices(mixed) == [("CPU", None), ("GPU", 0)]


def test_auto_kind_falls_back_to_cpu_when_a_listed_gpu_is_missing() -> None:
    assert devices(plan("instance_group [ { count: 1, gpus: [3] } ]", 1)) == [("CPU", None)]


def test_kind_gpu_without_gpu_names_the_file_and_the_fix() -> None:
    with pytest.raises(ModelConfigError, match=r"models/m/config\.pbtxt.*KIND_GPU but no GPU.*KIND_CPU"):
        plan("instance_group [ { count: 1, kind: KIND_GPU } ]", 0)


def test_listed_gpu_that_does_not_exist_is_refused() -> None:
    with pytest.raises(ModelConfigError, match=r"lists GPU\(s\) \[2\] but only 2 GPU"):
        plan("instance_group [ { kind: KIND_GPU, gpus: [0, 2] } ]", 2)


def test_an_instance_count_past_the_limit_is_refused() -> None:
    with pytest.raises(ModelConfigError, match=r"count 100000 is over the limit"):
        plan("instance_group [ { count: 100000, kind: KIND_CPU } ]", 0)


@pytest.mark.parametrize(
    "text", ["", 'backend: "onnxruntime"', 'platform: "onnxruntime_onnx"', 'backend: "tensorrt"', 'platform: "x"']
)
def test_the_backend_is_chosen_by_backend_then_platform(text: str) -> None:
    # Unknown ones go to ONNX Runtime too, whose config completion refuses them naming the files.
    assert instance_factory(text_format.Parse(text, mc.ModelConfig())) is onnxruntime.create_instances


def test_python_models_get_the_python_backend() -> None:
    assert instance_factory(text_format.Parse('backend: "python"', mc.ModelConfig())) is python.create_instances


def test_gpus_a_backend_cannot_use_count_as_none_and_kind_gpu_says_why() -> None:
    why = "onnxruntime 1.0 here has no CUDA execution provider (pip install onnxruntime-gpu)"
    config = text_format.Parse('name: "m" instance_group [ { count: 2 } ]', mc.ModelConfig())
    assert devices(plan_instances(config, 1, CONFIG, why)) == [("CPU", None), ("CPU", None)]
    gpu = text_format.Parse('name: "m" instance_group [ { count: 1, kind: KIND_GPU } ]', mc.ModelConfig())
    with pytest.raises(ModelConfigError, match=r"asks for KIND_GPU but onnxruntime 1\.0 here has no CUDA"):
        plan_instances(gpu, 1, CONFIG, why)


@pytest.mark.parametrize(
    ("gpus", "shown"),
    [(0, [("KIND_CPU", []), ("KIND_CPU", [])]), (2, [("KIND_GPU", [0, 1]), ("KIND_CPU", [])])],
)
def test_the_config_shows_the_kind_a_kind_auto_group_was_placed_with(
    gpus: int, shown: list[tuple[str, list[int]]]
) -> None:
    # As Triton's config endpoint shows them: KIND_AUTO resolved, a GPU group's GPUs listed.
    text = 'name: "m"\ninstance_group [ { kind: KIND_AUTO count: 2 }, { kind: KIND_CPU } ]\n'
    config = text_format.Parse(text, mc.ModelConfig())
    show_placed_kinds(config, plan_instances(config, gpus, CONFIG))
    assert [(mc.ModelInstanceGroup.Kind.Name(g.kind), list(g.gpus)) for g in config.instance_group] == shown
