"""Two profiles compared stage by stage with a verdict: faster, slower or noise.

The change is the ratio of medians minus one; its 95% interval comes from a
bootstrap of both sides' timed-run samples (numpy only, a fixed seed so a
comparison is reproducible). The verdict is ``noise`` when a side has fewer than
``MIN_RUNS`` runs (no interval of a median means anything then), when the interval
includes zero, or when the change is smaller than either run's own robust spread
(1.4826 x MAD / median) or the floor ``threshold`` -- two runs of identical code
must not read as a regression. One profile a side gets no verdict: its runs' own call is
shown as theirs (one_process_verdict), since processes of identical code differ by more.
Profiles of several processes a side (a set each) need ``MIN_PROCESSES`` a side and
``MIN_RUNS`` runs in each process for a verdict, since their interval resamples the
processes. A stage that only one side timed, or that launched no kernel in a counter-mode profile, is listed apart,
with no verdict.

Beside the verdict, the host's pace in each profile (event mode times a fixed Python loop, and on a GPU a few
launches of an empty kernel, before every timed run; nsys mode before every traced iteration): where the host
itself was slower or faster in NEW, the same way as the plan, the comparison says so (``caution``) and keeps its
verdict -- it cannot tell how much of the change is the machine's.
"""
from __future__ import annotations

import math

import numpy as np

from app.analysis.baseline import launched_no_kernels
from app.runtime.stats import MIN_CI_SAMPLES, robust_rel_spread

RESAMPLES = 4000
DEFAULT_FLOOR = 0.05
# The fewest runs a side for a verdict: the fewest with a 95% interval of their median (stats.MIN_CI_SAMPLES). Below
# it not even the widest order-statistic interval holds the median 95% of the time, and a bootstrap interval, which
# is narrower, holds it less often still (from 2 runs a side each resampled median takes one of three values, so a
# slight difference reads as a resolved change).
MIN_RUNS = MIN_CI_SAMPLES
# The fewest processes a side for a verdict from sets of processes (each with MIN_RUNS runs or more). Their interval
# resamples the processes, so the processes, not the runs, set how finely it resolves: from 2 a side each resampled
# figure takes one of three values, and identical code reads faster or slower often. Simulated: identical code on
# both sides, each process's pace drawn with a standard deviation of 5, 10, 20 or 30% (six processes of the default
# join's identical code read 373 to 597 us on an H200 host), 6 runs a process within 1%, the default 5% floor, 1,000
# comparisons a cell, two seeds. The share of false verdicts (faster or slower): 2 a side 17, 34, 33% (5-20%, 300
# comparisons); 3 a side 5.1, 8.8, 8.5, 9.4%; 4 a side 4.7, 6.5, 6.9, 6.9% and 4.9, 6.6, 6.8, 4.6%; 5 a side 1.7, 2.2,
# 2.9, 3.0% and 2.5, 2.9, 2.2, 1.7%; 6 a side 2.4, 3.7, 4.4, 3.1%. Five is the fewest under 5% (the interval's own
# 95% promise) at every spread. One process a side is the two-profile comparison, with its note that the host's
# change between processes is left out (ONE_PROCESS_NOTE).
MIN_PROCESSES = 5


def samples_of(trace: dict, stage: str | None = None) -> list[float]:
    """Timed-run samples (seconds) of one stage, or of the whole plan; [median] for traces without them."""
    if stage is None:
        spread, median = (trace.get("timing") or {}).get("total"), trace["total_elapsed_seconds"]
    else:
        s = next((x for x in trace["stages"] if x["name"] == stage), None)
        if s is None:
            return []
        spread, median = s.get("spread"), s["elapsed_seconds"]
    vals = spread.get("samples") if isinstance(spread, dict) else None
    return [float(v) for v in vals] if vals else [float(median)]


