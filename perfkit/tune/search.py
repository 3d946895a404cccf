"""The search policies of `perfkit tune`: which model configurations to measure, and at which loads.

Theory of operation. A policy is a generator with feedback, after model_analyzer's
`config/generate/config_generator_interface.py`: it yields what to measure next and receives each
measurement through `gen.send(result)`; it ends (StopIteration) when it has seen enough. It does no
I/O, so its tests drive it with a synthetic performance model. Three policies live here:

1. `concurrency_sweep` (model_analyzer `result/parameter_search.py`, `constants.py`): a variant is
   measured at concurrency START, 2·START, 4·START, … ≤ END. After at least
   THROUGHPUT_MINIMUM_CONSECUTIVE_TRIES (4) levels, the sweep stops once the best throughput of the
   last 4 is less than THROUGHPUT_MINIMUM_GAIN (5 %) above the first of them: the server has
   saturated. It also stops at the first level that breaks a constraint that only tightens with
   load (an upper bound on latency): in a closed loop, more clients past that point only queue
   longer (model_analyzer measures on to the plateau; we save those levels). It then bisects
   between the last passing and the first failing level, for at most
   run_config_search_max_binary_search_steps (5) steps, to find the highest load within the bound.
   It receives each level's `Figures`, or None when no request of the level succeeded (it stops).

   `rate_sweep` is its open-loop twin (model_analyzer's request-rate search): request rates
   START, 2·START, … ≤ END are offered on a schedule, and a rate passes when the variant sustains
   it, completing at least SUSTAINED_SHARE (90 %) of the offered rate, within the latency bounds
   measured from each request's intended send time (the figures of an open-loop level are the
   coordinated-omission corrected ones, `objectives.figures_of`). The doubling stops at the first
   rate that does not pass, then bisects to the highest rate that does. There is no plateau rule:
   past saturation an open loop does not plateau, its queue grows until the rate fails.

2. `brute_search` (model_analyzer `automatic_model_config_generator.py`): the default
   configuration first, then every point of the grid: instance count outermost, then
   max_batch_size, then dynamic batching (off, then each queue delay and preferred size), then the
   instance kind. A grid point equal to the default is not measured twice.

3. `quick_search` (model_analyzer `quick_run_config_generator.py`, `neighborhood.py`): hill
   climbing on the grid's coordinates (index per dimension; max_batch_size moves by doubling). The
   default configuration is measured first, as the baseline; the climb starts at the grid point
   nearest to it. At each home it measures every adjacent coordinate (±1 in one dimension) not yet
   measured, which is model_analyzer's "slow mode", and moves to the best of them when it beats
   home. When none does, it looks at the diagonal neighbours (±1 in two dimensions), because some
   settings pay off only together: dynamic batching gains nothing at max_batch_size 1, and a
   larger max_batch_size nothing without a batcher. It stops when neither look finds a better
   variant, or when a home comes round a second time. "Best" is `merit`:
   feasible first, then the smallest constraint excess, then the score; so, as model_analyzer does,
   a climb from an infeasible home walks toward feasibility first and never leaves feasibility for
   a higher score. Differences from model_analyzer: it measures whole neighbourhoods instead of
   three points of a radius-3 ball followed by a weighted step (our grids have
   three or four short dimensions, so the neighbourhood is small and a full look is robust to
   noise), and it sweeps each variant's concurrency as brute does instead of fixing it at
   2 × max_batch_size × instance_count, so that both searches compare like with like.
   model_analyzer's documentation claims quick search reaches > 95 % of the best objective while
   measuring < 10 % of the space; `bench/tune_search.py` measures ours.

The two variant searches are written as batch policies (`brute_batches`, `quick_batches`): each
batch holds variants whose measurements do not depend on one another, and its figures come back
together. `one_at_a_time` turns a batch policy into the one-variant protocol above, with the same
sequence; `perfkit tune --workers` measures a batch's variants on several servers at once.

A `Variant` is the set of changes to the model's own configuration; `Variant.apply` makes the
configuration JSON sent to the repository load API. Everything else the model's config says is kept.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from perfkit.errors import PerfkitError
from perfkit.tune.objectives import Constraint, Figures, Objective, merit
from perfkit.tune.params import Param, Setting, apply_settings, label

__all__ = [
    "MAX_BINARY_SEARCH_STEPS",
    "SUSTAINED_SHARE",
    "THROUGHPUT_MINIMUM_CONSECUTIVE_TRIES",
    "THROUGHPUT_MINIMUM_GAIN",
    "Batches",
    "Batching",
    "BatchingChoice",
    "Candidate",
    "Grid",
    "Space",
    "SpaceSpec",
    "Variant",
    "brute_batches",
    "brute_search",
    "build_space",
    "concurrency_sweep",
    "default_variant",
    "doubling",
    "neighbours_in",
    "one_at_a_time",
    "quick_batches",
    "quick_search",
    "rate_sweep",
    "sustains",
    "variant_of",
]

THROUGHPUT_MINIMUM_GAIN = 0.05
THROUGHPUT_MINIMUM_CONSECUTIVE_TRIES = 4
MAX_BINARY_SEARCH_STEPS = 5
#: An offered rate is sustained when at least this share of it completes (window edges and the
#: interval of a 1 s window cost a few per cent even below saturation).
SUSTAINED_SHARE = 0.9

VariantFeedback = Generator["Variant", "Figures | None", None]
VariantBatches = Generator[list["Variant"], list["Figures | None"], None]


class Candidate(Protocol):
    """What a search proposes: a `Variant` of one model, or a `combination.Combination` of several."""

    @property
    def key(self) -> str: ...

    @property
    def cost(self) -> tuple[float, ...]: ...


C = TypeVar("C", bound=Candidate)
#: A batch policy over candidates of type C (see "the searches" below).
Batches = Generator[list[C], list["Figures | None"], None]


class Grid(Protocol, Generic[C]):
    """What the searches need of a grid: `Space` for one model, `combination.CombinedSpace` for several."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def size(self) -> int: ...

    def variant(self, coord: Sequence[int]) -> C: ...

    def coordinates(self) -> list[tuple[int, ...]]: ...

    def neighbours(self, coord: Sequence[int], dims: int = 1) -> list[tuple[int, ...]]: ...

    def nearest(self, variant: C) -> tuple[int, ...]: ...


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


