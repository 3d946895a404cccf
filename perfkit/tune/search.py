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

What the searches propose and walk is in `perfkit.tune.space`: a `Variant` of one model's
configuration and the grid of them (`Space`), seen here only through the `Candidate` and `Grid`
protocols, so that the same searches walk `multi.study`'s combinations of several models.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Generic, Protocol, TypeVar

from perfkit.tune.objectives import Constraint, Figures, Objective, merit
from perfkit.tune.space import doubling

__all__ = [
    "MAX_BINARY_SEARCH_STEPS",
    "SUSTAINED_SHARE",
    "THROUGHPUT_MINIMUM_CONSECUTIVE_TRIES",
    "THROUGHPUT_MINIMUM_GAIN",
    "Batches",
    "Candidate",
    "Grid",
    "brute_batches",
    "brute_search",
    "concurrency_sweep",
    "one_at_a_time",
    "quick_batches",
    "quick_search",
    "rate_sweep",
    "sustains",
]

THROUGHPUT_MINIMUM_GAIN = 0.05
THROUGHPUT_MINIMUM_CONSECUTIVE_TRIES = 4
MAX_BINARY_SEARCH_STEPS = 5
#: An offered rate is sustained when at least this share of it completes (window edges and the
#: interval of a 1 s window cost a few per cent even below saturation).
SUSTAINED_SHARE = 0.9


class Candidate(Protocol):
    """What a search proposes: a `Variant` of one model, or a `multi.study.Combination` of several."""

    @property
    def key(self) -> str: ...

    @property
    def cost(self) -> tuple[float, ...]: ...


C = TypeVar("C", bound=Candidate)
#: A batch policy over candidates of type C (see "the searches" below).
Batches = Generator[list[C], list["Figures | None"], None]


class Grid(Protocol, Generic[C]):
    """What the searches need of a grid: `Space` for one model, `multi.study.CombinedSpace` for several."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def size(self) -> int: ...

    def variant(self, coord: Sequence[int]) -> C: ...

    def coordinates(self) -> list[tuple[int, ...]]: ...

    def neighbours(self, coord: Sequence[int], dims: int = 1) -> list[tuple[int, ...]]: ...

    def nearest(self, variant: C) -> tuple[int, ...]: ...


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