def change_interval(base: list[float], new: list[float], seed: int = 0) -> tuple[float, float, float]:
    """(change, lo, hi) of median(new) / median(base) - 1, with a 95% bootstrap interval."""
    b, n = np.asarray(base, dtype=float), np.asarray(new, dtype=float)
    change = float(np.median(n) / np.median(b) - 1.0)
    if len(b) < 2 or len(n) < 2:
        return change, float("-inf"), float("inf")        # one sample cannot bound anything
    rng = np.random.default_rng(seed)
    mb = np.median(b[rng.integers(0, len(b), (RESAMPLES, len(b)))], axis=1)
    mn = np.median(n[rng.integers(0, len(n), (RESAMPLES, len(n)))], axis=1)
    ratios = mn / mb - 1.0
    return change, float(np.percentile(ratios, 2.5)), float(np.percentile(ratios, 97.5))


def process_change_interval(base: list[list[float]], new: list[list[float]],
                            seed: int = 0) -> tuple[float, float, float]:
    """(change, lo, hi) for profiles made in several processes a side: each side's figure is the median of its
    processes' medians, and the 95% bootstrap interval resamples the processes, then each chosen process's runs.
    A lent host's pace moves from one process to the next by more than within one (on an H200 host six processes
    of identical code gave 373-597 us, each steady within itself), so only an interval that resamples the
    processes holds that change; one that pools the runs would call it the code's."""
    rng = np.random.default_rng(seed)

    def point(sets):
        return float(np.median([np.median(x) for x in sets]))

    def resampled(sets):
        per = np.stack([np.median(np.asarray(x, dtype=float)[rng.integers(0, len(x), (RESAMPLES, len(x)))], axis=1)
                        for x in sets], axis=1)                              # RESAMPLES x processes
        pick = rng.integers(0, len(sets), (RESAMPLES, len(sets)))
        return np.median(np.take_along_axis(per, pick, axis=1), axis=1)

    change = point(new) / point(base) - 1.0
    ratios = resampled(new) / resampled(base) - 1.0
    return change, float(np.percentile(ratios, 2.5)), float(np.percentile(ratios, 97.5))


def too_few_runs(base_runs: int, new_runs: int, per_process: bool = False) -> str | None:
    """Why a verdict cannot be drawn from this many runs a side (``MIN_RUNS``), or None. ``per_process``: the counts
    are the fewest runs of a side's processes, each of which needs MIN_RUNS (its median enters the figure)."""
    if min(base_runs, new_runs) >= MIN_RUNS:
        return None
    where = " in a process (the fewest of each side's)" if per_process else ""
    return (f"too few runs to judge: {base_runs} and {new_runs}{where}; need ≥ {MIN_RUNS}"
            f"{' in every process' if per_process else ''}: profile again with --bench_runs {MIN_RUNS} or more")


def too_few_processes(base_processes: int, new_processes: int) -> str | None:
    """Why a verdict cannot be drawn from sets of this many processes a side (``MIN_PROCESSES``), or None."""
    if min(base_processes, new_processes) >= MIN_PROCESSES:
        return None
    count = (f"{base_processes}" if base_processes == new_processes else f"{base_processes} and {new_processes}")
    return (f"too few processes ({count} a side; a verdict needs {MIN_PROCESSES}): profile each side in "
            f"{MIN_PROCESSES} or more processes, the two in turns")


def _unjudged(base_median: float, new_median: float) -> str | None:
    """Why two medians give no change to judge (BASE's not above 0, NEW's below 0, or either not finite), or None."""
    for side, m, least in (("BASE", base_median, "above 0"), ("NEW", new_median, "0 or more")):
        if not math.isfinite(m) or m < 0 or (side == "BASE" and m == 0):
            return f"out of range: {side}'s median is {m * 1e6:g} us (a time {least} is needed), so no change is judged"
    return None


def _no_verdict(base_median: float, new_median: float, why: str) -> dict:
    """A row that draws no conclusion: the change where the medians give one, no interval, verdict noise."""
    change = None if _unjudged(base_median, new_median) else 100 * (new_median / base_median - 1)
    return {"base_median_us": base_median * 1e6, "new_median_us": new_median * 1e6, "change_pct": change,
            "ci_pct": [None, None], "verdict": "noise", "why": why}