# --- concurrency ----------------------------------------------------------------------------------


def _plateaued(throughputs: Sequence[float], tries: int, min_gain: float) -> bool:
    if len(throughputs) < tries:
        return False
    window = throughputs[-tries:]
    first = window[0]
    return first > 0 and (max(window) - first) / first < min_gain


def concurrency_sweep(
    start: int,
    end: int,
    constraints: Sequence[Constraint] = (),
    *,
    min_gain: float = THROUGHPUT_MINIMUM_GAIN,
    tries: int = THROUGHPUT_MINIMUM_CONSECUTIVE_TRIES,
    max_binary_steps: int = MAX_BINARY_SEARCH_STEPS,
) -> Generator[int, Figures | None, None]:
    """Concurrency levels to measure for one variant; send each level's figures (None: it failed)."""
    bounds = [c for c in constraints if c.tightens_with_load]
    throughputs: list[float] = []
    passing, failing = 0, 0
    for level in doubling(start, end):
        figures = yield level
        if figures is None:
            return
        if not all(c.holds(figures) for c in bounds):
            failing = level
            break
        passing = level
        throughputs.append(figures["throughput"].value)
        if _plateaued(throughputs, tries, min_gain):
            return
    if not failing:
        return
    for _ in range(max_binary_steps):
        middle = (passing + failing) // 2
        if middle <= passing:  # adjacent: the boundary is found (or level 1 already fails)
            return
        figures = yield middle
        if figures is None:
            return
        if all(c.holds(figures) for c in bounds):
            passing = middle
        else:
            failing = middle


def sustains(figures: Figures | None, rate: float, constraints: Sequence[Constraint] = ()) -> bool:
    """Whether an open-loop level at `rate` kept up with it within the bounds that tighten with load."""
    if figures is None or "throughput" not in figures:
        return False
    if figures["throughput"].value < SUSTAINED_SHARE * rate:
        return False
    return all(c.holds(figures) for c in constraints if c.tightens_with_load)


