"""An ensemble's configuration: its steps as a plan, checked as Triton checks it, in Triton's words.

A model with `platform: "ensemble"` names no model file and has no instances: its
`ensemble_scheduling { step [...] }` maps ensemble tensors (its own inputs and outputs, and
intermediate names) onto the inputs and outputs of composing models. Triton checks it twice, and so
do we:

1. `ensemble_plan`, from the config alone (Triton's `ValidateEnsembleSchedulingConfig`): no
   instance_group, optimization or model_warmup; every step names a model, an input_map and an
   output_map; a tensor is written by one step only; every output can be computed from the inputs
   ("is not written: ... is not connected", which is what a cycle or a tensor nobody writes gives);
   every other tensor is read by some step. Where Triton's message names no step, ours adds which
   step reads the missing tensor or which steps form the cycle.
2. `check_composing`, once the composing models are loaded (Triton's `ValidateEnsembleConfig`):
   the mapped names exist in each composing model, every required input is mapped once, the
   datatypes and shapes that meet on one ensemble tensor agree (-1 matches anything), and no
   composing model batches less than the ensemble.

Both raise ModelConfigError naming the config file, the ensemble and the step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from reference_server.core import model_config
from reference_server.errors import ModelConfigError

__all__ = [
    "ENSEMBLE_PLATFORM",
    "EnsemblePlan",
    "Step",
    "check_circular",
    "check_composing",
    "complete_ensemble_config",
    "ensemble_plan",
    "ensemble_versions",
    "is_ensemble",
]

ENSEMBLE_PLATFORM = "ensemble"


def is_ensemble(config: mc.ModelConfig | None) -> bool:
    return config is not None and (config.platform == ENSEMBLE_PLATFORM or config.HasField("ensemble_scheduling"))


@dataclass(frozen=True, slots=True)
class Step:
    """One `ensemble_scheduling.step`: which model runs, and its tensors' ensemble names."""

    index: int
    model_name: str
    model_version: int  # -1: the latest ready version
    inputs: tuple[tuple[str, str], ...]  # (composing model input, ensemble tensor)
    outputs: tuple[tuple[str, str], ...]  # (composing model output, ensemble tensor)

    @property
    def version(self) -> str:
        """The version as `ModelRepository.get` takes it: "" for the latest."""
        return "" if self.model_version < 0 else str(self.model_version)

    @property
    def label(self) -> str:
        return f"step {self.index} (model '{self.model_name}')"


@dataclass(frozen=True, slots=True)
class EnsemblePlan:
    name: str
    steps: tuple[Step, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]

    def composing_models(self) -> list[str]:
        """The composing models' names, in step order, once each."""
        return list(dict.fromkeys(step.model_name for step in self.steps))

    def needed_steps(self, outputs: Iterable[str]) -> tuple[Step, ...]:
        """The steps that `outputs` depend on, in step order (Triton prunes the others)."""
        writer = {tensor: step for step in self.steps for _, tensor in step.outputs}
        needed: set[int] = set()
        todo = list(outputs)
        while todo:
            step = writer.get(todo.pop())
            if step is not None and step.index not in needed:
                needed.add(step.index)
                todo.extend(tensor for _, tensor in step.inputs)
        return tuple(step for step in self.steps if step.index in needed)


def complete_ensemble_config(raw: mc.ModelConfig, name: str, config_path: Path) -> tuple[mc.ModelConfig, EnsemblePlan]:
    """The ensemble's config as Triton completes it (no instances, no backend, the default version
    policy, not decoupled until `check_composing` finds a decoupled step), and its plan, after the
    checks on the config alone."""
    config = mc.ModelConfig()
    config.CopyFrom(raw)
    if config.name and config.name != name:
        raise ModelConfigError(
            f"{config_path}: the configuration's name '{config.name}' does not match the model folder name '{name}'"
        )
    config.name = name
    plan = ensemble_plan(config, config_path)
    if config.version_policy.WhichOneof("policy_choice") is None:
        config.version_policy.latest.num_versions = 1
    config.model_transaction_policy.SetInParent()
    return config, plan


