"""perfkit.analysis.significance: the two-sample tests against known values."""

from __future__ import annotations

import math

import pytest

from perfkit.analysis.significance import (
    _t_two_sided,
    _u_counts,
    mann_whitney_min_p,
    mann_whitney_u,
    regularized_beta,
    student_t_quantile,
    welch_t_test,
)


@pytest.mark.parametrize(("m", "n"), [(1, 1), (3, 3), (4, 7), (10, 10)])
def test_u_distribution_counts_every_ordering_once_and_is_symmetric(m: int, n: int) -> None:
    counts = _u_counts(m, n)
    assert len(counts) == m * n + 1
    assert sum(counts) == math.comb(m + n, m)
    assert counts == counts[::-1]


def test_mann_whitney_exact_p_values() -> None:
    # Complete separation: the most extreme of C(10, 5) = 252 orderings, on both sides.
    assert mann_whitney_u([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) == (0.0, pytest.approx(2 / 252))
    assert mann_whitney_u([6, 7, 8, 9, 10], [1, 2, 3, 4, 5]) == (25.0, pytest.approx(2 / 252))
    # 3 against 3 cannot do better than 0.1, which is why the gate falls back to Welch there.
    assert mann_whitney_u([1, 2, 3], [4, 5, 6])[1] == pytest.approx(0.1)
    assert mann_whitney_min_p(3, 3) == pytest.approx(0.1)
    assert mann_whitney_min_p(4, 4) == pytest.approx(2 / 70)
    # One swap: U = 1, P(U <= 1) = 2/252 for m = n = 5, so p = 4/252 (scipy: 0.015873).
    assert mann_whitney_u([1, 2, 3, 4, 6], [5, 7, 8, 9, 10])[1] == pytest.approx(4 / 252)
    # Identical samples: every comparison a tie, p = 1.
    assert mann_whitney_u([5, 5, 5], [5, 5, 5]) == (4.5, 1.0)


@pytest.mark.parametrize("shift", [0.0, 2.5, 4.5, 7.5])
def test_mann_whitney_normal_approximation_agrees_with_the_exact_test(shift: float) -> None:
    x = [float(i) for i in range(20)]
    y = [i + shift for i in range(20)]
    u_exact, p_exact = mann_whitney_u(x, y, exact=True)
    u_normal, p_normal = mann_whitney_u(x, y, exact=False)
    assert u_exact == u_normal
    assert p_normal == pytest.approx(p_exact, abs=0.01)


def test_mann_whitney_uses_the_normal_approximation_beyond_20_values() -> None:
    x = [float(i) for i in range(30)]
    y = [i + 10.5 for i in range(30)]
    u, p = mann_whitney_u(x, y)
    assert u == 190.0  # pairs with x_i > y_j: i >= j + 11
    z = (abs(190 - 450) - 0.5) / math.sqrt(30 * 30 * 61 / 12)
    assert p == pytest.approx(math.erfc(z / math.sqrt(2)))


def test_regularized_beta_known_values() -> None:
    assert regularized_beta(1.0, 1.0, 0.3) == pytest.approx(0.3)
    assert regularized_beta(2.5, 2.5, 0.5) == pytest.approx(0.5)
    assert regularized_beta(2.0, 3.0, 0.4) == pytest.approx(0.5248)  # 1 - (1-x)^4 - 4x(1-x)^3
    assert regularized_beta(0.5, 0.5, 0.0) == 0.0 and regularized_beta(0.5, 0.5, 1.0) == 1.0


@pytest.mark.parametrize("n", [2, 3, 6, 31])
def test_welch_p_value_is_alpha_at_the_t_quantile(n: int) -> None:
    # Equal sizes and variances make Welch's df exactly 2(n - 1); shifting one sample by the 95%
    # critical value of that t distribution (stats.student_t_quantile, A&S 26.7) must give p = 0.05.
    x = [float(i) for i in range(n)]
    mean = sum(x) / n
    variance = sum((v - mean) ** 2 for v in x) / (n - 1)
    critical = student_t_quantile(0.95, 2 * (n - 1))
    t, df, p = welch_t_test([v + critical * math.sqrt(2 * variance / n) for v in x], x)
    assert df == pytest.approx(2 * (n - 1))
    assert t == pytest.approx(critical)
    assert p == pytest.approx(0.05, abs=1e-9)


def test_welch_t_test_known_value_and_degenerate_cases() -> None:
    # t = (3 - 6) / sqrt(2.5/5 + 10/5) = -1.8974, df = 2.5² / (0.5²/4 + 2²/4) = 5.882; so p lies
    # between the two-sided tails of t(5) and t(6) at |t| (A&S 26.7 via stats).
    t, df, p = welch_t_test([1, 2, 3, 4, 5], [2, 4, 6, 8, 10])
    assert t == pytest.approx(-3 / math.sqrt(2.5)) and df == pytest.approx(6.25 / (0.0625 + 1.0))
    tails = [1 - _t_two_sided(math.atan(abs(t) / math.sqrt(k)), k) for k in (6, 5)]
    assert tails[0] < p < tails[1]
    assert welch_t_test([3, 3], [3, 3])[2] == 1.0
    assert welch_t_test([3, 3], [4, 4])[2] == 0.0
    with pytest.raises(ValueError):
        welch_t_test([1.0], [1.0, 2.0])
