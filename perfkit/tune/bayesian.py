"""`perfkit tune --search bayesian`: a model-based search over the tune's grid, beside brute and quick.

Theory of operation. Brute search measures every grid point; quick search climbs from the default
and stops at a local optimum. A model-based search spends a fixed number of measurements
(`--search-budget`) where a model of the results so far expects the most: here optuna's
Tree-structured Parzen Estimator (Bergstra et al., "Algorithms for Hyper-Parameter Optimization",
NeurIPS 2011; optuna's `TPESampler`, multivariate as Falkner et al.'s BOHB uses it), which splits the
measured points into a good and a bad share by their objective and proposes the point where the
density of the good share is highest relative to the bad. It needs no gradient or smoothness, takes
integer and categorical dimensions as they are, and copes with noisy measurements, which is what a
tune has.

The mapping:

* Each grid dimension is an integer parameter, the index into its values (ordered, so that TPE's
  kernels see neighbouring batch sizes as near each other).
* The value told back is the variant's objective score (`Objective.score`, the weighted log of the
  figures), the number brute and quick rank by; constraints are told as optuna constraints (the
  sum of relative excesses, feasible at 0), so that TPE, as quick search's `merit` does, prefers
  feasible variants and, among infeasible ones, those nearest feasibility. A variant that fails
  is a failed trial: TPE leaves it out of its model and does not propose it again by choice.
* The default configuration is measured first, outside the model (it may lie off the grid), then
  the grid point nearest to it is the first trial, so that the model starts where quick search
  starts; the next trials up to `n_startup_trials` are random (TPE's own start, a third of the
  budget, 2 to 10), the rest are proposed by the model.
* A proposal already measured is answered from what was measured, without a measurement: only
  new variants count against the budget. After REPEATS_BEFORE_EXPLORING such proposals in a row
  the model has converged on what it knows, and the next trial is a grid point not yet measured,
  drawn at random (seeded), so that the budget is spent rather than the proposals. The search
  ends at the budget or when every variant of the grid is measured.

The sampler is seeded (`--seed`), so a tune against the same measurements proposes the same
variants: a resumed tune replays the search against its checkpoint, as brute and quick do. Each
batch is one variant, because each proposal waits for the result before it: with --workers the
endpoints take turns rather than measure at once.
`bench/tune_search.py` compares the three searches: the best found against measurements spent.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Generator, Sequence
from typing import Any

from perfkit.errors import PerfkitError
from perfkit.tune.objectives import Constraint, Figures, Objective
from perfkit.tune.search import Batches, C, Grid, one_at_a_time

__all__ = ["REPEATS_BEFORE_EXPLORING", "bayesian_batches", "bayesian_search", "default_budget"]

#: Proposals of measured variants in a row after which an unmeasured one is tried instead.
REPEATS_BEFORE_EXPLORING = 3


def default_budget(space: Grid[Any]) -> int:
    """A quarter of the grid, at least 8 variants (model_analyzer's quick search claims to need
    under a tenth; TPE's random start alone takes a few)."""
    return max(8, space.size // 4)


def _sampler(seed: int, startup: int) -> Any:
    try:
        import optuna
    except ImportError:
        raise PerfkitError(
            "--search bayesian needs optuna: pip install 'perfkit[bayesian]' (or pip install optuna)"
        ) from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "Trial N finished" line per variant
    with warnings.catch_warnings():  # multivariate TPE is marked experimental
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup, multivariate=True)
    return optuna.create_study(direction="maximize", sampler=sampler)


def bayesian_batches(
    space: Grid[C],
    default: C,
    objective: Objective,
    constraints: Sequence[Constraint] = (),
    *,
    budget: int = 0,
    seed: int = 0,
) -> Batches[C]:
    """TPE over the grid's indexes within `budget` variants (0: `default_budget`); one variant a
    batch, since each proposal depends on every result before it."""
    from optuna.trial import TrialState

    budget = budget or default_budget(space)
    study = _sampler(seed, max(2, min(10, budget // 3)))
    names = [f"dim{i}" for i in range(len(space.shape))]
    grid = {space.variant(c).key: c for c in space.coordinates()}
    distinct = len(set(grid) | {default.key})
    rng = random.Random(seed)
    by_key: dict[str, Figures | None] = {}
    (by_key[default.key],) = yield [default]
    study.enqueue_trial(dict(zip(names, space.nearest(default))))
    repeats = 0
    while len(by_key) < min(budget, distinct):
        if repeats >= REPEATS_BEFORE_EXPLORING:
            unmeasured = [c for k, c in grid.items() if k not in by_key]
            study.enqueue_trial(dict(zip(names, rng.choice(unmeasured))))
        trial = study.ask()
        coord = tuple(trial.suggest_int(name, 0, size - 1) for name, size in zip(names, space.shape))
        variant = space.variant(coord)
        repeats = repeats + 1 if variant.key in by_key else 0
        if variant.key not in by_key:
            (by_key[variant.key],) = yield [variant]
        figures = by_key[variant.key]
        if figures is None:
            study.tell(trial, state=TrialState.FAIL)
            continue
        trial.set_constraint("excess", sum(c.excess(figures) or 0.0 for c in constraints))
        study.tell(trial, objective.score(figures).value)


def bayesian_search(
    space: Grid[C],
    default: C,
    objective: Objective,
    constraints: Sequence[Constraint] = (),
    *,
    budget: int = 0,
    seed: int = 0,
) -> Generator[C, Figures | None, None]:
    """`bayesian_batches` as a one-variant-at-a-time policy."""
    return one_at_a_time(bayesian_batches(space, default, objective, constraints, budget=budget, seed=seed))
