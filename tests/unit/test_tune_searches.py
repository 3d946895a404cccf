"""The request-rate search of a variant (`search.rate_sweep`, `tuner.choose_level`, open-loop
figures) and the bayesian variant search (`perfkit.tune.bayesian`), driven by synthetic servers
and landscapes; no server, no clock."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import pytest

from perfkit.errors import PerfkitError
from perfkit.tune.bayesian import bayesian_search, default_budget
from perfkit.tune.objectives import Figures, figures_of, parse_constraint
from perfkit.tune.search import brute_search, quick_search, rate_sweep, sustains
from perfkit.tune.space import Variant
from perfkit.tune.state import TuneSpec
from perfkit.tune.tuner import choose_level
from tests.unit.test_objectives import level
from tests.unit.test_search import (
    DEFAULT,
    THROUGHPUT,
    best,
    drive,
    figures,
    mlp_like,
    run,
    separable,
    space_of,
)

# --- request-rate search --------------------------------------------------------------------------


def open_loop(capacity: float, service_ms: float = 2.0) -> Callable[[int], Figures]:
    """An open-loop server (M/D/1-like): below capacity it completes the offered rate, with a
    latency from the intended send time that grows as 1/(1 − load); at or above it, it completes
    `capacity` and its queue, so the corrected latency, grows without bound (here: 10 s)."""

    def server(rate: int) -> Figures:
        load = rate / capacity
        if load >= 1:
            return figures(capacity, p99_ms=10_000.0)
        return figures(float(rate), p99_ms=service_ms * (1 + load / (2 * (1 - load))) * 3)

    return server


def test_rates_double_while_sustained_then_bisect_the_first_that_is_not() -> None:
    server = open_loop(capacity=1000.0)
    asked = drive(rate_sweep(16, 8192, max_binary_steps=5), server)
    assert asked[:8] == [16, 32, 64, 128, 256, 512, 1024, 2048]
    assert asked[8:] == [1536, 1280, 1152, 1088, 1120]  # five bisection steps
    # Without a latency bound, "sustained" is completing 90 % of the offer: up to capacity / 0.9.
    assert 1000 <= max(r for r in asked if sustains(server(r), r)) <= 1000 / 0.9


def test_a_latency_bound_from_the_intended_send_time_stops_the_rates_below_capacity() -> None:
    server, bound = open_loop(capacity=1000.0), parse_constraint("p99_ms<=12")
    asked = drive(rate_sweep(100, 8192, [bound]), server)
    passing = [r for r in asked if sustains(server(r), r, [bound])]
    # p99 = 6·(1 + ρ/(2(1−ρ))) ms is 12 ms at ρ = 2/3: the highest passing rate is just under 667.
    assert 600 <= max(passing) < 667
    assert all(not bound.holds(server(r)) for r in asked if r not in passing)


def test_a_rate_the_server_does_not_complete_is_not_sustained_even_without_a_constraint() -> None:
    assert sustains(figures(95.0), 100) and not sustains(figures(85.0), 100)
    assert not sustains(None, 100)
    # A throughput floor does not tighten with rate: it neither stops nor fails a rate.
    assert sustains(figures(50.0), 50, [parse_constraint("throughput>=500")])


def test_a_first_rate_not_sustained_or_a_failed_level_ends_the_sweep() -> None:
    assert drive(rate_sweep(2000, 8192), open_loop(capacity=1000.0)) == [2000]
    assert drive(rate_sweep(16, 8192), lambda rate: None) == [16]
    assert drive(rate_sweep(16, 64), open_loop(capacity=1e6)) == [16, 32, 64]


def test_open_loop_figures_are_latencies_from_the_intended_send_time() -> None:
    closed = level(500.0, 4000.0)
    behind = dataclasses.replace(closed.latency_from_intended, p99_us=90_000.0, p99_ci_high_us=95_000.0)
    opened = dataclasses.replace(closed, mode="request_rate", level=500.0, latency_from_intended=behind)
    assert (figures_of(closed) or {})["p99_ms"].value == 4.0
    assert (figures_of(dataclasses.replace(closed, latency_from_intended=behind)) or {})["p99_ms"].value == 4.0
    assert (figures_of(opened) or {})["p99_ms"].value == 90.0


def test_in_rate_mode_a_variant_is_the_highest_rate_it_sustained() -> None:
    def at(rate: float, throughput: float, p99_us: float) -> object:
        return dataclasses.replace(level(throughput, p99_us), mode="request_rate", level=rate)

    levels = [at(100, 100, 3000), at(200, 199, 5000), at(400, 300, 900_000)]  # the last: far behind
    rate_spec = TuneSpec(config_path=None, request_rates=(100, 400))  # type: ignore[arg-type]
    assert choose_level(levels, rate_spec) == 1  # type: ignore[arg-type]
    # Judged as concurrency levels, the one with the most throughput would stand for the variant.
    assert choose_level(levels, TuneSpec(config_path=None)) == 2  # type: ignore[arg-type]
    # Nothing sustained: the best of what was measured, so the variant is still ranked.
    assert choose_level(levels[2:], rate_spec) == 0  # type: ignore[arg-type]


# --- bayesian search ------------------------------------------------------------------------------


def top_throughput(measured: dict[str, Figures | None], constraints: tuple[object, ...] = ()) -> float:
    found = measured[best(measured, THROUGHPUT, constraints)]  # type: ignore[arg-type]
    assert found is not None
    return found["throughput"].value


@pytest.mark.parametrize("cores", [1, 3])
def test_bayesian_finds_the_optimum_of_the_mlp_like_landscape_within_its_budget(cores: int) -> None:
    space, land = space_of(), mlp_like(cores)
    brute = run(brute_search(space, DEFAULT), land)
    bayes = run(bayesian_search(space, DEFAULT, THROUGHPUT, budget=40, seed=0), land)
    assert len(bayes) == 40 and list(bayes)[0] == DEFAULT.key
    assert top_throughput(bayes) >= 0.95 * top_throughput(brute)


def test_bayesian_is_reproducible_with_a_seed_and_varies_with_another() -> None:
    space, land = space_of(), mlp_like(3)
    first = list(run(bayesian_search(space, DEFAULT, THROUGHPUT, budget=15, seed=7), land))
    assert first == list(run(bayesian_search(space, DEFAULT, THROUGHPUT, budget=15, seed=7), land))
    assert first != list(run(bayesian_search(space, DEFAULT, THROUGHPUT, budget=15, seed=8), land))


def test_bayesian_on_separable_landscapes_is_near_the_optimum_on_average() -> None:
    ratios = []
    for seed in range(4):
        space, land = separable(seed)
        default = space.variant(tuple(n // 2 for n in space.shape))
        brute = run(brute_search(space, default), land)
        bayes = run(bayesian_search(space, default, THROUGHPUT, seed=0), land)
        assert len(bayes) <= default_budget(space)
        ratios.append(top_throughput(bayes) / top_throughput(brute))
    assert sum(ratios) / len(ratios) >= 0.9, ratios


def test_bayesian_respects_a_latency_constraint() -> None:
    space, land = space_of(), mlp_like(3)
    bound = (parse_constraint("p99_ms<=10"),)
    brute = run(brute_search(space, DEFAULT), land)
    bayes = run(bayesian_search(space, DEFAULT, THROUGHPUT, bound, budget=40, seed=0), land)
    chosen = bayes[best(bayes, THROUGHPUT, bound)]
    assert chosen is not None and bound[0].holds(chosen)
    assert top_throughput(bayes, bound) >= 0.9 * top_throughput(brute, bound)


def test_bayesian_stops_when_the_grid_is_exhausted_and_goes_around_failures() -> None:
    space = space_of(counts=2, max_batch=2, delays=(0,))  # 2 × 2 × 2 = 8 variants
    cpu = mlp_like(3)

    def land(v: Variant) -> Figures | None:
        return None if v.max_batch_size == 2 and v.batching is None else cpu(v)

    bayes = run(bayesian_search(space, space.variant((0, 0, 0, 0)), THROUGHPUT, budget=50, seed=0), land)
    brute = run(brute_search(space, space.variant((0, 0, 0, 0))), land)
    assert set(bayes) == set(brute) and len(bayes) == space.size
    assert best(bayes, THROUGHPUT, ()) == best(brute, THROUGHPUT, ())


def test_bayesian_spends_fewer_measurements_than_brute_for_what_quick_finds() -> None:
    space, land = space_of(), mlp_like(2)
    quick = run(quick_search(space, DEFAULT, THROUGHPUT), land)
    bayes = run(bayesian_search(space, DEFAULT, THROUGHPUT, seed=0), land)
    assert len(bayes) == default_budget(space) == 40 < space.size
    assert math.isclose(top_throughput(bayes), top_throughput(quick), rel_tol=0.05)


@pytest.mark.parametrize(
    ("changes", "flag"),
    [
        ({"search": "bayesian", "budget": 1}, "--search-budget 1"),
        ({"search": "quick", "budget": 10}, "--search-budget"),
        ({"request_rates": (0, 100)}, "--request-rate-range"),
        ({"request_rates": (10, 5)}, "--request-rate-range"),
        ({"request_rates": (10, 50), "request_distribution": "uniform"}, "--request-distribution"),
        ({"search": "annealing"}, "--search"),
    ],
)
def test_spec_errors_name_the_flag(changes: dict[str, object], flag: str) -> None:
    spec = dataclasses.replace(TuneSpec(config_path=None), **changes)  # type: ignore[arg-type]
    with pytest.raises(PerfkitError, match=flag):
        spec.validate()