def rate_sweep(
    start: int, end: int, constraints: Sequence[Constraint] = (), *, max_binary_steps: int = MAX_BINARY_SEARCH_STEPS
) -> Generator[int, Figures | None, None]:
    """Request rates (per second, whole numbers) to offer one variant; send each level's figures."""
    passing, failing = 0, 0
    for rate in doubling(start, end):
        figures = yield rate
        if not sustains(figures, rate, constraints):
            failing = rate
            break
        passing = rate
    if not failing or not passing:  # all sustained, or not even START: nothing to bisect
        return
    for _ in range(max_binary_steps):
        middle = (passing + failing) // 2
        if middle <= passing:
            return
        figures = yield middle
        if sustains(figures, middle, constraints):
            passing = middle
        else:
            failing = middle


# --- variants and the grid ------------------------------------------------------------------------


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


# --- the searches ---------------------------------------------------------------------------------
#
# Each search is written as a batch policy: it yields a list of variants whose measurements do not
# depend on one another, and receives their figures, in the same order, once all are measured. With
# one server they are measured one after another (`one_at_a_time` gives the single-variant protocol
# the tuner drives); with several, `perfkit tune --workers` measures a batch's variants at once.


def one_at_a_time(batches: Batches[C]) -> Generator[C, Figures | None, None]:
    """A batch policy as a single-variant policy: each batch's variants in order, then the batch's
    figures sent back together. The sequence of variants is the batch policy's, flattened."""
    try:
        batch = next(batches)
    except StopIteration:
        return
    while True:
        figures: list[Figures | None] = []
        for variant in batch:
            figures.append((yield variant))
        try:
            batch = batches.send(figures)
        except StopIteration:
            return


def brute_batches(space: Grid[C], default: C) -> Batches[C]:
    """The default, then the whole grid, in one batch: no variant depends on another's result."""
    variants = [default]
    seen = {default.key}
    for coord in space.coordinates():
        variant = space.variant(coord)
        if variant.key not in seen:
            seen.add(variant.key)
            variants.append(variant)
    yield variants


def brute_search(space: Grid[C], default: C) -> Generator[C, Figures | None, None]:
    """The default, then the whole grid (feedback is not needed, but received like quick's)."""
    return one_at_a_time(brute_batches(space, default))


def quick_batches(
    space: Grid[C], default: C, objective: Objective, constraints: Sequence[Constraint] = ()
) -> Batches[C]:
    """Hill climbing from the grid point nearest the default (see the module header). A batch is the
    default with the first home, or the part of one neighbourhood not yet measured: the climb looks
    at a neighbourhood's results only once all of them are in."""
    by_key: dict[str, Figures | None] = {}
    results: dict[tuple[int, ...], Figures | None] = {}

    def measure(coords: Sequence[tuple[int, ...]], first: Sequence[C] = ()) -> Batches[C]:
        batch = list(first)
        for coord in coords:
            variant = space.variant(coord)
            if variant.key not in by_key and variant.key not in {v.key for v in batch}:
                batch.append(variant)
        if batch:
            by_key.update(zip((v.key for v in batch), (yield batch)))
        for coord in coords:
            results[coord] = by_key[space.variant(coord).key]

    def merit_of(coord: tuple[int, ...]) -> tuple[float, ...]:
        return merit(results[coord], objective, constraints)

    home = space.nearest(default)
    yield from measure([home], first=[default])
    homes: set[tuple[int, ...]] = set()
    while home not in homes:
        homes.add(home)
        # Along the axes first; diagonally only where no axis move helps: two settings that pay
        # off only together (dynamic batching and a larger max_batch_size) form a ridge that axis
        # moves cannot climb.
        for dims in (1, 2):
            around = space.neighbours(home, dims)
            yield from measure([c for c in around if c not in results])
            # Ties go to the cheaper variant, so that a flat dimension does not pull the climb up.
            best = max(around, key=lambda c: (merit_of(c), tuple(-x for x in space.variant(c).cost)), default=home)
            if merit_of(best) > merit_of(home):
                home = best
                break
        else:
            return


def quick_search(
    space: Grid[C], default: C, objective: Objective, constraints: Sequence[Constraint] = ()
) -> Generator[C, Figures | None, None]:
    """Hill climbing from the grid point nearest the default (see the module header)."""
    return one_at_a_time(quick_batches(space, default, objective, constraints))
