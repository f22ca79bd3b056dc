"""Render report sections (plain data: title, text, columns/rows, items, note) with jinja2."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import jinja2

_ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
                          trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)


@dataclass
class Section:
    title: str | None = None
    text: str | None = None
    columns: list[str] = field(default_factory=list)
    rows: list[list] = field(default_factory=list)
    items: list[str] = field(default_factory=list)
    note: str | None = None


def render(kernel: str, version: str, headline: str, sections: list[Section]) -> str:
    return _ENV.get_template("report.md.j2").render(kernel=kernel, version=version,
                                                     headline=headline, sections=sections)


def fmt(v, digits: int = 1, suffix: str = "") -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:,.{digits}f}{suffix}"
    if isinstance(v, int):
        return f"{v:,}{suffix}"
    return f"{v}{suffix}"


def us(seconds) -> str:
    return fmt(seconds * 1e6 if seconds is not None else None, 1)


def host_pace_change(pace: dict) -> str:
    """Two profiles' host pace (analysis.compare's ``host_pace`` or ``launch_pace``), for the report's vs Baseline
    section and the compare command alike: "base 80.1 us, new 84.0 us, +4.9% [+1.2%, +8.8%]"."""
    return f"base {fmt(pace['base_median_us'])} us, new {fmt(pace['new_median_us'])} us, {pace_change_text(pace)}"


def pace_change_text(pace: dict) -> str:
    """The change alone, for a table that gives both values apart (a devlog entry): "+4.9% [+1.2%, +8.8%]"."""
    lo, hi = pace["ci_pct"]
    return (f"{pace['change_pct']:+.1f}% [{lo:+.1f}%, {hi:+.1f}%]"
            + ("" if pace["resolved"] else ", the same within its interval"))


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
