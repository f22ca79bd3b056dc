"""Spread of repeated measurements, judged robustly.

One slow outlier in twenty runs (a page fault, a clock dip, another process) must not
make a stage "unstable" nor move its figure: the median is the figure, the spread is
the median absolute deviation (MAD, scaled by 1.4826 so it estimates a standard
deviation for normal data) and the interquartile range, and outliers -- runs outside
the Tukey fences (1.5 x IQR beyond the quartiles) -- are counted, never silently
averaged in. Mean and standard deviation are kept for reference.
"""
from __future__ import annotations

import functools
import math
import statistics

STABLE_REL_SPREAD = 0.02      # robust spread (1.4826 x MAD / median) at or under 2%: stable
MAD_TO_SIGMA = 1.4826
# The fewest samples with a 95% interval of their median: the widest interval there is, from the smallest to the
# largest, holds the median with probability 1 - 2 / 2**n, 96.9% for six samples but 93.8% for five and 50% for
# two. With fewer there is no 95% interval: it is missing (NaN), and nothing is judged from it.
MIN_CI_SAMPLES = 6
# The drift check compares thirds of the timed runs, each with its median's 95% interval, so six runs each at
# least. (With three, each interval would be the third's whole range, and three runs all above three others
# happen by chance one time in ten: a CPU profile of 10 runs on a busy 2-core host was flagged so.)
DRIFT_MIN_RUNS = 3 * MIN_CI_SAMPLES
OUTLIER_MIN_RUNS = 4          # the fewest runs whose quartiles leave room for a run outside the Tukey fences


def quartiles(vals: list[float]) -> tuple[float, float]:
    if len(vals) < 2:
        return vals[0], vals[0]
    q = statistics.quantiles(vals, n=4, method="inclusive")
    return q[0], q[2]


def robust_rel_spread(vals: list[float]) -> float:
    """1.4826 x MAD / median: a standard deviation's worth of spread, as a fraction, robust to outliers."""
    med = statistics.median(vals)
    mad = statistics.median(abs(v - med) for v in vals)
    return MAD_TO_SIGMA * mad / med if med > 0 else 0.0


def median_interval(vals: list[float]) -> tuple[float, float]:
    """Distribution-free 95% interval of the median from order statistics: (x_(k), x_(n+1-k)) with k the largest
    rank whose interval holds the median with probability at least 95% for any continuous distribution
    (``median_rank``); (NaN, NaN) under MIN_CI_SAMPLES samples, where no interval holds the median that often."""
    s = sorted(vals)
    k = median_rank(len(s))
    if k == 0:
        return math.nan, math.nan
    return s[k - 1], s[len(s) - k]


@functools.lru_cache(maxsize=4096)
def median_rank(n: int, tail: float = 0.025) -> int:
    """The largest 1-based rank k with P(Binomial(n, 1/2) <= k - 1) <= ``tail``: the sample median's interval
    (x_(k), x_(n+1-k)) then misses the true median with probability 2 x that tail at most, exactly -- not the
    normal approximation's ranks n/2 -/+ 1.96 sqrt(n)/2, which taken as 0-based indices held it only 92-95% of
    the time (92.2% at 16 samples). 0 where no rank qualifies (under six samples)."""
    if n < MIN_CI_SAMPLES:
        return 0
    log_half = n * math.log(2.0)
    lgn = math.lgamma(n + 1)

    def below(m: int) -> float:       # P(X <= m), summed from m down: the terms fall fast below the median's ranks
        total = 0.0
        for j in range(m, -1, -1):
            term = math.exp(lgn - math.lgamma(j + 1) - math.lgamma(n - j + 1) - log_half)
            total += term
            if term < total * 1e-17:
                break
        return total

    k = max(0, math.floor(n / 2 - 1.96 * math.sqrt(n) / 2))     # near the answer; walked to it exactly
    while k > 0 and below(k - 1) > tail:
        k -= 1
    while below(k) <= tail:
        k += 1
    return k


def outlier_runs(n: int) -> str:
    return f"{n} outlier run{'' if n == 1 else 's'}"