def ensemble_versions(config: mc.ModelConfig, model_dir: Path, config_path: Path) -> list[int]:
    """The versions to serve: Triton wants a version folder even for an ensemble."""
    available = model_config.available_versions(model_dir)
    selected = model_config.select_versions(config, available)
    if not selected:
        raise ModelConfigError(
            f"{config_path}: at least one version must be available under the version policy of model "
            f"'{config.name}' (version folders found: {available or 'none'}; an ensemble's version folder, such as "
            f"{config.name}/1/, may be empty)"
        )
    return selected


def check_circular(
    name: str, steps: Sequence[Step], composing_of: Callable[[str], Sequence[str]], config_path: Path
) -> None:
    """Refuse an ensemble that reaches itself through ensembles (`composing_of(model)`: the models
    an ensemble's steps name, none for other models), before loading any of them: their loads
    would wait for each other."""

    def back_to_name(model: str, seen: set[str]) -> list[str] | None:
        if model == name:
            return [model]
        if model in seen:
            return None
        seen.add(model)
        for composing in composing_of(model):
            found = back_to_name(composing, seen)
            if found:
                return [model, *found]
        return None

    for step in steps:
        path = back_to_name(step.model_name, set())
        if path:
            last = path[-2] if len(path) > 1 else name
            raise ModelConfigError(
                f"{config_path}: circular dependency between ensembles: {name} -> ... -> {last} -> {name} "
                f"({step.label} of ensemble '{name}': {' -> '.join([name, *path])})"
            )


def ensemble_plan(config: mc.ModelConfig, config_path: Path) -> EnsemblePlan:
    """The plan of an ensemble config, after the checks Triton makes on the config alone."""
    name = config.name

    def error(message: str) -> ModelConfigError:
        return ModelConfigError(f"{config_path}: {message}")

    if config.backend:
        raise error(f"Ensemble model '{name}' must have platform type 'ensemble' and empty backend type")
    if config.instance_group:
        raise error(f"instance group should not be specified for ensemble '{name}'")
    if config.HasField("optimization"):
        raise error(f"optimization should not be specified for ensemble '{name}'")
    if config.model_warmup:
        raise error(f"model_warmup can not be specified for ensemble '{name}'")
    if not config.ensemble_scheduling.step:
        raise error(f"must specify 'step' for ensemble '{name}'")
    for tensor in (*config.input, *config.output):
        if tensor.data_type == mc.TYPE_INVALID:
            raise error(
                f"ensemble '{name}': tensor '{tensor.name}' needs a data_type (an ensemble is not auto-completed)"
            )
    inputs = {t.name for t in config.input}
    steps = []
    writer: dict[str, Step] = {}
    for index, raw in enumerate(config.ensemble_scheduling.step):
        for field in ("model_name", "input_map", "output_map"):
            if not getattr(raw, field):
                raise error(f"must specify '{field}' in step {index} of ensemble '{name}'")
        step = Step(
            index, raw.model_name, raw.model_version, tuple(sorted(raw.input_map.items())),
            tuple(sorted(raw.output_map.items())),
        )  # fmt: skip
        for _, tensor in step.outputs:
            if tensor in writer or tensor in inputs:
                raise error(
                    f"ensemble tensor '{tensor}' can appear in an output map only once for ensemble '{name}' "
                    f"step {index}"
                )
            writer[tensor] = step
        steps.append(step)
    plan = EnsemblePlan(name, tuple(steps), tuple(t.name for t in config.input), tuple(t.name for t in config.output))
    _check_data_flow(plan, writer, error)
    return plan


