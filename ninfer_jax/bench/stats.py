"""Percentiles, CDFs and summaries for every benchmark in bench/: one definition of each.

`percentile(values, q)` takes q in [0, 1] and, by default, the nearest rank over the sorted
values (`sorted(xs)[min(n - 1, int(q * n))]`): a value some request really had, so a p99 over
100 requests is the largest. The engine benchmark reports numpy's linearly interpolated
percentile instead (`method="linear"`, numpy's own arithmetic), and keeps it so its figures stay
comparable with earlier runs. `summary` gives the `{name}_mean/_p50/_p99{unit}` figures a
benchmark reports for one distribution (None where it has no values), `cdf` the points of an
empirical CDF for a plot, `ratio` and `percent` the rounded quotients the reports print.
`median` is the standard library's (the mean of the two middle values for an even count).
"""
from __future__ import annotations

import statistics
from typing import Iterable, Sequence

METHODS = ("nearest_rank", "linear")

median = statistics.median
mean = statistics.fmean


def percentile(values: Iterable[float | None], q: float, *, method: str = "nearest_rank", empty=None):
    """The q-quantile (q in [0, 1]) of `values`, None entries left out; `empty` when none is left.

    nearest_rank: `sorted(xs)[min(n - 1, int(q * n))]`, a value present in `values`.
    linear: `numpy.quantile(xs, q)`, interpolated between the two nearest ranks (the same
    arithmetic as `numpy.percentile(xs, 100 * q)`)."""
    if method not in METHODS:
        raise ValueError(f"unknown percentile method {method!r}; choose one of {METHODS}")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must lie in [0, 1], got {q!r}")
    xs = sorted(x for x in values if x is not None)
    if not xs:
        return empty
    if method == "linear":
        import numpy as np

        return float(np.quantile(xs, q))
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def summary(values: Iterable[float | None], name: str, *, unit: str = "_s", with_mean: bool = False,
            quantiles: Sequence[tuple[str, float]] = (("p50", 0.5), ("p99", 0.99)),
            method: str = "nearest_rank") -> dict:
    """`{name}_mean{unit}` (with_mean) and `{name}_{label}{unit}` for each (label, q) of
    `quantiles`, over the values that are not None; each None when there are none."""
    xs = sorted(x for x in values if x is not None)
    out = {}
    if with_mean:
        out[f"{name}_mean{unit}"] = statistics.fmean(xs) if xs else None
    for label, q in quantiles:
        out[f"{name}_{label}{unit}"] = percentile(xs, q, method=method)
    return out


def cdf(values: Iterable[float]) -> tuple[list[float], list[float]]:
    """The empirical CDF's points: the sorted values and, for the i-th (from 0), (i + 1) / n."""
    xs = sorted(values)
    return xs, [(i + 1) / len(xs) for i in range(len(xs))]


def ratio(a, b, digits: int = 3):
    """a / b rounded to `digits`; None when a is None or b is 0 or None."""
    return round(a / b, digits) if a is not None and b else None


def percent(part: float, whole: float, digits: int = 1) -> float:
    """100 part / whole rounded to `digits`; 0.0 when whole is 0."""
    return round(100.0 * part / whole, digits) if whole else 0.0