def verdict_of(base: list[float], new: list[float], floor: float = DEFAULT_FLOOR) -> dict:
    medians = float(np.median(base)), float(np.median(new))
    why = _unjudged(*medians) or too_few_runs(len(base), len(new))
    if why:
        return _no_verdict(*medians, why) | {"samples": [len(base), len(new)]}
    own = max(robust_rel_spread(list(base)), robust_rel_spread(list(new)), floor)
    return _verdict(*change_interval(base, new), own, *medians) | {"samples": [len(base), len(new)]}


# One process a side: the interval holds that process's runs, not how far processes of identical code differ on one
# host, which is often further than a code change moves (six processes of the default join's identical code read 373
# to 597 us on an H200 host; of 153 comparisons of one profile a side of identical join code on a 2-core CPU host, 26
# read faster or slower). So the runs' own call is shown as theirs (``within_process``) and no verdict is drawn.
ONE_PROCESS_WHY = ("one process a side: processes of identical code differ by more than the runs within one, so what "
                   "the runs call it (shown with a '?') is no verdict; profile each side in "
                   f"{MIN_PROCESSES} or more processes, the two in turns (ab, or compare BASE1,...,BASE5 "
                   "NEW1,...,NEW5)")


def one_process_verdict(base: list[float], new: list[float], floor: float = DEFAULT_FLOOR) -> dict:
    """verdict_of for one process a side: the change and its interval over the runs, but 'faster' or 'slower' kept
    only as ``within_process`` (what the runs of the two processes say), the verdict noise (ONE_PROCESS_WHY)."""
    v = verdict_of(base, new, floor)
    if v["verdict"] in ("faster", "slower"):
        v |= {"verdict": "noise", "within_process": v["verdict"], "why": ONE_PROCESS_WHY}
    return v


def verdict_text(r: dict) -> str:
    """A row's verdict as printed: 'slower? (1 process)' where only one process's runs call it."""
    return f"{r['within_process']}? (1 process)" if r.get("within_process") else r["verdict"]


def total_text(total: dict) -> str:
    """The whole plan's verdict as a headline says it: 'no verdict (one process a side; its runs alone say
    slower)' where only one process's runs call it."""
    return (f"no verdict (one process a side; its runs alone say {total['within_process']})"
            if total.get("within_process") else total["verdict"])


def process_verdict(base: list[list[float]], new: list[list[float]], floor: float = DEFAULT_FLOOR) -> dict:
    """verdict_of for several processes a side (lists of each process's samples): one process a side is
    one_process_verdict (no verdict drawn). Otherwise a verdict needs MIN_PROCESSES processes a side and MIN_RUNS
    runs in every process: the interval resamples the processes, so runs summed over a side (``samples``) say
    nothing of its resolution."""
    if len(base) == 1 and len(new) == 1:
        return one_process_verdict(base[0], new[0], floor) | {"processes": [1, 1]}
    medians = [[float(np.median(x)) for x in sets] for sets in (base, new)]
    samples = [sum(map(len, base)), sum(map(len, new))]
    figures = float(np.median(medians[0])), float(np.median(medians[1]))
    why = (_unjudged(*figures) or too_few_processes(len(base), len(new))
           or too_few_runs(min(map(len, base)), min(map(len, new)), per_process=True))
    if why:
        verdict = _no_verdict(*figures, why)
    else:
        own = max([robust_rel_spread(list(x)) for x in base + new] + [floor])
        verdict = _verdict(*process_change_interval(base, new), own, *figures)
    return verdict | {"samples": samples, "processes": [len(base), len(new)],
                      "process_medians_us": [[1e6 * m for m in side] for side in medians]}


def _verdict(change: float, lo: float, hi: float, own: float, base_median: float, new_median: float) -> dict:
    if lo <= 0.0 <= hi:
        verdict, why = "noise", "the interval includes 0"
    elif abs(change) < own:
        verdict, why = "noise", f"|change| < {100 * own:.1f}% (the runs' own spread or the floor)"
    else:
        verdict, why = ("slower" if change > 0 else "faster"), "interval excludes 0 and exceeds the spread"
    return {"base_median_us": base_median * 1e6, "new_median_us": new_median * 1e6, "change_pct": 100 * change,
            "ci_pct": [100 * lo, 100 * hi], "verdict": verdict, "why": why}


