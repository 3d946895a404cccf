"""Model namespacing (`--model-namespacing true`): each model repository is a namespace, and models
of the same name in different repositories all load, as tritonserver 2.51 does.

Triton names a model by (namespace, name), the namespace being the repository's path (core
src/model.h `ModelIdentifier`), and keeps a global map from a name to its identifiers
(src/model_repository_manager/model_repository_manager.cc). Here the repository's records are keyed
by `<repository>::<name>` (Triton's `ModelIdentifier::str()`), which stays the same when another
repository gains or loses a model of that name (poll mode), so an ensemble's resolved steps stay
right. A request names a model by its name alone: the repository's dict lookup misses (the lookup
with namespacing off is untouched) and `key_of` finds the key in a name -> keys map that is rebuilt
only when a record is added. What Triton does with the name alone, so does this module:

- a request, metadata or config naming a model of several repositories gets INVALID_ARG "There are
  N identifiers of model 'NAME' in global map, model namespace must be provided to resolve
  ambiguity." (`FindModelIdentifier`); statistics say "requested model 'NAME' is not available";
- a name that was never loaded gets INVALID_ARG "Request for unknown model: 'NAME' is not found",
  and a name whose every copy was unloaded NOT_FOUND "Identifier of model 'NAME' is not found in
  global map";
- load and unload by name act on every repository's copy (`Poll` polls each repository);
- an ensemble's step names the model of the ensemble's own repository where it has one, else the
  only one of that name (`DependencyGraph::ConnectNode`, fuzzy matching);
- the repository index lists each copy under its bare name, ordered by (repository, name);
- per-model metrics carry a `namespace` label, the repository's path.

Beyond Triton, which has no way to name a namespace: a request that names a key itself
(`<repository>::<name>`) is served by that copy. And statistics of all models list every copy,
where Triton 2.51 answers 400 "Request for unknown model: '<repository>::<name>' is not found"
(its statistics look each model up by that string).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Protocol

from tritonclient.grpc import model_config_pb2 as mc

from reference_server.core.repository_roots import RepositoryRoots
from reference_server.errors import InvalidArgument, ModelConfigError, NotFound, ServerError

__all__ = ["SEPARATOR", "Ambiguous", "Namespaces", "load_each"]

#: Between a namespace and a model name in a key, as Triton writes an identifier.
SEPARATOR = "::"


class Ambiguous(InvalidArgument):
    """A model name that several repositories' models answer to (statistics answer it in their own words)."""


class _Record(Protocol):
    @property
    def fingerprint(self) -> object: ...


class _Labelled(Protocol):
    name: str
    namespace: str
    config: mc.ModelConfig


