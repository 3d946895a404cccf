"""perfkit.tune.search and .space: the concurrency policy, the grid and the brute and quick searches, driven by synthetic
performance models (pure functions of the load or of the variant); no server, no clock."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Generator, Sequence

import pytest

from perfkit.tune.objectives import Constraint, Estimate, Figures, Objective, merit, parse_constraint, parse_objective
from perfkit.tune.search import brute_search, concurrency_sweep, quick_search
from perfkit.tune.space import Batching, BatchingChoice, Space, Variant, doubling, variant_of

THROUGHPUT = Objective()


def figures(throughput: float, p99_ms: float = 1.0) -> Figures:
    return {"throughput": Estimate.exact(throughput), "p99_ms": Estimate.exact(p99_ms)}


def drive(gen: Generator[int, Figures | None, None], server: Callable[[int], Figures | None]) -> list[int]:
    """Run a concurrency policy against a synthetic server; the levels it asked for, in order."""
    asked = []
    try:
        level = next(gen)
        while True:
            asked.append(level)
            level = gen.send(server(level))
    except StopIteration:
        return asked


def saturating(capacity: float, per_client: float = 100.0) -> Callable[[int], Figures]:
    """A closed-loop server: throughput grows with clients up to `capacity`; latency by Little's law."""

    def server(concurrency: int) -> Figures:
        throughput = min(concurrency * per_client, capacity)
        return figures(throughput, p99_ms=1000.0 * concurrency / throughput)

    return server


# --- concurrency ----------------------------------------------------------------------------------


def test_doubling_is_model_analyzers_list() -> None:
    assert doubling(1, 64) == [1, 2, 4, 8, 16, 32, 64]
    assert doubling(3, 20) == [3, 6, 12]
    assert doubling(8, 4) == []


def test_sweep_goes_to_the_end_while_throughput_grows() -> None:
    assert drive(concurrency_sweep(1, 64), saturating(capacity=1e9)) == [1, 2, 4, 8, 16, 32, 64]


def test_sweep_stops_once_the_last_four_gain_under_five_percent() -> None:
    # Saturated from 4 on: the window [4, 8, 16, 32] is flat, so 64 is never measured.
    assert drive(concurrency_sweep(1, 1024), saturating(capacity=400.0)) == [1, 2, 4, 8, 16, 32]


def test_a_four_percent_gain_counts_as_a_plateau_and_six_does_not() -> None:
    def growing(rate: float) -> Callable[[int], Figures]:
        return lambda c: figures(1000.0 * (1 + rate) ** math.log2(c) / 3 if c > 1 else 1000.0 / 3)

    # Gains per doubling: over 3 steps 1.0133^3 - 1 = 4 % < 5 %: stop at the fourth level.
    assert drive(concurrency_sweep(1, 64), growing(0.0133)) == [1, 2, 4, 8]
    assert drive(concurrency_sweep(1, 64), growing(0.02)) == [1, 2, 4, 8, 16, 32, 64]


def queueing(concurrency: int) -> Figures:
    """Throughput still grows, but p99 is `concurrency` ms."""
    return figures(1000.0 * concurrency, p99_ms=float(concurrency))


def test_sweep_bisects_the_latency_bound() -> None:
    # p99 <= 20 holds up to 20 exactly.
    server = queueing
    asked = drive(concurrency_sweep(1, 1024, [parse_constraint("p99_ms<=20")]), server)
    assert asked[:6] == [1, 2, 4, 8, 16, 32]  # stops at the first failing level
    assert asked[6:] == [24, 20, 22, 21]  # bisection between 16 (pass) and 32 (fail)
    assert max(c for c in asked if c <= 20) == 20


def test_bisection_is_bounded_to_five_steps() -> None:
    server = queueing
    asked = drive(concurrency_sweep(1, 4096, [parse_constraint("p99_ms<=1000")]), server)
    assert asked[:11] == doubling(1, 1024)
    assert asked[11:] == [768, 896, 960, 992, 1008]


def test_a_first_level_over_the_bound_ends_the_sweep_or_bisects_below_start() -> None:
    server = queueing
    assert drive(concurrency_sweep(1, 64, [parse_constraint("p99_ms<=0.5")]), server) == [1]
    assert drive(concurrency_sweep(4, 64, [parse_constraint("p99_ms<=1")]), server) == [4, 2, 1]


def test_a_throughput_floor_is_not_bisected_and_a_failed_level_stops() -> None:
    server = saturating(capacity=1e9)
    assert drive(concurrency_sweep(1, 8, [parse_constraint("throughput>=250")]), server) == [1, 2, 4, 8]
    assert drive(concurrency_sweep(1, 64), lambda c: None if c == 4 else server(c)) == [1, 2, 4]


# --- variants -------------------------------------------------------------------------------------


BASE = {
    "name": "m",
    "max_batch_size": 64,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
    "dynamic_batching": {"max_queue_delay_microseconds": 100, "preferred_batch_size": [64], "preserve_ordering": True},
    "instance_group": [{"count": 1, "kind": "KIND_CPU"}, {"count": 2, "kind": "KIND_CPU"}],
}