def compare_traces(base: dict, new: dict, floor: float = DEFAULT_FLOOR) -> dict:
    return compare_processes([base], [new], floor)


def compare_processes(base: list[dict], new: list[dict], floor: float = DEFAULT_FLOOR) -> dict:
    """compare_traces for profiles of each side's code made in several processes (see process_change_interval),
    the host's pace too. A stage not in every profile of both sides (renamed, or another kernel's under --force) is
    listed in ``one_side_stages`` with no verdict, never dropped."""
    stages, one_side = [], []
    for name in dict.fromkeys(s["name"] for t in new + base for s in t["stages"]):   # NEW's order first
        untimed = sum(1 for t in base + new for s in t["stages"] if s["name"] == name and launched_no_kernels(s))
        if untimed:
            one_side.append(_no_kernels(name, untimed, len(base) + len(new)))
            continue
        b, n = ([samples_of(t, name) for t in side] for side in (base, new))
        if all(b) and all(n):
            stages.append({"name": name} | process_verdict(b, n, floor))
        else:
            one_side.append(_one_side(name, b, n))
    total = process_verdict([samples_of(t) for t in base], [samples_of(t) for t in new], floor)
    pace, launch = (process_pace_change([pace_samples(t, key) for t in base], [pace_samples(t, key) for t in new])
                    for key in ("host_pace", "launch_pace"))
    notes = [ONE_PROCESS_NOTE] if min(len(base), len(new)) == 1 else []
    return {"verdict": total["verdict"], "total": total, "stages": stages, "one_side_stages": one_side,
            "floor_pct": 100 * floor, "min_runs": MIN_RUNS, "min_processes": MIN_PROCESSES, "host_pace": pace,
            "launch_pace": launch, "caution": machine_caution(total, pace, launch), "notes": notes}


# Said whenever a side is one profile: its interval holds that process's runs only, not the host's change between
# processes, which on a lent host is often larger than the code's change.
ONE_PROCESS_NOTE = ("a side of one process cannot show how much its host changes from one process to the next, so "
                    f"the interval leaves that change out: profile each side again in {MIN_PROCESSES} or more "
                    "processes, the two in turns, and compare them as sets (compare BASE1,...,BASE5 NEW1,...,NEW5)")


def _one_side(name: str, base: list[list[float]], new: list[list[float]]) -> dict:
    """A stage missing from some profiles: where it is (``only_in`` BASE or NEW, or None when both sides have it
    in some of their profiles), each side's median where it has one (None where absent), and no verdict."""
    have = [sum(1 for x in side if x) for side in (base, new)]
    only = "BASE" if not have[1] else "NEW" if not have[0] else None
    where = f"only in {only}" if only else "not in every profile"
    if any(0 < h < len(side) for h, side in zip(have, (base, new))) or not only:
        where += f" (in {have[0]} of {len(base)} BASE and {have[1]} of {len(new)} NEW profiles)"
    medians = [float(np.median([np.median(x) for x in side if x])) * 1e6 if h else None
               for h, side in zip(have, (base, new))]
    return {"name": name, "only_in": only, "profiles_with_it": have, "base_median_us": medians[0],
            "new_median_us": medians[1], "verdict": None, "why": f"{where}: nothing to compare it with"}


def _no_kernels(name: str, untimed: int, profiles: int) -> dict:
    """A stage that launched no kernel in ``untimed`` of the ``profiles`` (a counter mode's build): no time, no
    verdict."""
    return {"name": name, "only_in": None, "no_kernels": True, "base_median_us": None, "new_median_us": None,
            "verdict": None, "why": f"no kernels: it launched none in {untimed} of the {profiles} profiles, and ncu "
                                    "times kernels only (a copy's time is not captured), so there is no time to compare"}


