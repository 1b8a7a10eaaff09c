"""Seed statistics for `fp4 reproduce`: mean, sample standard deviation, Student's t
distribution, and the paired one-sided t-test a claim's verdict rests on.

Every run of a study is one seed of one arm (a recipe or a sweep point), and the arms of a seed
share its initialization and data order, so a claim is judged on per-seed *contrasts*: for
"A closes at least F of B's gap", c_s = (1 - F) gap_B,s - gap_A,s, positive where the claim holds
at seed s. Over n seeds, the paired t-test:

    mean = sum(c) / n,  sd = sqrt(sum((c - mean)^2) / (n - 1)),  se = sd / sqrt(n)
    t = mean / se, with n - 1 degrees of freedom

and the two-sided 90% confidence interval mean +- t_0.95(n - 1) se. The verdict at level
alpha = 0.05, one-sided each way (the two one-sided tests the interval shows):

    reproduced       the interval lies above 0 (p of "c <= 0" below alpha)
    not reproduced   the interval lies below 0 (p of "c >= 0" below alpha)
    inconclusive     the interval holds 0: the seeds' spread is wider than the effect

With fewer than 2 seeds there is no spread to judge by: always inconclusive.

The t distribution's CDF is the regularized incomplete beta function, evaluated with its
continued fraction (modified Lentz); quantiles by bisection on the CDF. Pure Python and numpy:
no scipy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

ALPHA = 0.05  # each one-sided test's level
MIN_SEEDS = 2  # a verdict needs a spread: never on one seed
REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced", "inconclusive"
_EPS = 1e-15
_TINY = 1e-300


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """(mean, sample standard deviation with n - 1); the std of one value is nan."""
    array = np.asarray(values, dtype=np.float64)
    if array.size == 0:
        return math.nan, math.nan
    std = float(array.std(ddof=1)) if array.size > 1 else math.nan
    return float(array.mean()), std


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` > 0 degrees of freedom."""
    if df <= 0:
        raise ValueError(f"degrees of freedom must be positive (got {df})")
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    tail = 0.5 * beta_regularized(df / 2.0, 0.5, df / (df + t * t))  # P(T > |t|)
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p, for 0 < p < 1 (bisection on t_cdf)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must lie in (0, 1) (got {p})")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        high *= 2.0
    for _ in range(200):
        middle = 0.5 * (low + high)
        if t_cdf(middle, df) < p:
            low = middle
        else:
            high = middle
        if high - low <= 1e-12 * max(1.0, high):
            break
    return 0.5 * (low + high)


def beta_regularized(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function, for a, b > 0 and 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    front = math.exp(log_front)
    if x < (a + 1.0) / (a + b + 2.0):  # the continued fraction converges fast here
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of I_x(a, b), by the modified Lentz method."""
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    result = d
    for m in range(1, 500):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + numerator / c
            c = c if abs(c) > _TINY else _TINY
            result *= c * d
        if abs(c * d - 1.0) < _EPS:
            break
    return result


def _exact_t(mean: float) -> float:
    """t when every seed's contrast is the same: infinite with its sign, 0 if it is 0."""
    return math.copysign(math.inf, mean) if mean != 0.0 else 0.0


@dataclass(frozen=True)
class PairedTest:
    """The paired one-sided t-test of per-seed contrasts (positive: the claim holds)."""

    n: int
    mean: float
    std: float
    t: float  # nan with fewer than 2 seeds
    df: int
    p_holds: float  # P-value of "mean <= 0": small when the claim holds
    p_fails: float  # P-value of "mean >= 0": small when it fails
    low: float  # the two-sided (1 - 2 alpha) confidence interval of the mean
    high: float
    verdict: str


def paired_test(contrasts: Sequence[float], alpha: float = ALPHA) -> PairedTest:
    """The test and verdict of per-seed contrasts (non-finite ones must be left out first)."""
    values = [float(c) for c in contrasts]
    if not all(math.isfinite(c) for c in values):
        raise ValueError("contrasts must be finite")
    n = len(values)
    mean, std = mean_std(values)
    if n < MIN_SEEDS:
        return PairedTest(
            n,
            mean,
            std,
            math.nan,
            max(n - 1, 0),
            math.nan,
            math.nan,
            math.nan,
            math.nan,
            INCONCLUSIVE,
        )
    df = n - 1
    se = std / math.sqrt(n)
    t = mean / se if se > 0.0 else _exact_t(mean)
    p_holds = 1.0 - t_cdf(t, df)
    p_fails = t_cdf(t, df)
    half = t_quantile(1.0 - alpha, df) * se
    verdict = INCONCLUSIVE
    if mean != 0.0 and p_holds < alpha:
        verdict = REPRODUCED
    elif mean != 0.0 and p_fails < alpha:
        verdict = NOT_REPRODUCED
    return PairedTest(n, mean, std, t, df, p_holds, p_fails, mean - half, mean + half, verdict)
