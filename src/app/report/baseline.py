"""The "vs Baseline" section every report carries: medians, change, 95% interval and verdict."""
from __future__ import annotations

import math

from app.analysis.baseline import other_card, other_settings, same_cpu_stages
from app.analysis.compare import ONE_PROCESS_WHY, compare_traces, total_text, verdict_text
from app.report.markdown import Section, fmt
from app.report.timing_text import host_pace_change


def mismatch_warning(baseline: dict) -> str:
    """The warning every report carries when --force compared unlike profiles ('' otherwise)."""
    m = baseline.get("_mismatch")
    return f" The baseline is not comparable: it was measured for {m} (compared anyway, --force)." if m else ""


def baseline_section(trace: dict, baseline: dict | None, note: str = "") -> Section:
    if baseline is None:
        return Section("vs Baseline", text="No baseline given (pass `--baseline PROFILE_DIR` or `--baseline latest`).")
    result = compare_traces(baseline, trace)
    card = other_card(baseline, trace)
    same = same_cpu_stages([baseline, trace])
    settings = other_settings([baseline, trace])
    rows, reasons = [], []
    for name, r in [("total (us)", result["total"])] + [(f"{s['name']} (us)", s) for s in result["stages"]]:
        lo, hi = r["ci_pct"]
        if lo is None and r["why"] not in reasons:       # no interval: said once, under the verdict
            reasons.append(r["why"])
        rows.append([name, fmt(r["base_median_us"]), fmt(r["new_median_us"]),
                     "--" if r["change_pct"] is None else f"{r['change_pct']:+.1f}%",
                     f"[{lo:+.1f}%, {hi:+.1f}%]" if lo is not None and math.isfinite(lo)
                     else "none (too few runs)" if r["why"].startswith("too few runs") else "none", verdict_text(r)])
        if r.get("within_process") and r["why"] not in reasons:
            reasons.append(r["why"])
    for r in result["one_side_stages"]:      # a stage of one side alone, or of no kernels: listed, no verdict
        if r.get("no_kernels"):
            rows.append([f"{r['name']} (us)", "-", "-", "--", "--", "no kernels (ncu times kernels only)"])
            continue
        rows.append([f"{r['name']} (us)", _absent(r["base_median_us"]), _absent(r["new_median_us"]), "--", "--",
                     r["why"].split(":")[0].replace("BASE", "the baseline").replace("NEW", "this profile")])
    return Section("vs Baseline", text=f"Baseline: {baseline.get('kernel')} {baseline.get('version')} "
                                        f"({baseline.get('mode')} mode) on {baseline.get('device', {}).get('name')}; "
                                        f"whole plan (the total): **{total_text(result['total'])}**."
                                        + "".join(f" No verdict: {why}." if why == ONE_PROCESS_WHY
                                                  else f" No interval: {why}." for why in reasons)
                                        + mismatch_warning(baseline) + note
                                        + (f" Note: {card}." if card else "")
                                        + (f" Note: {same}." if same else "")
                                        + (f" Note: {settings}." if settings else "")
                                        + (f" **Caution:** {result['caution']}." if result.get("caution") else ""),
                   columns=["Metric", "Previous", "Current", "Change", "95% interval", "Verdict"], rows=rows,
                   note="Medians of the timed runs; the total is each profile's total, median of its timed runs, not "
                        "its 'end to end, host arrays in and out' where the Timing section gives one. Noise = the "
                        "bootstrap interval of the change includes 0, or the change is below the runs' own spread or "
                        f"{result['floor_pct']:g}%, or a side has fewer than {result['min_runs']} runs. "
                        + "".join(f"Each side is one profile: {n}. " for n in result["notes"])
                        + _pace_note(result.get("host_pace"), result.get("launch_pace")) +
                        "`python -m app.kernel compare BASE NEW` gives the same table.")


def _absent(v) -> str:
    """A side's median, or 'absent' where that side did not time the stage."""
    return "absent" if v is None else fmt(v)


def _pace_note(pace: dict | None, launch: dict | None) -> str:
    """The host's pace in both profiles (a fixed Python loop, and an empty kernel's launches, before each timed
    run), where both recorded it."""
    return ((f"Host CPU pace (a fixed Python loop before each timed run): {host_pace_change(pace)}. " if pace else "")
            + (f"Host launch pace (an empty kernel launched before each timed run, us a launch): "
               f"{host_pace_change(launch)}. " if launch else ""))
