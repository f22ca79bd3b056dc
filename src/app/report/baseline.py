"""The "vs Baseline" section every report carries: medians, change, 95% interval and verdict."""
from __future__ import annotations

import math

from app.analysis.baseline import other_card, same_cpu_stages
from app.analysis.compare import compare_traces
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
    rows = []
    for name, r in [("total (us)", result["total"])] + [(f"{s['name']} (us)", s) for s in result["stages"]]:
        lo, hi = r["ci_pct"]
        rows.append([name, fmt(r["base_median_us"]), fmt(r["new_median_us"]), f"{r['change_pct']:+.1f}%",
                     f"[{lo:+.1f}%, {hi:+.1f}%]" if math.isfinite(lo) else "one sample: no interval", r["verdict"]])
    return Section("vs Baseline", text=f"Baseline: {baseline.get('kernel')} {baseline.get('version')} "
                                        f"({baseline.get('mode')} mode) on {baseline.get('device', {}).get('name')}; "
                                        f"end to end: **{result['verdict']}**." + mismatch_warning(baseline) + note
                                        + (f" Note: {card}." if card else "")
                                        + (f" Note: {same}." if same else "")
                                        + (f" **Caution:** {result['caution']}." if result.get("caution") else ""),
                   columns=["Metric", "Previous", "Current", "Change", "95% interval", "Verdict"], rows=rows,
                   note="Medians of the timed runs. Noise = the bootstrap interval of the change includes 0, or the "
                        f"change is below the runs' own spread or {result['floor_pct']:g}%. "
                        + _pace_note(result.get("host_pace"), result.get("launch_pace")) +
                        "`python -m app.kernel compare BASE NEW` gives the same table.")


def _pace_note(pace: dict | None, launch: dict | None) -> str:
    """The host's pace in both profiles (a fixed Python loop, and an empty kernel's launches, before each timed
    run), where both recorded it."""
    return ((f"Host CPU pace (a fixed Python loop before each timed run): {host_pace_change(pace)}. " if pace else "")
            + (f"Host launch pace (an empty kernel launched before each timed run, us a launch): "
               f"{host_pace_change(launch)}. " if launch else ""))
