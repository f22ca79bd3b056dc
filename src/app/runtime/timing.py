"""The timed-run loop of event mode, kept as clean as the benchmark harnesses engineers trust.

* L2 between runs (``--l2``): ``flush`` (the default) overwrites a buffer twice the size of
  L2 before every timed run and waits for it, so no run finds the previous run's data
  still cached -- a fresh call with fresh data, which is what the plan is for. ``keep``
  leaves L2 warm (a loop over the same inputs). The flush is outside the timed region.
* Warm-up (``--warmup N|auto``): ``auto`` (the default) runs discarded runs until the plan's
  time stops changing (the medians of the last two windows of runs within 2% of each other,
  after at least half a second), or a budget is spent, and says which stopped it. On the lent
  H200 hosts one warm-up run was not enough: over the next 10-20 runs the build got 20-40%
  faster and join v4's launch-bound plan at 100k x 10k stepped from ~0.6 to ~0.35 ms after the
  build, so a median of 30 timed runs mixed a warming start with the steady state.
* Drift: whether the timed runs were still changing, from the medians of their first and last
  thirds and those medians' 95% intervals (the report flags a change the intervals resolve);
  app.runtime.stats holds the check. Beside it, the host CPU's own pace before every timed run
  (app.runtime.host_pace): whether it was the machine that changed speed.
* How many runs (``--bench_runs N|auto``): ``auto`` runs until the 95% interval of the
  median total is within 1% of it, or a time budget is spent, and says which stopped it.
* Instrumentation overhead: pairs of runs with per-stage marks and bare (one pair of
  marks around the plan), interleaved so drift hits both alike; on a GPU each pair's
  round also runs the plan with one stage mark a run (app.runtime.one_mark), and each bare run
  copies its result back to host arrays: the end-to-end figure, from the same runs as the bare plan's.
* Progress on stderr for any run longer than two seconds.
"""
from __future__ import annotations

import random
import statistics
import sys
import time

from app.runtime.graph import NEW_DATA_SCOPE, build_stages
from app.runtime.stats import median_interval

AUTO_CI = 0.01            # --bench_runs auto: stop when the median's 95% interval is within +-1%
AUTO_BUDGET_SECONDS = 10.0
AUTO_MIN_RUNS = 10
AUTO_MAX_RUNS = 10_000
OVERHEAD_PAIRS = 30        # a 2% target needs more than a handful: the pairs' own spread is ~1%
# On a GPU, pairs go on past OVERHEAD_PAIRS (within the budget) until the estimate's 95% interval is this narrow:
# at the default sizes 30 pairs leave it +-2-4% wide, too wide to say whether the marks stay under 2%.
OVERHEAD_TARGET_CI = 0.005
OVERHEAD_MAX_PAIRS = 400
# On the CPU a mark is a clock read (well under a microsecond): a few pairs show it, and the runs are slow.
OVERHEAD_PAIRS_CPU = 10
OVERHEAD_MIN_PAIRS = 3
OVERHEAD_SHARE = 0.25     # the overhead pairs may add at most this share of the timed runs' time (or 1 s)
L2_MODES = ("flush", "keep")
WARMUP_MIN_SECONDS = 0.5  # --warmup auto: warm for at least this long ...
WARMUP_WINDOW = 5         # ... and until the median of the last WARMUP_WINDOW runs is within
WARMUP_STEADY = 0.02      # this share of the median of the WARMUP_WINDOW before them,
WARMUP_BUDGET_SECONDS = 5.0   # or this long has passed,
# or this many runs: high enough that the 5 s budget ends warm-up first for any plan of 0.25 ms or more. At 500 (until
# 2026-11-28) the default join often stopped short of the 0.5 s minimum: the four captures in tests/data/event
# (H100 and H200) stopped at the cap after 0.26-0.42 s; on an unsteady H200 node one stopped after 0.36 s still
# changing by -14%, and its timed runs read 752.7 us against the same plan's 463.8 us a few seconds later.
WARMUP_MAX_RUNS = 20_000


