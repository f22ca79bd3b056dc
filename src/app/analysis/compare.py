"""Two profiles compared stage by stage with a verdict: faster, slower or noise.

The change is the ratio of medians minus one; its 95% interval comes from a
bootstrap of both sides' timed-run samples (numpy only, a fixed seed so a
comparison is reproducible). The verdict is ``noise`` when the interval includes
zero, or when the change is smaller than either run's own robust spread
(1.4826 x MAD / median) or the floor ``threshold`` -- two runs of identical code
must not read as a regression.

Beside the verdict, the host's pace in each profile (event mode times a fixed Python loop, and on a GPU a few
launches of an empty kernel, before every timed run; nsys mode before every traced iteration): where the host
itself was slower or faster in NEW, the same way as the plan, the comparison says so (``caution``) and keeps its
verdict -- it cannot tell how much of the change is the machine's.
"""
from __future__ import annotations

import numpy as np

from app.runtime.stats import robust_rel_spread

RESAMPLES = 4000
DEFAULT_FLOOR = 0.05


def samples_of(trace: dict, stage: str | None = None) -> list[float]:
    """Timed-run samples (seconds) of one stage, or of the whole plan; [median] for traces without them."""
    if stage is None:
        spread, median = trace.get("timing", {}).get("total", {}), trace["total_elapsed_seconds"]
    else:
        s = next((x for x in trace["stages"] if x["name"] == stage), None)
        if s is None:
            return []
        spread, median = s.get("spread", {}), s["elapsed_seconds"]
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


def verdict_of(base: list[float], new: list[float], floor: float = DEFAULT_FLOOR) -> dict:
    own = max(robust_rel_spread(list(base)), robust_rel_spread(list(new)), floor)
    return _verdict(*change_interval(base, new), own, float(np.median(base)), float(np.median(new))) | {
        "samples": [len(base), len(new)]}


def process_verdict(base: list[list[float]], new: list[list[float]], floor: float = DEFAULT_FLOOR) -> dict:
    """verdict_of for several processes a side (lists of each process's samples): one process a side is
    verdict_of itself."""
    if len(base) == 1 and len(new) == 1:
        return verdict_of(base[0], new[0], floor) | {"processes": [1, 1]}
    medians = [[float(np.median(x)) for x in sets] for sets in (base, new)]
    own = max([robust_rel_spread(list(x)) for x in base + new] + [floor])
    return _verdict(*process_change_interval(base, new), own, float(np.median(medians[0])),
                    float(np.median(medians[1]))) | {
        "samples": [sum(map(len, base)), sum(map(len, new))], "processes": [len(base), len(new)],
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
    the host's pace too."""
    stages = []
    for s in new[0]["stages"]:
        b, n = ([samples_of(t, s["name"]) for t in side] for side in (base, new))
        if all(b) and all(n):
            stages.append({"name": s["name"]} | process_verdict(b, n, floor))
    total = process_verdict([samples_of(t) for t in base], [samples_of(t) for t in new], floor)
    pace, launch = (process_pace_change([pace_samples(t, key) for t in base], [pace_samples(t, key) for t in new])
                    for key in ("host_pace", "launch_pace"))
    return {"verdict": total["verdict"], "total": total, "stages": stages, "floor_pct": 100 * floor,
            "host_pace": pace, "launch_pace": launch, "caution": machine_caution(total, pace, launch)}


def machine_caution(total: dict, pace: dict | None, launch: dict | None) -> str | None:
    """The caution for a plan's change (``verdict_of``'s) that went with the host's own pace, or None: the fixed loop
    (``pace``) or the launches (``launch``, both ``pace_change``'s) changed resolvably, the same way as the plan."""
    moved = []
    for p, what in ((pace, "the host CPU itself ran {pct:.1f}% {way} in the new profile (a fixed Python loop before "
                           "each timed run)"),
                    (launch, "the host's kernel launches took {pct:.1f}% {longer} in the new profile (an empty "
                             "kernel launched before each timed run)")):
        if p and p["resolved"] and total["verdict"] != "noise" and (p["change_pct"] > 0) == (total["change_pct"] > 0):
            slower = p["change_pct"] > 0
            moved.append(what.format(pct=abs(p["change_pct"]), way="slower" if slower else "faster",
                                     longer="longer" if slower else "less time"))
    return (" and ".join(moved) + ", the same way as the plan: part or all of this change may be the machine's, "
            "not the code's; profile each side again in three or more processes, the two in turns, and compare "
            "them as sets (compare BASE1,BASE2,BASE3 NEW1,NEW2,NEW3)") if moved else None


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
    """True when end to end is ``slower`` by more than ``fail_pct`` percent (the CI gate)."""
    t = result["total"]
    return fail_pct is not None and t["verdict"] == "slower" and t["change_pct"] > fail_pct
