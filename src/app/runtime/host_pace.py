"""The host CPU's own pace during the timed runs: a fixed pure-Python loop, timed just before every timed run.

Why: a plan that is bound by its host's launches (the default join and overlay on a GPU) runs at the pace of
the CPU that launches it, and on the lent cloud hosts that pace moves by itself. Four profiles of the same
default join, run back to back in four processes on one H100 host, read 404, 684, 409 and 617 us; this loop
read 50.5, 76.4, 48.2 and 64.3 us in them. Within one process it moves too: a loop of 3,000 iterations took
147 us in some batches of 30 runs and up to 261 us in others, seconds apart, with no GPU work in it, and the
join's time after the build moved from 148 to 320 us with it (rank correlation +0.83 over 20 batches). Such a
change looks like drift, or like a regression between two profiles, and no warm-up steadies it. The loop does
the same work every time, so when its time moves it is the machine that changed speed: the report and compare
say so instead of blaming the plan or asking for more warm-up.

What the loop cannot see: a slowdown of the GPU, the driver or the PCIe link alone; and within a profile it
often finds nothing to explain (rank correlations of -0.16 to +0.49 in ten H100 profiles, above chance in
one). It times the interpreter on one core between runs; its own jitter (a timer tick, an interrupt) lands in
its spread, not its median.
"""
from __future__ import annotations

import math
import time

from app.runtime.stats import drift, spread

LOOP_ITERATIONS = 1000      # about 30-80 us of interpreter time on the hosts we run on: small beside a flush
MIN_RUNS_FOR_CORRELATION = 10


def loop_seconds() -> float:
    """One timing of the fixed loop: the same bytecode, the same integers, every call."""
    t0 = time.perf_counter()
    acc = 0
    for i in range(LOOP_ITERATIONS):
        acc += i * i
    return time.perf_counter() - t0


def rank_correlation(a: list[float], b: list[float]) -> float | None:
    """Spearman's rank correlation (ties get their average rank); None where either side has no spread."""
    import pandas as pd     # here, not at import: event mode's start-up does not load pandas

    rho = pd.DataFrame({"a": a, "b": b}).corr(method="spearman").iloc[0, 1]
    return None if math.isnan(rho) else float(rho)


LOOP = {"loop_iterations": LOOP_ITERATIONS,
        "how": f"host clock around a fixed pure-Python loop ({LOOP_ITERATIONS} integer multiply-adds) just before "
               "every timed run, outside its timed region: the same work each time, so its time is the host CPU's "
               "pace"}


def summarise(pace: list[float], totals: list[float], what: dict | None = None) -> dict:
    """The loop's times beside the runs they preceded: their spread, their own drift check (the same one the
    runs get), and how closely the runs' totals followed them. ``what`` names the work timed (the loop's by
    default; app.runtime.launch_pace passes its launches').

    ``follows`` is true where the rank correlation is above what independent series reach one time in forty
    (1.96 / sqrt(n - 1), Spearman's large-sample bound): the plan ran slower where the host did."""
    sp = spread(pace)
    out = {**(what or LOOP), "runs": len(pace),
           **{k: sp[k] for k in ("median", "median_ci95", "min", "max", "q1", "q3", "robust_rel_spread")},
           "samples": sp["samples"], "drift": drift(pace)}
    if len(pace) != len(totals) or len(pace) < MIN_RUNS_FOR_CORRELATION:
        return out | {"rank_correlation": None,
                      "why_no_correlation": f"{len(pace)} timings for {len(totals)} runs: the correlation needs "
                                            f"one per run and at least {MIN_RUNS_FOR_CORRELATION}"}
    rho = rank_correlation(pace, totals)
    bound = 1.96 / math.sqrt(len(pace) - 1)
    return out | {"rank_correlation": rho, "chance_bound": bound, "follows": rho is not None and rho > bound}


def moved_with_runs(pace: dict | None, runs_drift: dict | None) -> bool:
    """Whether the host's pace changed the same way as the runs did: both drift checks resolved a change, in the
    same direction (a slower loop and slower runs, or both faster)."""
    if not pace or not runs_drift or not runs_drift.get("significant"):
        return False
    own = pace.get("drift") or {}
    return bool(own.get("significant")) and (own["change"] > 0) == (runs_drift["change"] > 0)