class L2Flush:
    """Before each timed run: write a buffer twice L2's size on the plan's stream, then wait for it, so the
    run starts with nothing of its own inputs in L2 and no flush still running under its first stage."""

    def __init__(self, selected: str, mode: str, l2_bytes: int | None):
        self.mode, self.buf, self.why = mode, None, None
        if selected != "gpu":
            self.mode, self.why = "n/a", "CPU run: no GPU L2 to flush"
        elif mode == "flush":
            import cupy

            self.cp = cupy
            self.nbytes = 2 * int(l2_bytes or 64 * 2**20)
            self.buf = cupy.empty(self.nbytes, dtype=cupy.uint8)

    def __call__(self) -> None:
        if self.buf is not None:
            stream = self.cp.cuda.get_current_stream()
            self.cp.cuda.runtime.memsetAsync(self.buf.data.ptr, 0, self.nbytes, stream.ptr)
            stream.synchronize()

    def describe(self) -> dict:
        if self.mode == "n/a":
            return {"mode": "n/a", "why": self.why}
        if self.mode == "keep":
            return {"mode": "keep", "why": "--l2 keep: each run may find the previous run's data in L2"}
        return {"mode": "flush", "flush_bytes": self.nbytes,
                "why": "a buffer of twice the L2 size is written and waited for before every timed run"}


class Progress:
    """One line on stderr once a phase has run for ``after`` seconds; rewritten in place on a terminal,
    at most every 5 s in a log."""

    def __init__(self, label: str, after: float = 2.0, stream=None):
        self.label, self.after, self.out = label, after, stream or sys.stderr
        self.t0 = time.monotonic()
        self.last: float | None = None
        self.shown = False
        self.tty = bool(getattr(self.out, "isatty", lambda: False)())

    def update(self, text: str) -> None:
        now = time.monotonic() - self.t0
        if now < self.after or (self.last is not None and now - self.last < (0.5 if self.tty else 5.0)):
            return
        self.last, self.shown = now, True
        line = f"[{self.label}] {text} ({now:.0f} s)"
        self.out.write(("\r" + line + "\033[K") if self.tty else line + "\n")
        self.out.flush()

    def done(self) -> None:
        if self.shown and self.tty:
            self.out.write("\n")
            self.out.flush()


def warm_up(run_once, how, flush, progress: Progress | None = None,
            seconds=lambda result: result[1].total_seconds) -> dict:
    """Discarded runs after the cold run: ``how`` of them, or with "auto" until the plan's total time is steady
    (see the module's notes). Returns how many ran, what stopped them and for how long they ran. ``seconds``
    reads a run's time from what ``run_once`` returns (a recorder's run by default)."""
    t0 = time.monotonic()
    if how != "auto":
        for i in range(int(how)):
            if progress:
                progress.update(f"warm-up {i + 1}/{how}")
            flush()
            run_once()
        return {"runs": int(how), "rule": "count", "seconds": time.monotonic() - t0}
    totals: list[float] = []
    while True:
        if progress:
            progress.update(f"warm-up {len(totals) + 1}")
        flush()
        totals.append(seconds(run_once()))
        elapsed = time.monotonic() - t0
        out = {"runs": len(totals), "seconds": elapsed, "window": WARMUP_WINDOW, "steady_within": WARMUP_STEADY}
        if len(totals) >= 2 * WARMUP_WINDOW:
            last = statistics.median(totals[-WARMUP_WINDOW:])
            before = statistics.median(totals[-2 * WARMUP_WINDOW:-WARMUP_WINDOW])
            out["last_change"] = (last - before) / before if before > 0 else 0.0
            if elapsed >= WARMUP_MIN_SECONDS and abs(out["last_change"]) <= WARMUP_STEADY:
                return out | {"rule": "steady", "min_seconds": WARMUP_MIN_SECONDS}
        if elapsed >= WARMUP_BUDGET_SECONDS:
            return out | {"rule": "budget", "budget_seconds": WARMUP_BUDGET_SECONDS}
        if len(totals) >= WARMUP_MAX_RUNS:
            return out | {"rule": "max_runs", "max_runs": WARMUP_MAX_RUNS}


