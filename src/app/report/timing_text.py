"""Timing in words, as every profile's report, compare and the devlog share it: the runs' drift check and the
host's paces (event mode's timed runs, nsys mode's traced iterations), and a change of pace between profiles."""
from __future__ import annotations

from app.report.markdown import fmt, us
from app.runtime.host_pace import moved_with_runs
from app.runtime.stats import drift


def drift_of(timing: dict) -> dict | None:
    """The trace's drift check; for a trace made before it, the same check on the trace's own timed runs."""
    if "drift" in timing:
        return timing["drift"]
    samples = timing.get("total", {}).get("samples")
    return drift(samples) if samples else None


def drift_text(d: dict, pace: dict | None = None, launch: dict | None = None) -> str:
    """The runs' drift check in words. Where the host's own pace (``pace``: timing.host_pace) or its launches'
    (``launch``: timing.launch_pace) changed the same way, the machine changed speed: more warm-up cannot steady
    that, so the text does not ask for it."""
    if not d.get("checked"):
        return f"not checked: {d['why']}"
    f, lst = d["first_third_median"], d["last_third_median"]
    level = (f"first third's median {us(f)} us, last third's {us(lst)} us ({100 * d['change']:+.1f}%; "
             f"{d['runs_per_third']} runs each)")
    if not d["significant"]:
        # Overlap resolves no drift; it does not prove the runs steady (with 6 runs a third the intervals are wide).
        return f"no drift resolved: {level}, their 95% intervals overlap"
    moved = [f"{what} before each run: {100 * p['drift']['change']:+.1f}%"
             for what, p in (("a fixed Python loop", pace), ("an empty kernel's launch", launch))
             if moved_with_runs(p, d)]
    if moved:
        return (f"{level}: their 95% intervals do not overlap, so the median above mixes two levels. The host's "
                f"own pace changed the same way ({'; '.join(moved)}): the machine changed speed, which more "
                "--warmup cannot steady; rerun on a quiet host, and compare only figures measured side by side")
    return (f"{level}: their 95% intervals do not overlap, so the median above mixes two levels; more "
            "--warmup gives a steady one")


def still_changing(timing: dict, what: str) -> str:
    """The headline's sentence where ``what`` (the timed runs, the iterations) were still changing, or ''."""
    check = drift_of(timing)
    if not (check and check.get("significant")):
        return ""
    return f" **{what} were still changing** ({drift_text(check, timing.get('host_pace'), timing.get('launch_pace'))})."


def pace_rows(timing: dict, before: str) -> list[list[str]]:
    """The Timing table's rows for timing.host_pace and timing.launch_pace (event mode: ``before`` "each timed
    run"; nsys mode: "each traced iteration"); none for a trace made before they were recorded."""
    rows = []
    for key, label in (("host_pace", "host CPU pace before {} (a fixed Python loop, us)"),
                       ("launch_pace", "host launch pace before {} (an empty kernel, us a launch)")):
        p = timing.get(key)
        if p:
            rows.append([label.format(before), pace_text(p) if p.get("samples") else f"not measured ({p['why']})"])
    return rows


def pace_text(p: dict) -> str:
    """timing.host_pace or timing.launch_pace in words: the time, whether it moved, and whether the runs followed
    it."""
    work = (f"{p['loop_iterations']:,} integer multiply-adds" if "loop_iterations" in p
            else f"the mean of {p['launches']} launches")
    text = (f"{us(p['median'])} median ({work}; range {us(p['min'])} to "
            f"{us(p['max'])}, robust spread ±{100 * p['robust_rel_spread']:.1f}%)")
    d = p.get("drift") or {}
    if d.get("checked"):
        text += (f"; first third {us(d['first_third_median'])}, last third {us(d['last_third_median'])} "
                 f"({100 * d['change']:+.1f}%, " + ("a change their 95% intervals resolve)" if d["significant"]
                                                     else "within their 95% intervals)"))
    rho = p.get("rank_correlation")
    if rho is not None:
        text += (f"; rank correlation with the runs' totals {rho:+.2f} over {p['runs']} runs (independent series "
                 f"stay under {p['chance_bound']:.2f} 39 times in 40)"
                 + (": the plan ran slower where the host did, so part of its spread is the host's" if p["follows"]
                    else ""))
    elif p.get("why_no_correlation"):
        text += f"; no correlation: {p['why_no_correlation']}"
    elif "chance_bound" in p:
        text += "; no rank correlation: the loop's times or the runs' did not vary"
    return text


def host_pace_change(pace: dict) -> str:
    """Two profiles' host pace (analysis.compare's ``host_pace`` or ``launch_pace``), for the report's vs Baseline
    section and the compare command alike: "base 80.1 us, new 84.0 us, +4.9% [+1.2%, +8.8%]"."""
    return f"base {fmt(pace['base_median_us'])} us, new {fmt(pace['new_median_us'])} us, {pace_change_text(pace)}"


def pace_change_text(pace: dict) -> str:
    """The change alone, for a table that gives both values apart (a devlog entry): "+4.9% [+1.2%, +8.8%]"."""
    lo, hi = pace["ci_pct"]
    change = "--" if pace["change_pct"] is None else f"{pace['change_pct']:+.1f}%"
    if lo is None:          # too few timings a side for an interval: nothing resolved
        return f"{change}, not judged (too few timings a side for an interval)"
    return f"{change} [{lo:+.1f}%, {hi:+.1f}%]" + ("" if pace["resolved"] else ", the same within its interval")
