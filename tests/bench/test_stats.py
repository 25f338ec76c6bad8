"""bench/stats.py: the one definition of the percentiles, CDFs and summaries the benchmarks report."""
import math
import statistics

import numpy as np
import pytest

from ninfer_jax.bench import stats


def test_nearest_rank_is_a_value_present():
    xs = [5.0, 1.0, 4.0, 2.0, 3.0]  # unsorted: sorted inside
    assert stats.percentile(xs, 0.0) == 1.0
    assert stats.percentile(xs, 0.5) == 3.0  # sorted(xs)[int(0.5 * 5)]
    assert stats.percentile(xs, 0.99) == 5.0
    assert stats.percentile(xs, 1.0) == 5.0
    hundred = list(range(1, 101))
    assert stats.percentile(hundred, 0.5) == 51 and stats.percentile(hundred, 0.99) == 100
    assert stats.percentile([1.0, 2.0], 0.5) == 2.0  # the upper middle, not the mean


def test_nones_are_left_out_and_no_values_give_empty():
    assert stats.percentile([None, 3.0, None, 1.0], 0.5) == 3.0
    assert stats.percentile([], 0.5) is None and stats.percentile([None], 0.99) is None
    assert math.isnan(stats.percentile([], 0.5, method="linear", empty=float("nan")))


@pytest.mark.parametrize("q", [0.0, 0.25, 0.5, 0.9, 0.99, 1.0])
def test_linear_is_numpys_percentile_to_the_bit(q):
    xs = list(np.random.default_rng(0).exponential(size=37))
    assert stats.percentile(xs, q, method="linear") == float(np.percentile(xs, 100 * q))


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="method"):
        stats.percentile([1.0], 0.5, method="nearest")
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        stats.percentile([1.0], 99)  # q is a share, not a percent


def test_summary_names_and_orders_its_figures():
    xs = [0.3, None, 0.1, 0.2]
    got = stats.summary(xs, "cold_ttft", with_mean=True)
    assert list(got) == ["cold_ttft_mean_s", "cold_ttft_p50_s", "cold_ttft_p99_s"]
    assert got == {"cold_ttft_mean_s": statistics.fmean([0.1, 0.2, 0.3]), "cold_ttft_p50_s": 0.2,
                   "cold_ttft_p99_s": 0.3}
    assert stats.summary([None], "max_gap") == {"max_gap_p50_s": None, "max_gap_p99_s": None}
    assert stats.summary([1, 2, 3], "x", unit="_us", quantiles=(("p90", 0.9),)) == {"x_p90_us": 3}


def test_cdf_ratio_percent_median():
    assert stats.cdf([3.0, 1.0, 2.0, 2.0]) == ([1.0, 2.0, 2.0, 3.0], [0.25, 0.5, 0.75, 1.0])
    assert stats.ratio(1, 3) == 0.333 and stats.ratio(None, 3) is None and stats.ratio(1, 0) is None
    assert stats.percent(1, 3) == 33.3 and stats.percent(5, 0) == 0.0
    assert stats.median([1.0, 4.0, 2.0, 3.0]) == 2.5