def timed_runs(run_once, bench_runs, flush: L2Flush, progress: Progress,
               between=None) -> tuple[list, dict, object]:
    """(run records, how the count was decided, the last run's output). ``bench_runs``: an int, or "auto".
    ``between``, when given, is called before every run's L2 step, outside its timed region: event mode reads
    the GPU's clocks and the host CPU's pace there, where they cannot slow a run.

    Only the last output is kept, as in a caller's own loop: keeping every run's result would make each
    run allocate fresh device memory for it (CuPy's pool grows instead of reusing), and that cudaMalloc
    would be timed as part of the plan -- at the default join sizes it made output_sort 2.5x slower."""
    records, t0, output = [], time.monotonic(), None
    auto = bench_runs == "auto"
    target = AUTO_MAX_RUNS if auto else int(bench_runs)
    stopped = {"rule": "count", "requested": bench_runs}
    while len(records) < target:
        if between is not None:
            between()
        flush()
        output, record = run_once()
        records.append(record)
        progress.update(f"timed run {len(records)}" + ("" if auto else f"/{target}"))
        if auto and len(records) >= AUTO_MIN_RUNS:
            totals = [r.total_seconds for r in records]
            med = statistics.median(totals)
            lo, hi = median_interval(totals)
            width = max(med - lo, hi - med) / med if med > 0 else 0.0
            if width <= AUTO_CI:
                stopped = {"rule": "ci", "requested": "auto", "ci_half_width": width, "target": AUTO_CI}
                break
            if time.monotonic() - t0 >= AUTO_BUDGET_SECONDS:
                stopped = {"rule": "budget", "requested": "auto", "ci_half_width": width, "target": AUTO_CI,
                           "budget_seconds": AUTO_BUDGET_SECONDS}
                break
    if auto and stopped["rule"] == "count":
        stopped = {"rule": "max_runs", "requested": "auto", "max_runs": AUTO_MAX_RUNS}
    return records, stopped, output