def robust_of(sp: dict) -> float:
    """A spread's robust relative spread; for a trace written before it was recorded, from its samples, else
    its relative stdev (the best that trace has)."""
    if "robust_rel_spread" in sp:
        return sp["robust_rel_spread"]
    return robust_rel_spread(sp["samples"]) if sp.get("samples") else sp.get("rel_stdev", 0.0)


def spread(values: list[float]) -> dict:
    vals = [float(v) for v in values]
    if not vals:
        return {"runs": 0}
    med = statistics.median(vals)
    sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
    q1, q3 = quartiles(vals)
    iqr = q3 - q1
    # Under four runs the quartiles are the runs themselves and no run can fall outside the fences: not a count
    # of zero outliers but none taken (None).
    outliers = sum(v < q1 - 1.5 * iqr or v > q3 + 1.5 * iqr for v in vals) if len(vals) >= OUTLIER_MIN_RUNS else None
    robust = robust_rel_spread(vals)
    lo, hi = median_interval(vals)
    return {
        "runs": len(vals), "median": med, "min": min(vals), "max": max(vals),
        "q1": q1, "q3": q3, "iqr": iqr, "mad": statistics.median(abs(v - med) for v in vals),
        "robust_rel_spread": robust, "outliers": outliers,
        "median_ci95": [lo, hi],
        "mean": statistics.fmean(vals), "stdev": sd, "rel_stdev": sd / med if med > 0 else 0.0,
        # Judged on the robust spread, from MIN_CI_SAMPLES runs: two runs 0.8% apart are no evidence of a stable
        # plan (nor three far apart of an unstable one, on a busy host). Fewer: None, not judged.
        "stable": robust <= STABLE_REL_SPREAD if len(vals) >= MIN_CI_SAMPLES else None,
        # The raw timed-run samples, so `compare` can judge a change against them.
        "samples": vals,
    }


def intervals_apart(a, b) -> bool:
    """Whether two (lo, hi) intervals do not overlap: the two medians they bracket are resolved apart."""
    return a[1] < b[0] or a[0] > b[1]


def drift(totals: list[float]) -> dict:
    """Were the timed runs still changing? The medians of their first and last thirds with each median's 95%
    interval: a change the intervals resolve (they do not overlap) is ``significant``, and the plan's median
    then mixes two levels."""
    n = len(totals)
    if n < DRIFT_MIN_RUNS:
        return {"checked": False, "why": f"{n} timed runs: the check needs {DRIFT_MIN_RUNS} (it compares the first "
                                         f"and last thirds, {MIN_CI_SAMPLES} runs each at least)"}
    k = n // 3
    first, last = totals[:k], totals[-k:]
    f, lst = statistics.median(first), statistics.median(last)
    fi, li = median_interval(first), median_interval(last)
    return {"checked": True, "runs_per_third": k, "first_third_median": f, "last_third_median": lst,
            "first_ci95": list(fi), "last_ci95": list(li), "change": (lst - f) / f if f > 0 else 0.0,
            "significant": intervals_apart(fi, li)}


def repeated_later(timed: dict, later_median: float, later_ci95) -> dict:
    """The timed runs against the same kind of run (every stage marked) repeated later in the profile, in the
    instrumentation pairs. ``timed`` is the timed runs' total spread (``spread``). Where the two medians' 95%
    intervals do not overlap (``apart``), the machine's pace moved between the two batches: the figures of the
    pairs (the bare plan, end to end, the stage times without the other marks) were taken at another level than
    the timed runs', and compare only with each other. On the lent H200 a default join's timed runs read 861.2 us
    and the same runs in the pairs, later in the same profile, 686.6 us."""
    med, (lo, hi) = timed["median"], timed["median_ci95"]
    return {"timed_median": med, "timed_ci95": [lo, hi], "later_median": later_median,
            "later_ci95": list(later_ci95), "change": (later_median - med) / med if med > 0 else 0.0,
            # With either interval missing (too few runs) nothing is judged: not apart, and ``compared`` says so.
            "compared": all(math.isfinite(v) for v in (lo, hi, *later_ci95)),
            "apart": intervals_apart(later_ci95, (lo, hi))}