def test_apply_changes_only_the_searched_fields() -> None:
    config = Variant(3, 8, Batching(500, (8,))).apply(BASE)
    assert config["instance_group"] == [{"count": 3, "kind": "KIND_CPU"}]
    assert config["max_batch_size"] == 8
    assert config["dynamic_batching"] == {
        "max_queue_delay_microseconds": 500,
        "preferred_batch_size": [8],
        "preserve_ordering": True,
    }
    assert config["input"] == BASE["input"] and BASE["max_batch_size"] == 64  # the base is not touched
    off = Variant(1, 4, None, "KIND_GPU").apply(BASE)
    assert "dynamic_batching" not in off and off["instance_group"] == [{"count": 1, "kind": "KIND_GPU"}]
    # A base preferred size larger than the variant's max_batch_size must not survive.
    assert Variant(1, 2, Batching(0)).apply(BASE)["dynamic_batching"]["preferred_batch_size"] == []


def test_a_model_that_does_not_batch_keeps_max_batch_size_zero() -> None:
    assert Variant(2, 0, None).apply({**BASE, "max_batch_size": 0})["max_batch_size"] == 0


def test_variant_of_reads_a_config_back() -> None:
    assert variant_of(BASE) == Variant(3, 64, Batching(100, (64,)), "KIND_CPU")
    assert variant_of({"max_batch_size": 0}) == Variant(1, 0, None)
    assert variant_of({"instance_group": [{"count": 2, "kind": "KIND_AUTO"}]}).kind == ""
    v = Variant(2, 8, Batching(100, (8,)), "KIND_GPU")
    assert variant_of(v.apply(BASE)) == v


def test_keys_and_costs() -> None:
    assert Variant(2, 8, Batching(100, (8,))).key == "count=2 mbs=8 batching=100us/pref8"
    assert Variant(1, 4, None, "KIND_GPU").key == "count=1 mbs=4 batching=off kind=gpu"
    assert Variant(1, 64, None).cost < Variant(2, 1, None).cost < Variant(2, 1, Batching(0)).cost
    assert BatchingChoice(100, "max").resolve(16) == Batching(100, (16,))


# --- synthetic landscapes for the variant searches ------------------------------------------------


def space_of(counts: int = 5, max_batch: int = 128, delays: Sequence[int] = (0, 100, 500)) -> Space:
    return Space(
        tuple(range(1, counts + 1)),
        tuple(doubling(1, max_batch)),
        (None, *(BatchingChoice(d) for d in delays)),
    )


Landscape = Callable[[Variant], Figures | None]


def mlp_like(cores: int = 3) -> Landscape:
    """Instances help up to the cores and then contend; batching multiplies throughput with the
    batch size (diminishing, and too large a batch thrashes caches); the queue delay adds a little
    throughput and latency; p99 grows with the batch and the delay."""

    def land(v: Variant) -> Figures:
        instances = min(v.instance_count, cores) - 0.15 * max(0, v.instance_count - cores)
        if v.batching is None:
            batch_gain, p99 = 1.0, 2.0 * v.instance_count
        else:
            b = v.max_batch_size
            batch_gain = (1 + math.log2(b)) * (0.97 ** max(0, b - 16)) * (1 + v.batching.delay_us / 5000)
            p99 = 2.0 + 0.25 * b + v.batching.delay_us / 100
        return figures(500.0 * instances * batch_gain, p99)

    return land


def separable(seed: int) -> tuple[Space, Landscape]:
    """A random landscape whose log is a sum of unimodal functions of each coordinate."""
    rng = random.Random(seed)
    space = space_of(counts=rng.randint(2, 6), max_batch=2 ** rng.randint(3, 7), delays=(0, 100, 500, 1000))
    peaks = [rng.randrange(n) for n in space.shape]
    slopes = [rng.uniform(0.05, 0.5) for _ in space.shape]
    lookup = {space.variant(c).key: c for c in space.coordinates()}

    def land(v: Variant) -> Figures:
        coord = lookup.get(v.key) or space.nearest(v)
        log = sum(-s * abs(c - p) for c, p, s in zip(coord, peaks, slopes))
        return figures(1000.0 * math.exp(log))

    return space, land


def run(search: Generator[Variant, Figures | None, None], land: Landscape) -> dict[str, Figures | None]:
    """Drive a variant search; every variant it measured (in order) with its figures."""
    measured: dict[str, Figures | None] = {}
    try:
        variant = next(search)
        while True:
            assert variant.key not in measured, f"{variant.key} measured twice"
            measured[variant.key] = land(variant)
            variant = search.send(measured[variant.key])
    except StopIteration:
        return measured


def best(measured: dict[str, Figures | None], objective: Objective, constraints: Sequence[Constraint]) -> str:
    return max(measured, key=lambda k: merit(measured[k], objective, constraints))


DEFAULT = Variant(1, 64, Batching(100))  # the demo MLP's own config: off the grid (delay 100 is)