class Namespaces:
    """The keys of the models of several repositories, each repository a namespace."""

    __slots__ = ("_by_name", "_indexed", "roots")

    def __init__(self, roots: RepositoryRoots) -> None:
        self.roots = roots
        #: Model name -> the keys of its records, as of when the records numbered `_indexed`.
        self._by_name: dict[str, list[str]] = {}
        self._indexed = -1

    def keys(self, name: str) -> list[str]:
        """The record keys `name` stands for: a key as it is, a name one key for each repository
        that holds a folder of that name (none for a name on no disk)."""
        if self.is_key(name):
            return [name]
        return [f"{folder.parent}{SEPARATOR}{name}" for folder in self.roots.holders(name)]

    def model_names(self) -> list[str]:
        """Every model folder of every repository, as record keys."""
        return [key for name in self.roots.model_names() for key in self.keys(name)]

    def is_key(self, name: str) -> bool:
        """Whether `name` is a key (a repository's path, the separator, a name), not a model's name."""
        return any(name.startswith(f"{root}{SEPARATOR}") for root in self.roots.paths)

    def split(self, key: str) -> tuple[str, str]:
        """(namespace, name) of a key; a bare name's namespace is the first repository that holds it."""
        for root in self.roots.paths:  # by the repositories, since a path or a folder may hold "::" too
            if key.startswith(prefix := f"{root}{SEPARATOR}"):
                return str(root), key[len(prefix) :]
        held = self.roots.holders(key)
        return (str(held[0].parent) if held else "", key)

    def place(self, key: str) -> Path:
        """The folder a key names, unchecked (the poller's fingerprints)."""
        if self.is_key(key):
            namespace, name = self.split(key)
            return Path(namespace) / name
        return self.roots.folder(key)

    def folder(self, key: str) -> Path:
        """The folder of a key's model (checked as `RepositoryRoots.model_dir` checks a name)."""
        if not self.is_key(key):
            return self.roots.model_dir(key)
        namespace, name = self.split(key)
        folder = Path(namespace) / name
        if folder not in self.roots.holders(name):  # which also refuses names that would leave the repository
            raise NotFound(f"model '{name}' is not in the model repository {namespace}")
        if folder.resolve().parent != folder.parent:
            raise ModelConfigError(
                f"{folder}: model folder resolves to {folder.resolve()}, outside the model repository {namespace}"
            )
        return folder

    def on_disk(self, key: str) -> bool:
        try:
            self.folder(key)
        except ServerError:
            return False
        return True

    def resolve_steps(self, key: str, raw: mc.ModelConfig) -> mc.ModelConfig:
        """An ensemble's config with each step naming its model's key: the model of the ensemble's
        own repository where there is one, else the only model of that name; else the name as
        written, which is then not found (Triton: "not available or ambiguous")."""
        namespace, _ = self.split(key)
        resolved = mc.ModelConfig()
        resolved.CopyFrom(raw)
        for step in resolved.ensemble_scheduling.step:
            if self.is_key(step.model_name):
                continue
            keys = self.keys(step.model_name)
            own = f"{namespace}{SEPARATOR}{step.model_name}"
            if own in keys:
                step.model_name = own
            elif len(keys) == 1:
                step.model_name = keys[0]
        return resolved

    def show_steps(self, config: mc.ModelConfig) -> None:
        """An ensemble's served config as Triton shows it: each step's bare model name, with the
        namespace of the model it resolved to in `model_namespace` (the versions of an ensemble
        share one config: a step already shown is left as is)."""
        for step in config.ensemble_scheduling.step:
            if self.is_key(step.model_name) or not step.model_namespace:
                step.model_namespace, step.model_name = self.split(step.model_name)

    def label(self, key: str, versions: Iterable[_Labelled]) -> None:
        """Name the loaded versions of `key` by their bare name and namespace (statistics, metrics)."""
        namespace, name = self.split(key)
        for version in versions:
            version.name, version.namespace = name, namespace
            self.show_steps(version.config)

    def key_of(self, name: str, records: Mapping[str, _Record]) -> str:
        """The key of the record a request naming `name` alone is served by, as Triton finds a
        model's identifier by its name; else Triton's error."""
        if self._indexed != len(records):  # records are only ever added
            self._by_name = {}
            for key in records:
                self._by_name.setdefault(self.split(key)[1], []).append(key)
            self._indexed = len(records)
        copies = self._by_name.get(name, [])
        live = [key for key in copies if records[key].fingerprint is not None]  # in Triton's global map
        if len(live) == 1:
            return live[0]
        if len(live) > 1:
            raise Ambiguous(
                f"There are {len(live)} identifiers of model '{name}' in global map, model namespace must be "
                "provided to resolve ambiguity."
            )
        if copies and not live:
            raise NotFound(f"Identifier of model '{name}' is not found in global map")
        raise InvalidArgument(f"Request for unknown model: '{name}' is not found")

    def index(self, entries: list[dict[str, str]]) -> list[dict[str, str]]:
        """Repository index entries keyed by record keys, as Triton lists them: bare names, in
        (repository, name) order."""
        named = [(self.split(entry["name"]), entry) for entry in entries]
        named.sort(key=lambda item: item[0])
        for (_, name), entry in named:
            entry["name"] = name
        return [entry for _, entry in named]


async def load_each(keys: Iterable[str], load: Callable[[str], Awaitable[None]]) -> None:
    """Load every repository's copy of a name, as Triton polls each; the first failure is raised
    after all were tried."""
    first: ServerError | None = None
    for key in keys:
        try:
            await load(key)
        except ServerError as exc:
            first = first or exc
    if first is not None:
        raise first
