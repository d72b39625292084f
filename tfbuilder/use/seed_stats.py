"""How far a sweep's numbers are from noise: intervals over seeds and paired differences between recipes.

Every interval here is Student's t: for ``n`` values with mean ``m`` and sample standard deviation
``s``, ``m ± t(q, n - 1) * s / sqrt(n)`` with ``q = (1 + confidence) / 2`` (0.975 for a 95 % interval),
the t quantile from :data:`scipy.stats.t`. A difference between two recipes is *paired*: taken seed by
seed over the seeds both ran, so what the seed changes for both (initialisation, data order) cancels.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

CONFIDENCE = 0.95  # of every interval in a report
MAX_SEEDS = 10_000  # seeds_needed looks no further


def _quantile(confidence: float) -> float:
    """The upper t quantile of a two-sided interval: 0.975 for 95 %."""
    return (1 + confidence) / 2


@dataclass(frozen=True)
class Interval:
    """The mean of ``n`` values and the half-width of its Student t confidence interval (``None``
    with one value: one seed has no spread)."""

    mean: float
    half: float | None
    sd: float | None
    n: int

    @property
    def low(self) -> float | None:
        return None if self.half is None else self.mean - self.half

    @property
    def high(self) -> float | None:
        return None if self.half is None else self.mean + self.half


def t_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> Interval | None:
    """Mean ± ``t(q, n-1) * s / sqrt(n)`` (Student's t interval of the mean, ``s`` the sample standard
    deviation); ``None`` for no values, no half-width for one."""
    if not values:
        return None
    data = np.asarray(values, dtype=float)
    n = len(data)
    mean = float(data.mean())
    if n < 2:
        return Interval(mean, None, None, n)
    sd = float(data.std(ddof=1))
    half = float(stats.t.ppf(_quantile(confidence), n - 1)) * sd / math.sqrt(n)
    return Interval(mean, half, sd, n)


@dataclass(frozen=True)
class Paired:
    """A recipe minus the baseline, seed by seed over ``seeds`` (the seeds both ran)."""

    seeds: tuple[int, ...]
    difference: Interval | None  # of the per-seed differences; None when no seed matches

    @property
    def judged(self) -> bool:
        """Whether there is an interval to judge by: two matching seeds or more."""
        return self.difference is not None and self.difference.half is not None

    @property
    def within_noise(self) -> bool | None:
        """Whether the interval of the difference contains 0 (``None`` when it cannot be judged)."""
        if not self.judged or self.difference is None or self.difference.half is None:
            return None
        return abs(self.difference.mean) <= self.difference.half


def paired_difference(
    values: Mapping[int, float], baseline: Mapping[int, float], confidence: float = CONFIDENCE
) -> Paired:
    """``values[seed] - baseline[seed]`` over the seeds in both, with its Student t interval
    (:func:`t_interval`); seeds only one side ran are left out."""
    seeds = tuple(sorted(values.keys() & baseline.keys()))
    diffs = [values[s] - baseline[s] for s in seeds]
    return Paired(seeds, t_interval(diffs, confidence))


def seeds_needed(difference: Interval | None, confidence: float = CONFIDENCE) -> int | None:
    """The fewest seeds ``n >= 2`` at which a paired difference of this mean and standard deviation
    would leave noise: the smallest ``n`` with ``t(q, n-1) * sd / sqrt(n) < |mean|`` (Student's t).
    ``None`` when the mean difference is 0 or the spread unknown (fewer than two matching seeds), or
    when more than :data:`MAX_SEEDS` would be needed."""
    if difference is None or difference.sd is None or difference.mean == 0:
        return None
    n = np.arange(2, MAX_SEEDS + 1)
    half = stats.t.ppf(_quantile(confidence), n - 1) * difference.sd / np.sqrt(n)
    enough = np.flatnonzero(half < abs(difference.mean))
    return int(n[enough[0]]) if enough.size else None
