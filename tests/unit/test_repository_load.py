"""Repository loads: serialised per model, failures leave what serves in place, unknown names stay out."""

from __future__ import annotations

import asyncio
import shutil
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from reference_server.core.model_config import parse_config_text
from reference_server.core.repository import ModelRepository
from reference_server.errors import ModelConfigError, NotFound


@pytest.fixture
async def repository(demo_repository: Path, tmp_path: Path) -> AsyncIterator[ModelRepository]:
    root = tmp_path / "models"
    shutil.copytree(demo_repository / "identity", root / "identity")
    repo = ModelRepository(root)
    try:
        yield repo
    finally:
        await repo.close(0)


def identity_config(max_batch_size: int) -> Any:
    text = (
        f'name: "identity"\nmax_batch_size: {max_batch_size}\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
    )
    return parse_config_text(text, Path("override"))


async def test_concurrent_loads_of_one_model_run_one_after_the_other(
    repository: ModelRepository, monkeypatch: pytest.MonkeyPatch
) -> None:
    prepare = repository._prepare_versions
    lock = threading.Lock()
    active = [0, 0]  # now, most at once

    def counted(*args: Any) -> Any:
        with lock:
            active[0] += 1
            active[1] = max(active[1], active[0])
        try:
            return prepare(*args)
        finally:
            with lock:
                active[0] -= 1

    monkeypatch.setattr(repository, "_prepare_versions", counted)
    await asyncio.gather(*(repository.load("identity", identity_config(size)) for size in (2, 4, 6)))
    assert active[1] == 1
    # Loads take the lock in the order they were asked for: the last one wins.
    assert repository.get("identity").config.max_batch_size == 6
    assert [mv.config.max_batch_size for mv in repository.loaded()] == [6]


async def test_failed_reload_keeps_the_versions_and_the_ready_state(repository: ModelRepository) -> None:
    await repository.load("identity")
    serving = repository.get("identity")
    bad = identity_config(4)
    bad.input[0].dims[:] = [3, 3]  # rank 2 against the graph's rank 1 (plus batch)
    with pytest.raises(ModelConfigError, match="INPUT0"):
        await repository.load("identity", bad)
    assert repository.get("identity") is serving
    assert not serving.scheduler._closing  # still the one taking requests
    (entry,) = repository.index()
    assert entry["state"] == "READY" and "INPUT0" in entry["reason"]
    assert repository.all_ready()


async def test_unknown_model_is_not_found_and_leaves_no_trace(repository: ModelRepository) -> None:
    for name in ("nope", "../identity", ".hidden", ""):
        with pytest.raises(NotFound, match="not in the model repository"):
            await repository.load(name)
    assert [entry["name"] for entry in repository.index()] == ["identity"]
    assert repository.all_ready()


async def test_unload_leaves_the_model_unavailable_with_reason_unloaded(repository: ModelRepository) -> None:
    await repository.load("identity")
    await repository.unload("identity")
    assert not repository.is_ready("identity")
    # Each version it served, as Triton lists them.
    assert repository.index() == [{"name": "identity", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}]
    with pytest.raises(NotFound, match=r"^Request for unknown model: 'identity' has no available versions$"):
        repository.get("identity")  # Triton's 404
    await repository.unload("nope")  # Triton 2.51 unloads a model it does not have without a word
    assert [entry["name"] for entry in repository.index()] == ["identity"]


def test_resolve_load_models(repository: ModelRepository) -> None:
    assert repository.resolve_load_models(["*"]) == ["identity"]
    assert repository.resolve_load_models(["identity", "identity"]) == ["identity"]
    with pytest.raises(NotFound, match=r"--load-model 'mlp'.*\(models there: identity\)"):
        repository.resolve_load_models(["identity", "mlp"])


def write_ensemble(root: Path, name: str, composing: str, max_batch_size: int = 8) -> None:
    """An ensemble of one step on `composing` (an identity model)."""
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: {max_batch_size}\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        f'ensemble_scheduling {{ step [ {{ model_name: "{composing}" model_version: -1 '
        'input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "OUT" } } ] }\n'
    )


async def test_a_composing_model_reloaded_with_a_config_that_no_longer_fits_takes_the_ensemble_out(
    repository: ModelRepository,
) -> None:
    # As tritonserver 2.51 does in explicit mode: the reload succeeds, the ensemble using the model is
    # loaded again against the new config, fails its checks and stops serving; when the model's
    # config fits again, the ensemble serves again.
    write_ensemble(repository.root, "ens", "identity")
    await repository.load("ens")
    assert repository.is_ready("ens")

    await repository.load("identity", identity_config(2))
    assert repository.is_ready("identity") and not repository.is_ready("ens")
    (entry,) = [e for e in repository.index() if e["name"] == "ens"]
    assert entry["state"] == "UNAVAILABLE"
    assert "composing model 'identity' was reloaded and the ensemble no longer fits" in entry["reason"]
    assert (
        "ensemble ens allows maximum batch size 8, but it contains model identity which only allows maximum "
        "batch size to be 2" in entry["reason"]
    )

    await repository.load("identity", identity_config(8))
    assert repository.is_ready("ens")
    assert repository.get("ens").config.max_batch_size == 8


async def test_a_reload_that_still_fits_keeps_the_ensemble_serving(repository: ModelRepository) -> None:
    write_ensemble(repository.root, "ens", "identity", max_batch_size=2)
    await repository.load("ens")
    before = repository.get("ens")
    await repository.load("identity", identity_config(4))
    assert repository.is_ready("ens") and repository.get("ens") is not before  # checked again, as in Triton


async def test_a_version_that_fails_stops_the_stubs_of_the_versions_built_before_it(tmp_path: Path) -> None:
    model = tmp_path / "models" / "two"
    for version, body in ((1, "pass"), (2, "raise ValueError('version 2 is broken')")):
        (model / str(version)).mkdir(parents=True)
        (model / str(version) / "model.py").write_text(
            f"class TritonPythonModel:\n    def initialize(self, args):\n        {body}\n\n"
            "    def execute(self, requests):\n        return []\n"
        )
    (model / "config.pbtxt").write_text(
        'backend: "python"\nversion_policy { all {} }\n'
        'input [ { name: "I" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "O" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
    )
    repository = ModelRepository(tmp_path / "models")
    before = {child.pid for child in psutil.Process().children()}
    try:
        with pytest.raises(ModelConfigError, match="version 2 is broken"):
            await repository.load("two")
        # Version 1's stub was stopped, not left running.
        assert {child.pid for child in psutil.Process().children()} <= before
    finally:
        await repository.close(0)
