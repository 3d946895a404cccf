"""The model repositories of one server: `--model-repository` given once or several times, as
tritonserver takes it.

Models of all the repositories are served together, named by their folder. Without model
namespacing (the default), a name must be unique across the repositories: a model whose folder is in
two of them is not loaded ("not unique across all model repositories", core
src/model_repository_manager/model_repository_manager.cc), and the others load as usual. With
`--model-namespacing true`, `namespaces.py` keys such models by repository instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from reference_server.errors import ModelConfigError, NotFound

__all__ = ["DUPLICATE_REASON", "RepositoryRoots"]

#: The repository index's reason for a model in several repositories (core model_repository_manager.h).
DUPLICATE_REASON = "model appears in two or more repositories"


def _is_model_name(name: str) -> bool:
    """Whether `name` can be a model folder's name (names that would leave a repository cannot)."""
    return bool(name) and name not in (".", "..") and not any(c in name for c in "/\\\x00") and not name.startswith(".")


class RepositoryRoots:
    """The repositories' folders, in the order given."""

    __slots__ = ("paths",)

    def __init__(self, roots: Sequence[Path]) -> None:
        if not roots:
            raise ModelConfigError("no model repository: pass --model-repository DIR")
        paths = []
        for root in roots:
            if not root.is_dir():
                raise ModelConfigError(f"{root}: model repository is not a directory; pass --model-repository DIR")
            resolved = root.resolve()
            if resolved in paths:
                raise ModelConfigError(f"{root}: model repository given twice (--model-repository)")
            paths.append(resolved)
        self.paths: tuple[Path, ...] = tuple(paths)

    def __str__(self) -> str:
        if len(self.paths) == 1:
            return f"the model repository {self.paths[0]}"
        return "any model repository (" + ", ".join(map(str, self.paths)) + ")"

    def model_names(self) -> list[str]:
        """Models present on disk: every non-hidden folder of every repository, once each."""
        names = {p.name for root in self.paths for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")}
        return sorted(names)

    def holders(self, name: str) -> list[Path]:
        """The folders named `name` across the repositories (none for a name that is not a model's)."""
        if not _is_model_name(name):
            return []
        return [root / name for root in self.paths if (root / name).is_dir()]

    def folder(self, name: str) -> Path:
        """A folder of `name`, the first repository's that holds it (for fingerprints; `model_dir`
        refuses a name that is not unique)."""
        held = self.holders(name)
        return held[0] if held else self.paths[0] / name

    def unique(self, name: str) -> bool:
        """Whether `name` is in one repository at most."""
        return len(self.paths) == 1 or len(self.holders(name)) <= 1

    def not_unique(self, name: str) -> str:
        return (
            f"model '{name}' is not unique across all model repositories: {', '.join(map(str, self.holders(name)))}; "
            "rename one of the folders"
        )

    def mark_duplicates(self, entries: list[dict[str, str]]) -> list[dict[str, str]]:
        """Repository index entries with each model that is in several repositories UNAVAILABLE, with
        Triton's reason."""
        if len(self.paths) > 1:
            for entry in entries:
                if "state" not in entry and not self.unique(entry["name"]):
                    entry.update(state="UNAVAILABLE", reason=DUPLICATE_REASON)
        return entries

    def model_dir(self, name: str) -> Path:
        """The folder of model `name`: in exactly one repository, and inside it."""
        held = self.holders(name)
        if not held:
            raise NotFound(f"model '{name}' is not in {self}")
        if len(held) > 1:
            raise ModelConfigError(self.not_unique(name))
        candidate = held[0]
        resolved = candidate.resolve()
        if resolved.parent != candidate.parent:
            raise ModelConfigError(
                f"{candidate}: model folder resolves to {resolved}, outside the model repository {candidate.parent}"
            )
        return candidate