def _check_data_flow(plan: EnsemblePlan, writer: dict[str, Step], error: Callable[[str], ModelConfigError]) -> None:
    name = plan.name
    read = {tensor for step in plan.steps for _, tensor in step.inputs}
    for tensor in plan.inputs:
        if tensor not in read:
            raise error(f"ensemble input '{tensor}' for ensemble {name}' is not used")  # sic: Triton's quote
    ready = set(plan.inputs)
    runnable: set[int] = set()
    progress = True
    while progress:
        progress = False
        for step in plan.steps:
            if step.index not in runnable and all(tensor in ready for _, tensor in step.inputs):
                runnable.add(step.index)
                ready.update(tensor for _, tensor in step.outputs)
                progress = True
    for tensor in plan.outputs:
        if tensor not in writer and tensor not in plan.inputs:
            raise error(f"ensemble output '{tensor}' for ensemble {name}' is not used: no step's output_map writes it")
        if tensor not in ready:
            raise error(
                f"output '{tensor}' for ensemble '{name}' is not written: {_why_not_written(plan, writer, tensor)}"
            )
    for tensor in (*writer, *read):
        if tensor in plan.outputs or tensor in plan.inputs:
            continue
        if tensor not in ready:
            # On no path to an output: Triton calls it unused too.
            why = _why_not_written(plan, writer, tensor) if tensor in writer else f"no step writes '{tensor}'"
            raise error(f"ensemble tensor '{tensor}' is unused in ensemble '{name}': {why}")
        if tensor not in read:
            raise error(
                f"ensemble tensor '{tensor}' is unused in ensemble '{name}': {writer[tensor].label} writes it, "
                "no step reads it"
            )


def _why_not_written(plan: EnsemblePlan, writer: dict[str, Step], output: str) -> str:
    """Triton's "at least one of its depending tensors, 'T', is not connected", and which step
    reads a tensor nobody writes, or which steps wait for each other."""
    inputs = set(plan.inputs)
    path: list[Step] = []
    on_path: set[int] = set()

    def walk(step: Step) -> str | None:
        if step.index in on_path:
            cycle = path[path.index(step) :] + [step]
            steps = " -> ".join(s.label for s in cycle)
            first = next(t for _, t in step.inputs if t in writer and writer[t] in cycle)
            return f"at least one of its depending tensors, '{first}', is not connected: {steps} form a cycle"
        path.append(step)
        on_path.add(step.index)
        for _, tensor in step.inputs:
            if tensor in inputs:
                continue
            source = writer.get(tensor)
            if source is None:
                return (
                    f"at least one of its depending tensors, '{tensor}', is not connected: {step.label} reads "
                    f"'{tensor}', which is neither an ensemble input nor written by any step"
                )
            found = walk(source)
            if found:
                return found
        path.pop()
        on_path.discard(step.index)
        return None

    return walk(writer[output]) or "its steps cannot run"


# --------------------------------------------------------------------------------------------
# Against the composing models' completed configs


@dataclass(frozen=True, slots=True)
class _Tensor:
    """An ensemble tensor as one model sees it (Triton's TensorNode)."""

    model: str
    data_type: int
    dims: tuple[int, ...]
    full_dims: tuple[int, ...]  # with the batch dimension, if the model batches

    @staticmethod
    def of(model: str, batching: bool, data_type: int, dims: Sequence[int]) -> _Tensor:
        return _Tensor(model, data_type, tuple(dims), ((-1,) if batching else ()) + tuple(dims))


