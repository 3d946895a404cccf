"""Loading ensembles as Triton's model repository manager does, beside `repository`.

An ensemble (`platform: "ensemble"`) has no model file and no instances. `prepare_ensemble` checks
its config alone (`ensemble.config`), refuses a cycle of ensembles, loads the composing models that
are not serving (Triton loads an ensemble's dependencies with it), then checks every step against
the completed config of the composing version it names. A decoupled composing model makes the
ensemble decoupled (its config says so, and the data plane serves it on streams only).

Triton keeps a dependency graph and loads an ensemble again after any of its composing models
(re)loads, so that the ensemble is checked against the config now served; the repository does the
same (`ModelRepository._reload_dependents`): one that no longer fits stops serving, with the
reason (Triton unloads it), and serves again once a later load fits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from tritonclient.grpc import model_config_pb2 as mc

from reference_server.core import model_config
from reference_server.core.ensemble.config import (
    EnsemblePlan,
    Step,
    check_circular,
    check_composing,
    complete_ensemble_config,
    ensemble_versions,
    is_ensemble,
)
from reference_server.errors import ModelConfigError, ServerError

__all__ = ["Host", "PreparedEnsemble", "composing_on_disk", "prepare_ensemble"]


class _Served(Protocol):
    @property
    def config(self) -> mc.ModelConfig: ...


class Host(Protocol):
    """What ensemble loading needs of the model repository."""

    def model_dir(self, name: str) -> Path: ...

    def on_disk(self, name: str) -> bool: ...

    def get(self, name: str, version: str = "") -> _Served: ...

    async def load(self, name: str, override: mc.ModelConfig | None = None) -> None: ...

    def serving(self, name: str) -> bool:
        """Whether `name` has loaded versions."""
        ...

    def failed_in_pass(self, name: str) -> str | None:
        """Why `name` failed to load in the current `load_all` pass; None if it was not tried."""
        ...


@dataclass(frozen=True, slots=True)
class PreparedEnsemble:
    """A checked ensemble, ready to serve: its completed config and plan, its decoupled composing
    models, the (model, version) pairs it runs on, and the versions to serve."""

    config: mc.ModelConfig
    plan: EnsemblePlan
    decoupled: frozenset[str]
    composing: tuple[tuple[str, str], ...]
    versions: list[int]


async def prepare_ensemble(host: Host, name: str, model_dir: Path, raw: mc.ModelConfig) -> PreparedEnsemble:
    """Check an ensemble's config, load its composing models, and check it against them."""
    config_path = model_dir / model_config.CONFIG_FILENAME
    config, plan = complete_ensemble_config(raw, name, config_path)
    check_circular(name, plan.steps, lambda model: composing_on_disk(host, model), config_path)
    await _load_composing(host, name, plan.steps, config_path)

    def composing(step: Step) -> mc.ModelConfig:
        try:
            return host.get(step.model_name, step.version).config
        except ServerError as exc:
            raise ModelConfigError(
                f"{config_path}: ensemble '{name}' depends on '{step.model_name}' whose required version "
                f"{step.model_version} is not loaded ({step.label}): {exc}"
            ) from None

    decoupled = check_composing(config, plan, composing, config_path)
    # As Triton completes it: clients (and the data plane) see an ensemble with a decoupled step as decoupled.
    config.model_transaction_policy.decoupled = bool(decoupled)
    return PreparedEnsemble(
        config=config,
        plan=plan,
        decoupled=decoupled,
        composing=tuple(dict.fromkeys((step.model_name, step.version) for step in plan.steps)),
        versions=ensemble_versions(config, model_dir, config_path),
    )


def composing_on_disk(host: Host, name: str) -> list[str]:
    """The composing models that `name`'s config.pbtxt names, if it is an ensemble."""
    if not host.on_disk(name):
        return []
    try:
        raw = model_config.read_config(host.model_dir(name))
    except ServerError:
        return []  # its own load reports it
    if raw is None or not is_ensemble(raw):
        return []
    return [step.model_name for step in raw.ensemble_scheduling.step]


async def _load_composing(host: Host, name: str, steps: Sequence[Step], config_path: Path) -> None:
    """Load the composing models that are not serving, as Triton loads an ensemble's dependencies."""
    missing = [step for step in steps if not host.on_disk(step.model_name)]
    if missing:
        names = ", ".join(dict.fromkeys(step.model_name for step in missing))
        raise ModelConfigError(
            f"{config_path}: ensemble {name} contains models that are not available or ambiguous: {names} "
            f"({', '.join(step.label for step in missing)} of ensemble '{name}'; no such folder in the "
            "model repository)"
        )
    for step in {step.model_name: step for step in reversed(steps)}.values():
        if host.serving(step.model_name):
            continue
        reason = host.failed_in_pass(step.model_name)
        if reason is None:
            try:
                await host.load(step.model_name)
                continue
            except ServerError as exc:
                reason = str(exc)
        raise ModelConfigError(
            f"ensemble '{name}' depends on '{step.model_name}' which has no loaded version. Model "
            f"'{step.model_name}' loading failed with error: {reason} ({step.label} of ensemble '{name}')"
        )
