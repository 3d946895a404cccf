"""Poll mode, one poll at a time: fingerprints, and what a poll loads, reloads and unloads."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from reference_server.core.model_source import model_fingerprint
from reference_server.core.poller import RepositoryPoller
from reference_server.core.repository import ModelRepository
from reference_server.errors import ServerError
from tests.unit.test_repository_load import write_ensemble


def add_identity(root: Path, demo_repository: Path, name: str) -> Path:
    """A copy of the demo identity model named `name`, moved into place whole (as one should)."""
    staging = root.parent / f"staging-{name}"
    shutil.copytree(demo_repository / "identity", staging)
    config = staging / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "identity"', f'name: "{name}"'))
    staging.rename(root / name)
    return root / name


def test_fingerprint_sees_changes_by_stat_alone(demo_repository: Path, tmp_path: Path) -> None:
    model = tmp_path / "identity"
    shutil.copytree(demo_repository / "identity", model)
    first = model_fingerprint(model)
    assert first == model_fingerprint(model)
    assert {entry[0] for entry in first} == {"config.pbtxt", "1", os.path.join("1", "model.onnx")}

    (model / ".config.pbtxt.swp").write_text("editor state")  # hidden: not part of the model
    assert model_fingerprint(model) == first

    onnx = model / "1" / "model.onnx"
    st = onnx.stat()
    os.utime(onnx, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    touched = model_fingerprint(model)
    assert touched != first

    (model / "2").mkdir()
    assert model_fingerprint(model) != touched


def test_poll_interval_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ServerError, match="--repository-poll-secs"):
        RepositoryPoller(ModelRepository(tmp_path), 0)


@pytest.fixture
async def polled(demo_repository: Path, tmp_path: Path) -> AsyncIterator[tuple[ModelRepository, RepositoryPoller]]:
    root = tmp_path / "models"
    root.mkdir()
    add_identity(root, demo_repository, "identity")
    add_identity(root, demo_repository, "other")
    repository = ModelRepository(root)
    await repository.load_all()
    try:
        yield repository, RepositoryPoller(repository, 3600)
    finally:
        await repository.close(0)


async def test_poll_follows_the_repository(
    polled: tuple[ModelRepository, RepositoryPoller], demo_repository: Path
) -> None:
    repository, poller = polled
    root = repository.root
    result = await poller.poll_once()
    assert (result.loaded, result.unloaded, result.failed) == ([], [], {})

    # A changed config is reloaded (the size changes too, so coarse file timestamps cannot hide it).
    config = root / "identity" / "config.pbtxt"
    config.write_text(config.read_text().replace("max_batch_size: 8", "max_batch_size: 16"))
    before = repository.get("identity")
    assert (await poller.poll_once()).loaded == ["identity"]
    assert repository.get("identity").config.max_batch_size == 16
    assert repository.get("identity") is not before

    # A new folder is loaded, a removed one unloaded and gone from the index.
    add_identity(root, demo_repository, "newcomer")
    shutil.rmtree(root / "other")
    result = await poller.poll_once()
    assert (result.loaded, result.unloaded) == (["newcomer"], ["other"])
    assert repository.is_ready("newcomer") and not repository.is_ready("other")
    assert "other" not in {entry["name"] for entry in repository.index()}
    assert repository.all_ready()  # a removed model does not hold readiness back


async def test_broken_config_keeps_the_old_version_and_is_not_retried_until_it_changes(
    polled: tuple[ModelRepository, RepositoryPoller],
) -> None:
    repository, poller = polled
    serving = repository.get("identity")
    config = repository.root / "identity" / "config.pbtxt"
    good = config.read_text()
    config.write_text(good + "max_batch_size: [ oops ]\n")
    result = await poller.poll_once()
    assert list(result.failed) == ["identity"] and "config.pbtxt" in result.failed["identity"]
    assert repository.get("identity") is serving
    (entry,) = [e for e in repository.index() if e["name"] == "identity"]
    assert entry["state"] == "READY" and "config.pbtxt" in entry["reason"]

    result = await poller.poll_once()  # unchanged: no second attempt
    assert (result.loaded, result.failed) == ([], {})

    config.write_text(good.replace("max_batch_size: 8", "max_batch_size: 2"))
    assert (await poller.poll_once()).loaded == ["identity"]
    (entry,) = [e for e in repository.index() if e["name"] == "identity"]
    assert "reason" not in entry and repository.get("identity").config.max_batch_size == 2  # none, as in Triton


async def test_a_new_ensemble_and_its_new_composing_model_load_it_once(
    polled: tuple[ModelRepository, RepositoryPoller], demo_repository: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The ensemble sorts before its composing model in one pair and after it in the other: either
    # way the composing model loads once, as the ensemble's dependency or on its own.
    repository, poller = polled
    root = repository.root
    for ensemble, composing in (("alpha_ens", "zeta"), ("zulu_ens", "beta")):
        add_identity(root, demo_repository, composing)
        write_ensemble(root, ensemble, composing)
    loads: list[str] = []
    load = repository.load

    async def counted(name: str, override: Any = None) -> None:
        loads.append(name)
        await load(name, override)

    monkeypatch.setattr(repository, "load", counted)
    result = await poller.poll_once()
    assert result.failed == {}
    assert sorted(loads) == ["alpha_ens", "beta", "zeta", "zulu_ens"]
    assert all(repository.is_ready(name) for name in ("alpha_ens", "zulu_ens"))
    assert (await poller.poll_once()).loaded == []
