"""Model namespacing's keys (core/namespaces.py): a key per repository's folder, a request's name
resolved to its one loaded copy or Triton's errors, ensemble steps resolved in their own repository
first, the index in Triton's (repository, name) order, and the metrics' `namespace` label."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from reference_server.core.namespaces import Ambiguous, Namespaces
from reference_server.core.repository_roots import RepositoryRoots
from reference_server.errors import InvalidArgument, NotFound
from reference_server.frontends.metrics import NamespacedName, _labels


@dataclass
class _Record:
    fingerprint: object = "seen"


@pytest.fixture
def spaces(tmp_path: Path) -> tuple[Namespaces, Path, Path]:
    first, second = tmp_path / "a", tmp_path / "b"
    for folder in (first / "twice", second / "twice", first / "solo", second / "other"):
        folder.mkdir(parents=True)
    return Namespaces(RepositoryRoots([first, second])), first, second


def test_a_name_has_a_key_per_repository_that_holds_it(spaces: tuple[Namespaces, Path, Path]) -> None:
    namespaces, first, second = spaces
    assert namespaces.keys("twice") == [f"{first}::twice", f"{second}::twice"]
    assert namespaces.keys("solo") == [f"{first}::solo"]
    assert namespaces.keys("missing") == []
    assert namespaces.keys(f"{second}::twice") == [f"{second}::twice"]
    assert namespaces.folder(f"{second}::twice") == second / "twice"
    assert not namespaces.on_disk(f"{second}::solo")
    assert not namespaces.on_disk(f"{second}::../a/solo")  # a key never leaves its repository
    assert namespaces.split(f"{first}::x::y") == (str(first), "x::y")
    assert namespaces.model_names() == [f"{second}::other", f"{first}::solo", f"{first}::twice", f"{second}::twice"]


def test_a_name_resolves_to_its_one_loaded_copy_or_tritons_error(spaces: tuple[Namespaces, Path, Path]) -> None:
    namespaces, first, second = spaces
    records = {f"{first}::twice": _Record(), f"{second}::twice": _Record(), f"{first}::solo": _Record()}
    assert namespaces.key_of("solo", records) == f"{first}::solo"
    with pytest.raises(Ambiguous, match="^There are 2 identifiers of model 'twice' in global map"):
        namespaces.key_of("twice", records)
    records[f"{second}::twice"].fingerprint = None  # unloaded
    assert namespaces.key_of("twice", records) == f"{first}::twice"
    records[f"{first}::twice"].fingerprint = None
    with pytest.raises(NotFound, match="^Identifier of model 'twice' is not found in global map$"):
        namespaces.key_of("twice", records)
    with pytest.raises(InvalidArgument, match="^Request for unknown model: 'other' is not found$"):
        namespaces.key_of("other", records)
    records[f"{second}::other"] = _Record()  # a record added later is found
    assert namespaces.key_of("other", records) == f"{second}::other"


def test_an_ensemble_step_resolves_in_its_own_repository_first(spaces: tuple[Namespaces, Path, Path]) -> None:
    namespaces, first, second = spaces
    raw = mc.ModelConfig(name="ens", platform="ensemble")
    for model in ("twice", "solo", "nowhere"):
        raw.ensemble_scheduling.step.add(model_name=model)
    resolved = namespaces.resolve_steps(f"{second}::ens", raw)
    assert [s.model_name for s in resolved.ensemble_scheduling.step] == [
        f"{second}::twice",
        f"{first}::solo",  # the only 'solo'
        "nowhere",
    ]
    assert raw.ensemble_scheduling.step[0].model_name == "twice"  # the given config is left as is
    namespaces.show_steps(resolved)
    namespaces.show_steps(resolved)  # versions share the config: showing twice changes nothing
    shown = [(s.model_name, s.model_namespace) for s in resolved.ensemble_scheduling.step]
    assert shown[:2] == [("twice", str(second)), ("solo", str(first))]


def test_the_index_lists_bare_names_by_repository_then_name(spaces: tuple[Namespaces, Path, Path]) -> None:
    namespaces, first, second = spaces
    entries = [{"name": key} for key in (f"{second}::other", f"{first}::twice", f"{second}::twice", f"{first}::solo")]
    assert [e["name"] for e in namespaces.index(entries)] == ["solo", "twice", "other", "twice"]


def test_metrics_labels_carry_the_namespace_only_with_namespacing() -> None:
    named = NamespacedName("twice")
    named.namespace = "/models/a"
    assert list(_labels(named, "1").items()) == [("model", "twice"), ("namespace", "/models/a"), ("version", "1")]
    assert _labels("twice", "1") == {"model": "twice", "version": "1"}
