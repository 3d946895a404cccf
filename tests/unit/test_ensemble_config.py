"""An ensemble's config is checked as Triton checks it, in Triton's words plus the step at fault,
and its plan prunes the steps that requested outputs do not need."""

from __future__ import annotations

from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from reference_server.core.ensemble.config import Step, check_composing, ensemble_plan
from reference_server.core.model_config import parse_config_text
from reference_server.errors import ModelConfigError

PATH = Path("models/ens/config.pbtxt")


def step(model: str, source: str, target: str) -> str:
    return (
        f'{{ model_name: "{model}" model_version: -1 input_map {{ key: "X" value: "{source}" }} '
        f'output_map {{ key: "Y" value: "{target}" }} }}'
    )


def ensemble(*steps: str, outputs: str = "OUT", extra: str = "") -> mc.ModelConfig:
    tensors = ", ".join(f'{{ name: "{o}" data_type: TYPE_FP32 dims: [ -1 ] }}' for o in outputs.split(","))
    text = (
        'name: "ens"\nplatform: "ensemble"\nmax_batch_size: 8\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        f"output [ {tensors} ]\nensemble_scheduling {{ step [ {', '.join(steps)} ] }}\n{extra}"
    )
    return parse_config_text(text, PATH)


def composing(data_type: str = "TYPE_FP32", dims: str = "[ -1 ]", max_batch_size: int = 8) -> mc.ModelConfig:
    return parse_config_text(
        f'name: "m"\nbackend: "onnxruntime"\nmax_batch_size: {max_batch_size}\n'
        f'input [ {{ name: "X" data_type: TYPE_FP32 dims: [ -1 ] }} ]\n'
        f'output [ {{ name: "Y" data_type: {data_type} dims: {dims} }} ]\n',
        PATH,
    )


@pytest.mark.parametrize(
    ("config", "words"),
    [
        (ensemble(step("a", "IN", "OUT"), extra="instance_group [ { count: 1 } ]"),
         "instance group should not be specified for ensemble 'ens'"),
        (ensemble(extra=""), "must specify 'step' for ensemble 'ens'"),
        (ensemble(step("a", "IN", "OUT"), step("b", "IN", "OUT")),
         "ensemble tensor 'OUT' can appear in an output map only once for ensemble 'ens' step 1"),
        (ensemble(step("a", "IN", "mid"), step("b", "IN", "OUT")),
         "ensemble tensor 'mid' is unused in ensemble 'ens': step 0 (model 'a') writes it, no step reads it"),
        (ensemble(step("a", "IN", "OUT"), outputs="OUT,NEVER"),
         "ensemble output 'NEVER' for ensemble ens' is not used"),
        (ensemble(step("a", "mid", "OUT"), step("b", "OUT", "mid")),
         "ensemble input 'IN' for ensemble ens' is not used"),
    ],
)  # fmt: skip
def test_refused_from_the_config_alone(config: mc.ModelConfig, words: str) -> None:
    with pytest.raises(ModelConfigError) as info:
        ensemble_plan(config, PATH)
    assert words in str(info.value) and str(PATH) in str(info.value)


def test_a_step_without_output_map_is_named_by_index() -> None:
    config = ensemble(step("a", "IN", "OUT"), '{ model_name: "b" input_map { key: "X" value: "IN" } }')
    with pytest.raises(ModelConfigError, match="must specify 'output_map' in step 1 of ensemble 'ens'"):
        ensemble_plan(config, PATH)


def test_plan_prunes_steps_no_requested_output_needs() -> None:
    plan = ensemble_plan(
        ensemble(step("a", "IN", "mid"), step("b", "mid", "A"), step("c", "IN", "B"), outputs="A,B"), PATH
    )
    assert [s.model_name for s in plan.needed_steps(["A"])] == ["a", "b"]
    assert [s.model_name for s in plan.needed_steps(["B"])] == ["c"]
    assert [s.model_name for s in plan.needed_steps(["A", "B"])] == ["a", "b", "c"]
    assert plan.composing_models() == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("model", "words"),
    [
        (composing(data_type="TYPE_INT64"),
         "in ensemble ens, ensemble tensor OUT: inconsistent data type: TYPE_FP32 is inferred from model ens while "
         "TYPE_INT64 is inferred from model a"),
        (composing(dims="[ 3, 4 ]"),
         "in ensemble ens, ensemble tensor OUT: inconsistent shape: [-1,-1] is inferred from model ens while "
         "[-1,3,4] is inferred from model a"),
        (composing(max_batch_size=4),
         "ensemble ens allows maximum batch size 8, but it contains model a which only allows maximum batch size "
         "to be 4"),
    ],
)  # fmt: skip
def test_refused_against_the_composing_models(model: mc.ModelConfig, words: str) -> None:
    plan = ensemble_plan(ensemble(step("a", "IN", "OUT")), PATH)

    def lookup(s: Step) -> mc.ModelConfig:
        return model

    with pytest.raises(ModelConfigError) as info:
        check_composing(ensemble(step("a", "IN", "OUT")), plan, lookup, PATH)
    assert words in str(info.value)
    assert "(step 0 (model 'a') of ensemble 'ens')" in str(info.value)


def decoupled(config: mc.ModelConfig) -> mc.ModelConfig:
    config.model_transaction_policy.decoupled = True
    return config


JOIN = parse_config_text(
    'name: "join"\nbackend: "onnxruntime"\nmax_batch_size: 8\n'
    'input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "Z" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
    'output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]\n',
    PATH,
)


def join(first: str, second: str, target: str) -> str:
    return (
        f'{{ model_name: "join" input_map {{ key: "X" value: "{first}" }} input_map {{ key: "Z" value: "{second}" }} '
        f'output_map {{ key: "Y" value: "{target}" }} }}'
    )


def test_the_steps_after_a_decoupled_step_and_the_decoupled_models_found() -> None:
    config = ensemble(step("d", "IN", "mid"), step("b", "mid", "OUT"))
    models = {"d": decoupled(composing()), "b": composing()}
    assert check_composing(config, ensemble_plan(config, PATH), lambda s: models[s.model_name], PATH) == {"d"}
    assert check_composing(config, ensemble_plan(config, PATH), lambda s: composing(), PATH) == frozenset()


@pytest.mark.parametrize(
    ("steps", "outputs", "words"),
    [
        # A step that joins a decoupled step's tensor with one from elsewhere (as tritonserver 2.51 words it).
        ((step("d", "IN", "mid"), join("mid", "IN", "OUT")), "OUT",
         "in ensemble ens, step of model 'join' receives inputs originated from different decoupled models "
         "(step 1 (model 'join') of ensemble 'ens')"),
        ((step("d", "IN", "A"), step("e", "IN", "B")), "A,B",
         "in ensemble ens, step of model 'ens' receives inputs originated from different decoupled models"),
    ],
)  # fmt: skip
def test_inputs_from_different_decoupled_steps_are_refused(steps: tuple[str, ...], outputs: str, words: str) -> None:
    config = ensemble(*steps, outputs=outputs)
    models = {"d": decoupled(composing()), "e": decoupled(composing()), "join": JOIN}
    with pytest.raises(ModelConfigError) as info:
        check_composing(config, ensemble_plan(config, PATH), lambda s: models[s.model_name], PATH)
    assert words in str(info.value)
