"""Whether two samples differ beyond their own variability: the two-sample tests `perfkit compare` uses.

Pure functions, no scipy (asv `_stats.py` computes the same): the two-sided **Mann–Whitney U** test,
exact by the Mann–Whitney recursion for up to 20 values a side and by the normal approximation with
tie and continuity corrections beyond; **Welch's t** test, with Student's t through the regularised
incomplete beta function (Numerical Recipes, 3rd ed., §6.4, modified Lentz continued fraction); and
`windows_differ`, which picks Mann–Whitney when the sample sizes can reach significance at all (its
smallest p-value is 2 / C(m+n, m): 0.1 for 3 values against 3, 0.029 for 4 against 4) and falls back
to Welch otherwise, as asv does when Mann–Whitney cannot decide (`_stats.py::is_different`). Also
Student's t critical values for confidence intervals (`student_t_quantile`, from the closed form of
Abramowitz & Stegun 26.7.3-4), which the level statistics, the tuner and the token figures use.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "Significance",
    "mann_whitney_min_p",
    "mann_whitney_u",
    "regularized_beta",
    "student_t_quantile",
    "welch_t_test",
    "windows_differ",
]


def _u_counts(m: int, n: int) -> list[int]:
    """How many of the C(m+n, m) orderings of m x's and n y's give U = u, for u = 0..mn. Built from
    the recursion N(m, n, u) = N(m−1, n, u−n) + N(m, n−1, u) (Mann & Whitney 1947): the largest of
    all m+n values is either an x, beating all n y's, or a y, beating nothing."""
    # rows[j] holds N(i, j, ·) for the current i; start with i = 0: one ordering, U = 0.
    rows = [[1] for _ in range(n + 1)]
    for i in range(1, m + 1):
        new = [[1]]  # N(i, 0, ·): U = 0 only
        for j in range(1, n + 1):
            left = new[j - 1]  # N(i, j−1, ·)
            up = rows[j]  # N(i−1, j, ·), shifted by j
            size = i * j + 1
            counts = [0] * size
            for u, c in enumerate(left):
                counts[u] += c
            for u, c in enumerate(up):
                counts[u + j] += c
            new.append(counts)
        rows = new
    return rows[n]


def mann_whitney_u(x: Sequence[float], y: Sequence[float], exact: bool | None = None) -> tuple[float, float]:
    """Two-sided Mann–Whitney U test: (U of x, p). Exact (by default up to 20 values a side; ties
    counted as one half, then the p-value rounded the conservative way), else the normal
    approximation with tie and continuity corrections."""
    m, n = len(x), len(y)
    if m == 0 or n == 0:
        raise ValueError("Mann–Whitney U needs values on both sides")
    u = sum(1.0 if a > b else 0.5 if a == b else 0.0 for a in x for b in y)
    extreme = min(u, m * n - u)  # distance into the nearer tail
    if exact if exact is not None else max(m, n) <= 20:
        counts = _u_counts(m, n)
        tail = sum(counts[: math.ceil(extreme) + 1])
        return u, min(1.0, 2.0 * tail / math.comb(m + n, m))
    values = sorted([*x, *y])
    tie_term = 0.0
    i = 0
    while i < len(values):
        j = i
        while j < len(values) and values[j] == values[i]:
            j += 1
        t = j - i
        tie_term += t**3 - t
        i = j
    total = m + n
    variance = m * n / 12.0 * ((total + 1) - tie_term / (total * (total - 1)))
    if variance <= 0:
        return u, 1.0
    z = (abs(u - m * n / 2.0) - 0.5) / math.sqrt(variance)  # continuity correction
    return u, min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2.0)))


def mann_whitney_min_p(m: int, n: int) -> float:
    """The smallest two-sided p-value the exact test can give for these sample sizes."""
    return min(1.0, 2.0 / math.comb(m + n, m))


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function, modified Lentz's method."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for k in range(1, 500):
        for numerator in (
            k * (b - k) * x / ((a + 2 * k - 1) * (a + 2 * k)),
            -(a + k) * (a + b + k) * x / ((a + 2 * k) * (a + 2 * k + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def regularized_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularised incomplete beta function."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def welch_t_test(x: Sequence[float], y: Sequence[float]) -> tuple[float, float, float]:
    """Welch's unequal-variance t test, two-sided: (t, degrees of freedom, p). Needs two values a
    side; identical constant samples give p = 1, different constant samples p = 0."""
    m, n = len(x), len(y)
    if m < 2 or n < 2:
        raise ValueError("Welch's t test needs at least two values a side")
    mean_x, mean_y = sum(x) / m, sum(y) / n
    var_x = sum((v - mean_x) ** 2 for v in x) / (m - 1)
    var_y = sum((v - mean_y) ** 2 for v in y) / (n - 1)
    se2 = var_x / m + var_y / n
    if se2 == 0.0:
        return (
            (0.0, float(m + n - 2), 1.0) if mean_x == mean_y else (math.copysign(math.inf, mean_x - mean_y), 0.0, 0.0)
        )
    t = (mean_x - mean_y) / math.sqrt(se2)
    df = se2**2 / ((var_x / m) ** 2 / (m - 1) + (var_y / n) ** 2 / (n - 1))
    return t, df, regularized_beta(df / 2.0, 0.5, df / (df + t * t))


@dataclass(frozen=True, slots=True)
class Significance:
    """Whether two runs differ beyond their own variability, and how that was decided."""

    significant: bool
    method: str
    p_value: float | None = None
    detail: str = ""


def windows_differ(a: Sequence[float], b: Sequence[float], alpha: float, what: str) -> Significance:
    """Mann–Whitney U on per-window values when it can reach `alpha`, else Welch's t."""
    a = [v for v in a if math.isfinite(v)]
    b = [v for v in b if math.isfinite(v)]
    if len(a) < 2 or len(b) < 2:
        return Significance(False, "none", None, f"fewer than 2 {what} in a run: no noise estimate")
    if mann_whitney_min_p(len(a), len(b)) < alpha:
        _, p = mann_whitney_u(a, b)
        method = "Mann-Whitney U"
    else:
        _, _, p = welch_t_test(a, b)
        method = "Welch t"
    return Significance(p < alpha, method, p, f"p={p:.3g} ({method}, {len(a)} vs {len(b)} {what})")


def student_t_quantile(confidence: float, df: int) -> float:
    """Two-sided critical value t with P(|T| <= t) = confidence for Student's t with integer df."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence {confidence} is outside (0, 1)")
    if df < 1:
        raise ValueError(f"degrees of freedom {df} < 1")
    low, high = 0.0, math.pi / 2
    for _ in range(200):  # bisection on θ = atan(t/√df); A(θ) is increasing
        mid = (low + high) / 2
        if _t_two_sided(mid, df) < confidence:
            low = mid
        else:
            high = mid
    return math.sqrt(df) * math.tan((low + high) / 2)


def _t_two_sided(theta: float, df: int) -> float:
    """A(t|df) = P(|T| <= t) with θ = atan(t/√df), Abramowitz & Stegun 26.7.3 (odd) and 26.7.4 (even)."""
    c, s = math.cos(theta), math.sin(theta)
    if df % 2 == 0:
        term = total = 1.0
        for k in range(1, df // 2):
            term *= c * c * (2 * k - 1) / (2 * k)
            total += term
        return s * total
    if df == 1:
        return 2.0 * theta / math.pi
    term = total = c
    for k in range(1, (df - 1) // 2):
        term *= c * c * (2 * k) / (2 * k + 1)
        total += term
    return 2.0 / math.pi * (theta + s * total)