def test_brute_visits_the_default_then_every_grid_point_once() -> None:
    space = space_of(counts=2, max_batch=8, delays=(0,))
    measured = run(brute_search(space, DEFAULT), mlp_like())
    keys = list(measured)
    assert keys[0] == DEFAULT.key
    assert set(keys[1:]) == {space.variant(c).key for c in space.coordinates()}
    assert len(keys) == space.size + 1
    # Instance count outermost, as model_analyzer's automatic brute search.
    assert keys[1:5] == [
        "count=1 mbs=1 batching=off",
        "count=1 mbs=1 batching=0us",
        "count=1 mbs=2 batching=off",
        "count=1 mbs=2 batching=0us",
    ]


def test_brute_does_not_measure_a_grid_point_equal_to_the_default_twice() -> None:
    space = space_of(counts=2, max_batch=8, delays=(0,))
    default = space.variant((0, 3, 1, 0))
    assert len(run(brute_search(space, default), mlp_like())) == space.size


@pytest.mark.parametrize("cores", [1, 2, 3, 4])
def test_quick_finds_the_optimum_of_the_mlp_like_landscape_with_few_measurements(cores: int) -> None:
    space = space_of()
    land = mlp_like(cores)
    brute = run(brute_search(space, DEFAULT), land)
    quick = run(quick_search(space, DEFAULT, THROUGHPUT), land)
    assert best(quick, THROUGHPUT, ()) == best(brute, THROUGHPUT, ())
    assert len(quick) <= len(brute) // 4, (len(quick), len(brute))


@pytest.mark.parametrize("seed", range(40))
def test_quick_reaches_the_optimum_of_separable_landscapes(seed: int) -> None:
    space, land = separable(seed)
    default = space.variant(tuple(n // 2 for n in space.shape))
    brute = run(brute_search(space, default), land)
    quick = run(quick_search(space, default, THROUGHPUT), land)
    top = brute[best(brute, THROUGHPUT, ())]
    found = quick[best(quick, THROUGHPUT, ())]
    assert top is not None and found is not None
    assert found["throughput"].value == pytest.approx(top["throughput"].value)
    assert len(quick) < len(brute)


@pytest.mark.parametrize("bound", [6.0, 10.0, 20.0])
def test_quick_respects_a_latency_constraint(bound: float) -> None:
    space, land = space_of(), mlp_like(3)
    constraints = [parse_constraint(f"p99_ms<={bound}")]
    brute = run(brute_search(space, DEFAULT), land)
    quick = run(quick_search(space, DEFAULT, THROUGHPUT, constraints), land)
    expected, found = best(brute, THROUGHPUT, constraints), best(quick, THROUGHPUT, constraints)
    found_figures = quick[found]
    assert found_figures is not None and all(c.holds(found_figures) for c in constraints)
    brute_figures = brute[expected]
    assert brute_figures is not None
    assert found_figures["throughput"].value >= 0.95 * brute_figures["throughput"].value


def test_quick_walks_from_an_infeasible_default_to_feasibility() -> None:
    space, land = space_of(), mlp_like(3)
    default = Variant(5, 128, Batching(500))  # p99 = 39 ms
    constraints = [parse_constraint("p99_ms<=8")]
    quick = run(quick_search(space, default, THROUGHPUT, constraints), land)
    brute = run(brute_search(space, default), land)
    assert not constraints[0].holds(quick[default.key] or {})
    assert best(quick, THROUGHPUT, constraints) == best(brute, THROUGHPUT, constraints)


def test_quick_with_a_weighted_latency_objective() -> None:
    space, land = space_of(), mlp_like(3)
    objective = parse_objective("throughput:1,p99_ms:1")
    brute = run(brute_search(space, DEFAULT), land)
    quick = run(quick_search(space, DEFAULT, objective), land)
    top, found = brute[best(brute, objective, ())], quick[best(quick, objective, ())]
    assert top is not None and found is not None
    assert objective.score(found).value >= objective.score(top).value + math.log(0.95)


def test_quick_goes_around_variants_that_fail_to_load() -> None:
    space = Space((1, 2, 3), (1, 2, 4, 8), (None, BatchingChoice(0)), ("KIND_CPU", "KIND_GPU"))
    cpu = mlp_like(3)

    def land(v: Variant) -> Figures | None:
        return None if v.kind == "KIND_GPU" else cpu(v)

    default = Variant(1, 1, None, "KIND_GPU")
    quick = run(quick_search(space, default, THROUGHPUT), land)
    brute = run(brute_search(space, default), land)
    assert quick[default.key] is None
    assert best(quick, THROUGHPUT, ()) == best(brute, THROUGHPUT, ()) == "count=3 mbs=8 batching=0us kind=cpu"


def test_quick_on_a_model_that_does_not_batch_climbs_the_instance_count() -> None:
    space = Space((1, 2, 3, 4, 5, 6), (0,), (None,))
    land = mlp_like(cores=4)
    quick = run(quick_search(space, Variant(1, 0, None), THROUGHPUT), land)
    assert best(quick, THROUGHPUT, ()) == "count=4 mbs=0 batching=off"
    assert len(quick) == 5  # 1, 2, 3, 4, 5: the climb stops when 5 is worse than 4