def machine_caution(total: dict, pace: dict | None, launch: dict | None) -> str | None:
    """The caution for a plan's change (``verdict_of``'s, or what one process's runs call it) that went with the host's
    own pace, or None: the fixed loop
    (``pace``) or the launches (``launch``, both ``pace_change``'s) changed resolvably, the same way as the plan."""
    moved = []
    for p, what in ((pace, "the host CPU itself ran {pct:.1f}% {way} in the new profile (a fixed Python loop before "
                           "each timed run)"),
                    (launch, "the host's kernel launches took {pct:.1f}% {longer} in the new profile (an empty "
                             "kernel launched before each timed run)")):
        called = total.get("within_process") or total["verdict"]       # one process a side: what its runs say
        if p and p["resolved"] and called != "noise" and (p["change_pct"] > 0) == (total["change_pct"] > 0):
            slower = p["change_pct"] > 0
            moved.append(what.format(pct=abs(p["change_pct"]), way="slower" if slower else "faster",
                                     longer="longer" if slower else "less time"))
    return (" and ".join(moved) + ", the same way as the plan: part or all of this change may be the machine's, "
            f"not the code's; profile each side again in {MIN_PROCESSES} or more processes, the two in turns, and "
            "compare them as sets (compare BASE1,...,BASE5 NEW1,...,NEW5)") if moved else None


def pace_samples(trace: dict, key: str = "host_pace") -> list[float]:
    """A profile's timings of its host's pace (seconds): ``key`` is timing.host_pace (the same fixed Python loop
    timed before every timed run) or timing.launch_pace (an empty kernel's launches, GPU only); [] where the profile
    recorded none."""
    return [float(v) for v in ((trace.get("timing") or {}).get(key) or {}).get("samples") or []]


def pace_change(base: dict, new: dict, key: str = "host_pace") -> dict | None:
    """The host's pace in each profile (``pace_samples``'s) and its change; None unless both recorded it."""
    return samples_change(pace_samples(base, key), pace_samples(new, key))


def samples_change(base: list[float], new: list[float]) -> dict | None:
    """Two sets of the host's pace timings and their change with a 95% bootstrap interval; None unless both have
    some. Two profiles of the same code on a shared host can differ by tens of percent from one process to the next
    (69% on an H100 host); this says whether the host itself was slower or faster, which no statistic of the plan's
    own runs can tell."""
    if not base or not new:
        return None
    if min(len(base), len(new)) < MIN_RUNS:
        # as for the plan's runs: under MIN_RUNS timings a side, no interval and nothing resolved
        b, n = float(np.median(base)), float(np.median(new))
        return {"base_median_us": b * 1e6, "new_median_us": n * 1e6, "change_pct": 100 * (n / b - 1) if b > 0 else None,
                "ci_pct": [None, None], "resolved": False, "why": too_few_runs(len(base), len(new))}
    return _pace_result(float(np.median(base)), float(np.median(new)), *change_interval(base, new))


def _pace_result(base_median: float, new_median: float, change: float, lo: float, hi: float) -> dict:
    return {"base_median_us": base_median * 1e6, "new_median_us": new_median * 1e6, "change_pct": 100 * change,
            "ci_pct": [100 * lo, 100 * hi], "resolved": not lo <= 0.0 <= hi}


def process_pace_change(base: list[list[float]], new: list[list[float]]) -> dict | None:
    """samples_change for several processes a side (each process's pace timings): the median of the processes'
    medians, its interval resampling the processes as process_change_interval does; None unless every profile of
    both sides recorded the pace."""
    if not all(base) or not all(new):
        return None
    if len(base) == 1 and len(new) == 1:
        return samples_change(base[0], new[0])
    return _pace_result(float(np.median([np.median(x) for x in base])), float(np.median([np.median(x) for x in new])),
                        *process_change_interval(base, new))


def regression(result: dict, fail_pct: float | None) -> bool:
    """True when the whole plan's total is ``slower`` by more than ``fail_pct`` percent (the CI gate); never on
    ``noise``, so never on too few runs or processes (compare refuses the gate under MIN_PROCESSES a side)."""
    t = result["total"]
    return fail_pct is not None and t["verdict"] == "slower" and t["change_pct"] > fail_pct