def instrumentation_overhead(run_instrumented, run_bare, flush: L2Flush, pairs: int = OVERHEAD_PAIRS,
                             progress: Progress | None = None, budget_s: float | None = None,
                             target_ci: float | None = None, others: dict | None = None,
                             settle_rounds: int = 0) -> dict:
    """What the per-stage marks cost: runs with them and bare runs (one pair of marks around the plan),
    interleaved pair by pair, the order flipped every pair so neither side always runs second.

    The estimate is the median of the pairs' differences over the median bare run, with the distribution-free
    95% interval of that median: two runs side by side share the machine's slow and fast moments, so their
    difference is far steadier than the difference of two medians (on an H200 node the whole plan's
    quartiles lie +-15% apart at the default sizes, more than the marks cost). With ``budget_s`` the pairs
    stop (after OVERHEAD_MIN_PAIRS) once they have taken that long: a slow plan -- a CPU run at a million
    points -- must not double the profile's time to measure its marks. With ``target_ci`` the pairs go on
    past ``pairs``, within the budget and up to OVERHEAD_MAX_PAIRS, until the interval's half-width is at
    most that fraction of the bare run; ``stopped`` says which rule ended them.

    ``others`` (name -> run) are run once in every pair's round too, the round's runs then in an order shuffled
    afresh (seeded) each round; ``rounds`` holds each round's RunRecords by name ("marked", "bare" and theirs):
    event mode's runs with one stage mark each (app.runtime.one_mark), side by side with the pair they are
    judged against. Where ``run_bare`` is ``copied_back``'s, ``end_to_end`` holds the end-to-end figure from the
    bare runs (``end_to_end``).

    ``settle_rounds`` rounds of every side run first and are discarded: event mode's pairs follow its timed runs
    after milliseconds of set-up (new recorders, whose first runs make their CUDA events), and on an H200 host the
    first round's runs read up to 1.8x their medians, their difference 226 us against a median of 15 us."""
    for _ in range(settle_rounds):
        for run in (run_instrumented, run_bare, *(others or {}).values()):
            flush()
            run()
    marked, bare, bare_records = [], [], []
    rounds, rng = [], random.Random(0)
    marks = {"marked": 0, "bare": 0}          # clock marks a run of each side records
    t0 = time.monotonic()
    limit = max(pairs, OVERHEAD_MAX_PAIRS) if target_ci else pairs
    for i in range(limit):
        if budget_s is not None and i >= OVERHEAD_MIN_PAIRS and time.monotonic() - t0 > budget_s:
            stopped = "budget"
            break
        if target_ci and i >= pairs and _half_width(marked, bare) <= target_ci:
            stopped = "interval"
            break
        if progress:
            progress.update(f"instrumentation overhead, pair {i + 1}")
        sides = [(run_instrumented, marked, "marked"), (run_bare, bare, "bare")]
        if others:
            sides += [(run, None, name) for name, run in others.items()]
            rng.shuffle(sides)
        got = {}
        for run, times, name in sides if others or i % 2 == 0 else sides[::-1]:
            flush()
            record = got[name] = run()[1]
            if times is not None:
                times.append(record.total_seconds)
                marks[name] = record.marks
            if name == "bare":
                bare_records.append(record)
        if others:
            rounds.append(got)
    else:
        stopped = "max_pairs" if target_ci else "count"
    b = statistics.median(bare)
    diffs = [m - x for m, x in zip(marked, bare)]
    lo, hi = median_interval(diffs)
    # The same cost a mark, for plans of other lengths: the percentage shrinks as the plan grows, a mark's does not.
    extra = marks["marked"] - marks["bare"]
    return {"pairs": len(marked), "instrumented_median_seconds": statistics.median(marked), "bare_median_seconds": b,
            "instrumented_ci95": list(median_interval(marked)),
            "extra_marks": extra, "per_mark_seconds": statistics.median(diffs) / extra if extra > 0 else None,
            "per_mark_ci95": [lo / extra, hi / extra] if extra > 0 else None,
            "overhead_fraction": statistics.median(diffs) / b if b > 0 else 0.0,
            "overhead_ci95": [lo / b, hi / b] if b > 0 else [0.0, 0.0],
            "stopped": stopped, "target_ci": target_ci, "settle_rounds": settle_rounds,
            # Each pair's two runs, in the pairs' order: every figure above can be worked out again from them.
            "samples": {"marked": marked, "bare": bare},
            **({"rounds": rounds} if others else {}),
            **({"end_to_end": end_to_end(bare_records)}
               if bare_records and all(r.end_to_end_seconds is not None for r in bare_records) else {}),
            "how": "median difference of interleaved pairs ("
                   + ("each pair's round with the runs of one stage mark each, in a shuffled order" if others
                      else "order flipped every pair")
                   + ") over the median bare run: the same plan with a mark at every stage boundary vs one pair of "
                     "marks around the whole plan"
                   + (f"; after {settle_rounds} discarded round(s) of every run" if settle_rounds else "")}


def _half_width(marked: list, bare: list) -> float:
    """Half-width of the paired estimate's 95% interval, as a fraction of the median bare run."""
    b = statistics.median(bare)
    diffs = [m - x for m, x in zip(marked, bare)]
    mid, (lo, hi) = statistics.median(diffs), median_interval(diffs)
    return max(mid - lo, hi - mid) / b if b > 0 else 0.0


