"""The model configurations `perfkit tune` chooses among: what one is, and the grid of them.

A `Variant` is the set of changes to the model's own configuration (instance count and kind,
max_batch_size, dynamic batching; or, with --param, the params' values); `Variant.apply` makes the
configuration JSON sent to the repository load API. Everything else the model's config says is kept.
`variant_of` reads the variant a configuration already is, and `default_variant` names the model's
own configuration the way the tune names every other variant.

The grid (`Space`) holds one tuple of values per dimension; `build_space` makes it from the tune's
flags (`SpaceSpec`) around the model's own configuration. The search policies
(`perfkit.tune.search`) walk it through the `search.Grid` protocol, by coordinates (an index per
dimension): `Space.variant` turns a coordinate into a variant, `Space.neighbours` gives the points
±1 away (`neighbours_in`), and `Space.nearest` the point closest to a variant.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from perfkit.errors import PerfkitError
from perfkit.tune.params import Param, Setting, apply_settings, label

__all__ = [
    "UNSET",
    "Batching",
    "BatchingChoice",
    "Space",
    "SpaceSpec",
    "Variant",
    "build_space",
    "default_variant",
    "doubling",
    "neighbours_in",
    "variant_of",
]


def neighbours_in(shape: Sequence[int], coord: Sequence[int], dims: int = 1) -> list[tuple[int, ...]]:
    """The coordinates of a grid of `shape` ±1 away from `coord` in exactly `dims` dimensions (1:
    along an axis; 2: diagonally)."""
    out = []
    for moved in itertools.combinations(range(len(shape)), dims):
        for steps in itertools.product((-1, 1), repeat=dims):
            point = list(coord)
            for dim, step in zip(moved, steps):
                point[dim] += step
            if all(0 <= point[dim] < shape[dim] for dim in moved):
                out.append(tuple(point))
    return out


def doubling(start: int, end: int) -> list[int]:
    """start, 2·start, 4·start, … up to end (model_analyzer's `generate_doubled_list`)."""
    values, value = [], start
    while value <= end:
        values.append(value)
        value *= 2
    return values


@dataclass(frozen=True, slots=True)
class Batching:
    """Dynamic batching on, with this queue delay and these preferred batch sizes (none: Triton's)."""

    delay_us: int
    preferred: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class BatchingChoice:
    """One value of the batching dimension: a delay and a preferred-size rule that is resolved
    against each max_batch_size: 'none', 'max', or a number."""

    delay_us: int
    preferred: str = "none"

    def resolve(self, max_batch_size: int) -> Batching:
        if self.preferred == "none":
            return Batching(self.delay_us)
        if self.preferred == "max":
            return Batching(self.delay_us, (max_batch_size,))
        return Batching(self.delay_us, (int(self.preferred),))


@dataclass(frozen=True, slots=True)
class Variant:
    """A model configuration as tune varies it; `kind` "" keeps the configuration's own."""

    instance_count: int
    max_batch_size: int
    batching: Batching | None
    kind: str = ""
    #: --param values, (path, value) in --param order; when set, they alone change the config.
    settings: tuple[Setting, ...] = ()

    @property
    def key(self) -> str:
        if self.settings:
            return " ".join(label(path, value) for path, value in self.settings)
        batching = "off" if self.batching is None else f"{self.batching.delay_us}us"
        if self.batching is not None and self.batching.preferred:
            batching += "/pref" + "+".join(map(str, self.batching.preferred))
        kind = f" kind={self.kind.removeprefix('KIND_').lower()}" if self.kind else ""
        return f"count={self.instance_count} mbs={self.max_batch_size} batching={batching}{kind}"

    @property
    def cost(self) -> tuple[float, ...]:
        """Smaller means fewer resources: instances, then batch size, then batching delay."""
        delay = -1.0 if self.batching is None else float(self.batching.delay_us)
        knobs = (float(self.instance_count), float(self.max_batch_size), delay, float(self.kind == "KIND_GPU"))
        # --param values in order, numbers as themselves, lists by their sum: a rough "less is cheaper".
        return knobs + tuple(_magnitude(value) for _, value in self.settings)

    def describe(self) -> str:
        if self.settings:
            return ", ".join(label(path, value) for path, value in self.settings)
        parts = [f"{self.instance_count} instance{'s' if self.instance_count != 1 else ''}"]
        if self.kind:
            parts[0] += f" ({self.kind})"
        if self.max_batch_size:
            parts.append(f"max batch {self.max_batch_size}")
        if self.batching is None:
            parts.append("no dynamic batching")
        else:
            text = f"dynamic batching, delay {self.batching.delay_us} µs"
            if self.batching.preferred:
                text += f", preferred {'/'.join(map(str, self.batching.preferred))}"
            parts.append(text)
        return ", ".join(parts)

    def params(self) -> dict[str, Any]:
        return {
            "instance_count": self.instance_count,
            "max_batch_size": self.max_batch_size,
            "dynamic_batching": self.batching is not None,
            "max_queue_delay_us": None if self.batching is None else self.batching.delay_us,
            "preferred_batch_sizes": [] if self.batching is None else list(self.batching.preferred),
            "instance_kind": self.kind,
            "settings": {path: list(v) if isinstance(v, tuple) else v for path, v in self.settings},
        }

    def apply(self, base: dict[str, Any]) -> dict[str, Any]:
        """`base` (a model config as JSON, Triton's shape) with this variant's settings. Several
        instance groups collapse into one (the first's settings, this count). A variant of --param
        values is `base` with those values and nothing else changed."""
        if self.settings:
            return apply_settings(base, self.settings)
        config = copy.deepcopy(base)
        group = dict((config.get("instance_group") or [{}])[0])
        group["count"] = self.instance_count
        if self.kind:
            group["kind"] = self.kind
        config["instance_group"] = [group]
        if config.get("max_batch_size", 0) > 0:
            config["max_batch_size"] = self.max_batch_size
        if self.batching is None:
            config.pop("dynamic_batching", None)
        else:
            batching = dict(config.get("dynamic_batching") or {})
            batching["max_queue_delay_microseconds"] = self.batching.delay_us
            # Always set: a preferred size from the base may exceed this variant's max_batch_size.
            batching["preferred_batch_size"] = list(self.batching.preferred)
            config["dynamic_batching"] = batching
        return config


def _magnitude(value: Any) -> float:
    if isinstance(value, tuple):
        return float(sum(map(_magnitude, value)))
    return float(value) if isinstance(value, (int, float)) else 0.0


def variant_of(config: dict[str, Any]) -> Variant:
    """The variant a configuration is (instances summed over its groups; KIND_AUTO is no kind)."""
    groups = config.get("instance_group") or []
    count = sum(max(1, int(g.get("count", 1))) for g in groups) if groups else 1
    kind = str(groups[0].get("kind", "")) if groups else ""
    batching_doc = config.get("dynamic_batching")
    batching = None
    if batching_doc is not None:
        preferred = tuple(int(x) for x in batching_doc.get("preferred_batch_size", []))
        batching = Batching(int(batching_doc.get("max_queue_delay_microseconds", 0)), preferred)
    return Variant(count, int(config.get("max_batch_size", 0)), batching, "" if kind == "KIND_AUTO" else kind)


@dataclass(frozen=True, slots=True)
class Space:
    """The grid: one tuple of values per dimension. A model that does not batch has the single
    max_batch_size 0 and batching (None,). With --param, each param is one more dimension (its
    values in order), the four knobs hold the base's values only, and `home` is where the base
    config's own values sit on the param dimensions; when all of them are among the values
    (`home_is_base`), that point is the base config itself: named by those values, as every point
    is, it has the default variant's key (`default_variant`), and is not measured a second time."""

    instance_counts: tuple[int, ...]
    max_batch_sizes: tuple[int, ...]
    batchings: tuple[BatchingChoice | Batching | None, ...]
    kinds: tuple[str, ...] = ("",)
    params: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    home: tuple[int, ...] = ()
    home_is_base: bool = False

    @property
    def shape(self) -> tuple[int, ...]:
        knobs = (len(self.instance_counts), len(self.max_batch_sizes), len(self.batchings), len(self.kinds))
        return knobs + tuple(len(values) for _, values in self.params)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def variant(self, coord: Sequence[int]) -> Variant:
        i, b, d, k = coord[:4]
        mbs = self.max_batch_sizes[b]
        choice = self.batchings[d]
        batching = choice.resolve(mbs) if isinstance(choice, BatchingChoice) else choice
        settings = tuple((path, values[j]) for (path, values), j in zip(self.params, coord[4:]))
        return Variant(self.instance_counts[i], mbs, batching, self.kinds[k], settings)

    def coordinates(self) -> list[tuple[int, ...]]:
        return list(itertools.product(*(range(n) for n in self.shape)))

    def neighbours(self, coord: Sequence[int], dims: int = 1) -> list[tuple[int, ...]]:
        return neighbours_in(self.shape, coord, dims)

    def nearest(self, variant: Variant) -> tuple[int, ...]:
        """The grid point closest to `variant`, dimension by dimension (batch sizes in log scale)."""

        def closest(values: Sequence[float], target: float) -> int:
            return min(range(len(values)), key=lambda i: (abs(values[i] - target), i))

        count = closest(self.instance_counts, variant.instance_count)
        mbs = closest([math.log2(max(v, 1)) for v in self.max_batch_sizes], math.log2(max(variant.max_batch_size, 1)))
        delays = [-1.0 if c is None else float(c.delay_us) for c in self.batchings]
        target = -1.0 if variant.batching is None else float(variant.batching.delay_us)
        kind = self.kinds.index(variant.kind) if variant.kind in self.kinds else 0
        return (count, mbs, closest(delays, target), kind, *(self.home or (0,) * len(self.params)))


@dataclass(frozen=True, slots=True)
class SpaceSpec:
    """The grid, with model_analyzer's defaults (instances 1..5, max_batch_size 1..128)."""

    min_instances: int = 1
    max_instances: int = 5
    min_batch: int = 1
    max_batch: int = 128
    delays_us: tuple[int, ...] = (0,)
    preferred: tuple[str, ...] = ("none",)  # none | max | a number
    kinds: tuple[str, ...] = ()  # (): the config's own kind
    params: tuple[Param, ...] = ()  # --param: when given, the only dimensions searched

    def validate(self) -> None:
        paths = [p.path for p in self.params]
        for path in sorted({p for p in paths if paths.count(p) > 1}):
            raise PerfkitError(f"--param {path} is given twice; put all its values in one --param")
        if not 1 <= self.min_instances <= self.max_instances:
            raise PerfkitError("--min-instance-count and --max-instance-count need 1 <= MIN <= MAX")
        if not 1 <= self.min_batch <= self.max_batch:
            raise PerfkitError("--min-batch-size and --max-batch-size need 1 <= MIN <= MAX")
        if not self.delays_us or any(d < 0 for d in self.delays_us):
            raise PerfkitError("--batching-delays-us takes non-negative microseconds, e.g. 0,100,500")
        for token in self.preferred:
            if token not in ("none", "max") and not (token.isdigit() and int(token) > 0):
                raise PerfkitError(f"--preferred-batch-sizes: '{token}' is not none, max or a positive number")
        for kind in self.kinds:
            if kind not in ("KIND_CPU", "KIND_GPU"):
                raise PerfkitError(f"--instance-kinds: '{kind}' is not KIND_CPU or KIND_GPU")


def build_space(spec: SpaceSpec, base: Variant, config: dict[str, Any] | None = None) -> Space:
    """The grid around a model whose own config is `base` (`config`, its JSON, places the quick
    search's start on the --param dimensions)."""
    if spec.params:
        dims = tuple((p.path, p.values) for p in spec.params)
        found = [_index_of(config, p) if config is not None else None for p in spec.params]
        home = tuple(i or 0 for i in found)
        knobs = (base.instance_count,), (base.max_batch_size,), (base.batching,), (base.kind,)
        return Space(*knobs, dims, home, home_is_base=None not in found)
    counts = tuple(range(spec.min_instances, spec.max_instances + 1))
    kinds = spec.kinds or (base.kind,)
    if base.max_batch_size == 0:  # the model does not batch: only instances to vary
        return Space(counts, (0,), (None,), kinds)
    batchings = (None, *(BatchingChoice(d, p) for d in spec.delays_us for p in spec.preferred))
    return Space(counts, tuple(doubling(spec.min_batch, spec.max_batch)), batchings, kinds)


def default_variant(config: dict[str, Any], params: Sequence[Param] = ()) -> Variant:
    """The variant a configuration is, as the tune names it: with --param, by its own values of the
    params (`UNSET` where it sets none), the way every other variant of that tune is named."""
    variant = variant_of(config)
    if not params:
        return variant
    own = tuple((p.path, _value_of(config, p)) for p in params)
    return dataclasses.replace(variant, settings=tuple((path, UNSET if v is None else v) for path, v in own))


#: How a variant's key names a --param field that the default configuration does not set.
UNSET = "unset"


def _index_of(config: dict[str, Any], param: Param) -> int | None:
    """Where the config's own value of `param` is among its values (None: absent, or not one of them)."""
    value = _value_of(config, param)
    return param.values.index(value) if value is not None and value in param.values else None


def _value_of(config: dict[str, Any], param: Param) -> Any:
    """The config's own value of `param` (a list as a tuple); None when it sets none."""
    node: Any = config
    for name, index in param.steps:
        node = node.get(name) if isinstance(node, dict) else None
        if isinstance(index, str):  # a map entry
            node = node.get(index) if isinstance(node, dict) else None
        elif index is not None:
            node = node[index] if isinstance(node, list) and index < len(node) else None
    return tuple(node) if isinstance(node, list) else node
