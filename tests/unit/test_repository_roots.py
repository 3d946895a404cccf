"""Several model repositories (--model-repository given more than once): names, folders, and a name
in two repositories."""

from __future__ import annotations

from pathlib import Path

import pytest

from reference_server.core.repository_roots import DUPLICATE_REASON, RepositoryRoots
from reference_server.errors import ModelConfigError, NotFound


@pytest.fixture
def roots(tmp_path: Path) -> RepositoryRoots:
    for folder in ("a/one", "a/both", "b/two", "b/both", "b/.hidden"):
        (tmp_path / folder).mkdir(parents=True)
    return RepositoryRoots([tmp_path / "a", tmp_path / "b"])


def test_models_of_every_repository(roots: RepositoryRoots, tmp_path: Path) -> None:
    assert roots.model_names() == ["both", "one", "two"]
    assert roots.model_dir("two") == tmp_path / "b" / "two"
    assert roots.unique("one") and roots.unique("missing") and not roots.unique("both")
    assert roots.holders("..") == [] and roots.holders(".hidden") == []


def test_a_name_in_two_repositories_is_no_model(roots: RepositoryRoots) -> None:
    with pytest.raises(ModelConfigError, match="model 'both' is not unique across all model repositories"):
        roots.model_dir("both")
    with pytest.raises(NotFound, match="model 'missing' is not in any model repository"):
        roots.model_dir("missing")
    entries = roots.mark_duplicates([{"name": "both"}, {"name": "one"}])
    assert entries == [{"name": "both", "state": "UNAVAILABLE", "reason": DUPLICATE_REASON}, {"name": "one"}]


def test_bad_repositories_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelConfigError, match="model repository is not a directory"):
        RepositoryRoots([tmp_path, tmp_path / "nope"])
    with pytest.raises(ModelConfigError, match="model repository given twice"):
        RepositoryRoots([tmp_path, tmp_path / "."])