def check_composing(
    config: mc.ModelConfig, plan: EnsemblePlan, composing: Callable[[Step], mc.ModelConfig], config_path: Path
) -> frozenset[str]:
    """Check every step against its composing model's completed config (`composing(step)`); returns
    the decoupled composing models (an ensemble with one is decoupled itself, as in Triton)."""
    name = plan.name
    decoupled: set[str] = set()
    batching = config.max_batch_size > 0
    tensors: dict[str, _Tensor] = {}
    for tensor in (*config.input, *config.output):
        tensors[tensor.name] = _Tensor.of(name, batching, tensor.data_type, tensor.dims)

    def error(step: Step, message: str) -> ModelConfigError:
        return ModelConfigError(f"{config_path}: {message} ({step.label} of ensemble '{name}')")

    def meet(step: Step, ensemble_tensor: str, seen: _Tensor) -> None:
        known = tensors.setdefault(ensemble_tensor, seen)
        if known is seen:
            return
        prefix = f"in ensemble {name}, ensemble tensor {ensemble_tensor}: "
        if known.data_type != seen.data_type:
            raise error(
                step,
                f"{prefix}inconsistent data type: {mc.DataType.Name(known.data_type)} is inferred from model "
                f"{known.model} while {mc.DataType.Name(seen.data_type)} is inferred from model {seen.model}",
            )
        if not _dims_match(known.dims, seen.dims) and not _dims_match(known.full_dims, seen.full_dims):
            raise error(
                step,
                f"{prefix}inconsistent shape: {_fmt(known.full_dims)} is inferred from model {known.model} while "
                f"{_fmt(seen.full_dims)} is inferred from model {seen.model}",
            )

    for step in plan.steps:
        model = composing(step)
        model_batching = model.max_batch_size > 0
        if model.max_batch_size != 0 and model.max_batch_size < config.max_batch_size:
            raise error(
                step,
                f"ensemble {name} allows maximum batch size {config.max_batch_size}, but it contains model "
                f"{step.model_name} which only allows maximum batch size to be {model.max_batch_size}",
            )
        if model.model_transaction_policy.decoupled:
            decoupled.add(step.model_name)
        model_inputs = {t.name: t for t in model.input}
        model_outputs = {t.name: t for t in model.output}
        for model_input, ensemble_tensor in step.inputs:
            if model_input not in model_inputs:
                raise error(
                    step,
                    f"in ensemble {name}, ensemble tensor {ensemble_tensor} is mapping to non-existing input "
                    f"{model_input} in model {step.model_name}",
                )
        mapped = {model_input for model_input, _ in step.inputs}
        for model_input, spec in model_inputs.items():
            if model_input not in mapped and not spec.optional:
                raise error(
                    step,
                    f"in ensemble {name}, input {model_input} in model {step.model_name} is not mapped to any "
                    "ensemble tensors",
                )
        for model_input, ensemble_tensor in step.inputs:
            spec = model_inputs[model_input]
            meet(step, ensemble_tensor, _Tensor.of(step.model_name, model_batching, spec.data_type, spec.dims))
        for model_output, ensemble_tensor in step.outputs:
            out = model_outputs.get(model_output)
            if out is None:
                raise error(
                    step,
                    f"in ensemble {name}, ensemble tensor {ensemble_tensor} is mapped from non-existing output "
                    f"{model_output} in model {step.model_name}",
                )
            meet(step, ensemble_tensor, _Tensor.of(step.model_name, model_batching, out.data_type, out.dims))
    _check_decoupled_origins(config, plan, decoupled, config_path)
    return frozenset(decoupled)


def _check_decoupled_origins(
    config: mc.ModelConfig, plan: EnsemblePlan, decoupled: set[str], config_path: Path
) -> None:
    """Each step, and the ensemble's outputs together, must take tensors that come from one decoupled
    step's responses (or from none): Triton labels each tensor with the decoupled step it descends
    from (`ValidateEnsembleConfig`), so that the steps after a decoupled one run once per response."""
    label: dict[str, int] = {tensor.name: 0 for tensor in config.input}
    labels = 0
    waiting = list(plan.steps)
    while waiting:
        ready = [s for s in waiting if all(tensor in label for _, tensor in s.inputs)]
        if not ready:
            return  # the data-flow checks report what cannot be reached
        for step in ready:
            origins = {label[tensor] for _, tensor in step.inputs}
            if len(origins) > 1:
                raise ModelConfigError(
                    f"{config_path}: in ensemble {plan.name}, step of model '{step.model_name}' receives inputs "
                    f"originated from different decoupled models ({step.label} of ensemble '{plan.name}')"
                )
            if step.model_name in decoupled:
                labels += 1
                origin = labels
            else:
                origin = origins.pop() if origins else 0
            for _, tensor in step.outputs:
                label[tensor] = origin
        waiting = [s for s in waiting if s not in ready]
    if len({label.get(output.name, 0) for output in config.output}) > 1:
        raise ModelConfigError(
            f"{config_path}: in ensemble {plan.name}, step of model '{plan.name}' receives inputs originated from "
            "different decoupled models (the ensemble's outputs)"
        )


def _dims_match(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return len(a) == len(b) and all(x == y or x == -1 or y == -1 for x, y in zip(a, b))


def _fmt(dims: Sequence[int]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"