def copied_back(run_bare, to_host):
    """The bare run followed by copying its result to host arrays, as a caller waits for it: the run's RunRecord
    gets ``end_to_end_seconds``, the host clock from before the run's first mark is queued to the copy's end.

    Event mode runs this as the bare side of the instrumentation pairs, so the end-to-end figure comes from the
    very runs that give the bare plan's. It cannot then read less than the bare plan: the host clock around a run
    holds the GPU's time between its marks, run by run. Measured in runs of its own, at another point of the
    profile, it did: the host's pace moves between batches of runs (app.runtime.host_pace), and an H100 profile of
    the default overlay gave 758.4 us end to end against a bare plan of 867.8 us. The copy comes after the run's
    last mark and its synchronisation, so it adds nothing to the bare plan's own figure."""

    def run():
        t0 = time.perf_counter()
        output, record = run_bare()
        to_host(output)
        record.end_to_end_seconds = time.perf_counter() - t0
        return output, record

    return run


def end_to_end(records: list) -> dict:
    """The end-to-end figure from the overhead pairs' bare runs made by ``copied_back``, beside those runs' bare
    plan (their own clock marks)."""
    times = [r.end_to_end_seconds for r in records]
    lo, hi = median_interval(times)
    return {"median": statistics.median(times), "median_ci95": [lo, hi], "runs": len(times), "samples": times,
            "bare_median_seconds": statistics.median(r.total_seconds for r in records),
            "how": "host clock around the bare plan (no per-stage marks) and the copy of its result to host arrays; "
                   "the bare runs of the instrumentation pairs, so the bare plan's figure comes from the same runs"}


def graph_capturability(record, selected: str) -> dict:
    """Whether the plan could be captured as one CUDA graph and replayed, judged from what a run did.

    A graph holds device work only: a host read mid-plan (a size to allocate by, a result to branch
    on) or a copy of host arrays, which the host first copies into pinned staging, cannot be captured. Each
    stage that does one is named. ``after_build`` says whether the stages after the leading ones that copy
    host arrays in (the build) could be captured as they are: the build runs before such a graph, the
    result's length is read after it."""
    if selected != "gpu":
        return {"capturable": False, "after_build": False, "why": "CPU run: CUDA graphs apply to GPU runs only"}
    copies, reads = [], []
    last = len(record.stages) - 1
    for i, s in enumerate(record.stages):
        c = s["counters"]
        # The last stage's read of the result's length, after every launch, is not mid-plan: a graph ends there.
        ending = c.get("result_size_reads", 0) if i == last else 0
        if c["syncs"] > ending:
            sizes = c["allocation_size_reads"] - ending
            what = f"{sizes} allocation-size read(s)" if sizes else f"{c['syncs'] - ending} host read(s)"
            reads.append(f"{s['name']}: {what}")
        if c["h2d_copies"]:
            staging = str(s.get("meta", {}).get("staging", ""))
            how = ("host work: the arrays are copied into pinned staging buffers first" if "pinned, " in staging
                   else "from pageable host memory" if "pageable" in staging or "pinned memory" not in staging
                   else "DMA from the caller's pinned memory")
            copies.append((i, f"{s['name']}: {c['h2d_copies']} copies of host arrays ({how})"))
    build = build_stages(record)
    late_copies = [text for i, text in copies if i >= build]
    blockers = [text for _, text in copies] + reads
    after_build = not reads and not late_copies
    if not blockers:
        return {"capturable": True, "after_build": True,
                "why": "no host reads or host copies inside the plan, only the result's length read after its last "
                       "launch: it can be captured as it is (the replay figure, on a GPU, says what that saves)"}
    if after_build:
        return {"capturable": False, "after_build": True, "blockers": blockers,
                "why": "the stages after the build can be captured as they are: no host read comes before the "
                       f"result's length, read after the last launch, so a replay needs no size from the host. It "
                       f"serves {NEW_DATA_SCOPE}. The build (" +
                       "; ".join(blockers) + ") stays outside the graph"}
    return {"capturable": False, "after_build": False, "blockers": blockers,
            "why": "not capturable: " + "; ".join(blockers) + ". A graph holds device work only; upper-bound "
                   "allocations or device-side sizes, and pinned staging outside the graph, would make it "
                   "capturable."}
