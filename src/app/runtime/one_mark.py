"""Stage times from runs that carry one stage mark each: what every stage takes with no other stage's mark in its run.

A CUDA timing event is not free. On the lent H200 hosts the record call takes about 1.1 us of host time; before
the GPU writes the timestamp it finishes all the work queued before it, so the kernel after it starts from an
idle stream (about 1.8 us where the GPU is the bound); and the launches after it can be slower still. That cost
lands after the mark: in a run marked at every stage boundary, each stage carries the cost of the mark that
starts it, and the plan carries one a stage -- 2-7% of the plan at the default sizes, and up to a quarter of a
short stage.

Here every round of the instrumentation pairs -- the plan once bare (the run's first and last marks only) and
once marked at every stage boundary, as the timed runs are -- also runs it once with a single mark at the end of
each stage but the last: n + 1 runs a round for n stages, in an order shuffled afresh every round, each after the
same L2 step as the timed runs (app.runtime.timing.instrumentation_overhead). The run marked at the end of stage k
gives C_k, the time from its first mark to that one; the round's bare run gives C_n, the whole plan; C_0 = 0.
Then in each round

    stage k = C_k - C_(k-1),

and a stage's time is the median over the rounds, with the distribution-free 95% interval of that median. C_k
carries no mark's cost but the run's first, which the bare plan has too: its own mark's lands after its
timestamp. The runs of one round are taken side by side, so the machine's slow and fast moments touch both
terms of a difference alike. Beside each stage: its time in the same rounds' every-stage-marked run, and what
the other marks add to it (the median of the rounds' differences, with its interval).

Each one-mark run carries one mark more than a bare run: their overhead -- each against the bare run of its
round, one figure a round (the median of its runs' differences) -- is the instrumentation overhead of these stage
times.

The price is noise. A difference of two runs has the spread of the plan up to the stage, not of the stage alone,
so the intervals are wider than the timed runs'. A stage whose interval reaches zero is not resolved by these
runs: the report shows it, and draws no conclusion from it.
"""
from __future__ import annotations

import statistics

from app.runtime.stats import median_interval

HOW = ("every round of the instrumentation pairs (a bare run and a run marked at every stage boundary) also runs "
       "the plan once with a single stage mark at the end of each stage but the last, the round's runs in a shuffled "
       "order; stage k in a round = the time to the mark after stage k - the time to the mark after stage k-1, each "
       "from its own run (the last stage ends at the bare run's end); medians over the rounds, with their "
       "distribution-free 95% intervals")


def from_rounds(names: list[str], rounds: list[dict], stopped: str) -> dict:
    """The estimate from instrumentation_overhead's ``rounds`` (RunRecords by arm: "bare", "marked", 1..n-1)."""
    samples = []
    for got in rounds:
        row = {"bare": got["bare"].total_seconds, "marked": [s["seconds"] for s in got["marked"].stages],
               "marked_total": got["marked"].total_seconds}
        for k in range(1, len(names)):
            if got[k].to_boundary is None:
                raise RuntimeError(f"the run marked at the end of stage {k} ({names[k - 1]}) recorded no mark there")
            row[k] = (got[k].to_boundary, got[k].total_seconds)
        samples.append(row)
    # The rounds' runs as the estimate reads them, kept so that every figure it gives can be worked out again:
    # "to_boundary" and "one_mark_total" hold the run marked at the end of stage k (k = 1 .. n-1) at index k - 1.
    kept = [{"bare": r["bare"], "marked_total": r["marked_total"], "marked": r["marked"],
             "to_boundary": [r[k][0] for k in range(1, len(names))],
             "one_mark_total": [r[k][1] for k in range(1, len(names))]} for r in samples]
    return {"rounds": len(samples), "stopped": stopped} | estimate(names, samples) | {"samples": kept}


def estimate(names: list[str], samples: list[dict]) -> dict:
    """The stages' times and intervals from the rounds (see the module's docstring), what the other marks add to
    each, and the one-mark runs' own overhead against the bare run of their round."""
    n = len(names)
    to_mark = ([[0.0] * len(samples)] + [[r[k][0] for r in samples] for k in range(1, n)]
               + [[r["bare"] for r in samples]])
    stages = []
    for k, name in enumerate(names, start=1):
        steps = [b - a for a, b in zip(to_mark[k - 1], to_mark[k])]
        marked = [r["marked"][k - 1] for r in samples]
        added = [m - s for m, s in zip(marked, steps)]
        lo, hi = median_interval(steps)
        stages.append({"name": name, "seconds": statistics.median(steps), "ci95": [lo, hi], "resolved": lo > 0,
                       "marked_seconds": statistics.median(marked),
                       "marks_add_seconds": statistics.median(added), "marks_add_ci95": list(median_interval(added))})
    bare = statistics.median(r["bare"] for r in samples)
    out = {"bare_median_seconds": bare, "marked_median_seconds": statistics.median(r["marked_total"] for r in samples),
           "stage_sum_seconds": sum(s["seconds"] for s in stages), "stages": stages, "how": HOW}
    # One figure a round: the median of its one-mark runs' differences from its bare run. The n - 1 differences
    # of a round share that bare run, so pooling them all into one interval would count a round's noise n - 1
    # times over (a 95% interval held the truth 83% of the time in simulation); the rounds are independent.
    diffs = [statistics.median(r[k][1] - r["bare"] for k in range(1, n)) for r in samples] if n > 1 else []
    if diffs:
        lo, hi = median_interval(diffs)
        mid = statistics.median(diffs)
        out |= {"overhead_seconds": mid, "overhead_fraction": mid / bare if bare > 0 else None,
                "overhead_ci95": [lo / bare, hi / bare] if bare > 0 else None}
    return out
