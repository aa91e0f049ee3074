"""Noise: a mean with its 95% interval, and whether one profile is faster than another.

The samples are per-run figures: one bench run's mean per-request decode tok/s. Repeats of a
profile at one load level are the samples of its mean. The interval is Student's t. The comparison
is Welch's t-test (unequal variances). Both come from scipy.

scipy is imported inside the functions. So the CLI starts without it, and only a command that
compares pays for it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

#: How `compare` names the method, for a heading or a JSON field.
METHOD = "Welch's t-test on per-run mean tok/s, p < 0.05"
ALPHA = 0.05
CONFIDENCE = 0.95

Verdict = Literal["faster", "slower", "within noise", "too few runs"]


@dataclass(frozen=True)
class Interval:
    """The mean of `n` samples and its confidence interval; low and high are None for one sample."""

    mean: float
    low: float | None
    high: float | None
    n: int

    @property
    def half_width(self) -> float | None:
        return None if self.high is None else self.high - self.mean


def interval(samples: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """Student's t interval of the mean: mean ± t(confidence, n-1) * s / sqrt(n)."""
    if not samples:
        raise ValueError("an interval needs at least one sample")
    n, mean = len(samples), statistics.fmean(samples)
    if n == 1:
        return Interval(mean, None, None, 1)
    sem = statistics.stdev(samples) / math.sqrt(n)
    if sem == 0:
        return Interval(mean, mean, mean, n)
    from scipy import stats

    half = float(stats.t.ppf((1 + confidence) / 2, n - 1)) * sem
    return Interval(mean, mean - half, mean + half, n)


@dataclass(frozen=True)
class Comparison:
    """Samples against a baseline's: the verdict, Welch's p-value (None without one) and the ratio
    of the means (None where the baseline's mean is not positive)."""

    verdict: Verdict
    p_value: float | None
    ratio: float | None


def compare(samples: Sequence[float], baseline: Sequence[float], alpha: float = ALPHA) -> Comparison:
    """Welch's two-sided t-test of the means: faster or slower when p < alpha, else within noise.

    Fewer than two runs on either side cannot show noise at all: "too few runs", ratio still
    given. Two sides without any spread (a deterministic stand-in) are decided by their means:
    the t statistic is undefined there, and equal means are within noise.
    """
    if not samples or not baseline:
        raise ValueError("a comparison needs samples on both sides")
    mean, base = statistics.fmean(samples), statistics.fmean(baseline)
    ratio = mean / base if base > 0 else None
    if len(samples) < 2 or len(baseline) < 2:
        return Comparison("too few runs", None, ratio)
    if statistics.pvariance(samples) == 0 and statistics.pvariance(baseline) == 0:
        if mean == base:
            return Comparison("within noise", 1.0, ratio)
        return Comparison("faster" if mean > base else "slower", 0.0, ratio)
    from scipy import stats

    p = float(stats.ttest_ind(samples, baseline, equal_var=False).pvalue)
    if math.isnan(p):  # scipy's answer to input it cannot test; not a difference shown
        return Comparison("within noise", None, ratio)
    if p >= alpha:
        return Comparison("within noise", p, ratio)
    return Comparison("faster" if mean > base else "slower", p, ratio)
