"""A sweep's report.md, written from results.csv alone (so a resumed or interrupted sweep reports
what it has): where it ran, what failed, the best version per size, crossovers, scaling exponents,
the pictures, and every point with a link to its profile."""
from __future__ import annotations

import math

import pandas as pd

from app.kernel.plan import get_plan_class, human, same_cpu_code
from app.sweep.plots import scaling_png, speedup_png
from app.runtime.stats import MIN_CI_SAMPLES, STABLE_REL_SPREAD
from app.sweep.scaling import FASTER_THAN_MODEL, best_per_size, crossovers, exponents, numeric_axes, usable

UNSTABLE_PCT = 100 * STABLE_REL_SPREAD        # the profiles' own threshold for an unstable measurement


def _us(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "missing"
    return f"{v / 1000:,.3f} ms" if v >= 1000 else f"{v:,.1f} us"


def _grid(d: dict) -> str:
    return ", ".join(f"{k}={human(_int(v))}" for k, v in d.items())


def _int(v):
    return int(v) if isinstance(v, float) and v.is_integer() else v


def _slope(fit: dict) -> str:
    s = f"n^{fit['slope']:.2f}"
    return s + (f" [{fit['lo']:.2f}, {fit['hi']:.2f}]" if fit["lo"] is not None else " (no interval: too few points)")


def sweep_files(spec, frame: pd.DataFrame, stages: list[str], runs: list[dict]) -> dict:
    """report.md, scaling.png and speedup.png for the table ``frame``; ``runs``: how it was run (the first run,
    then each --resume that ran points)."""
    axes, versions = list(spec.axes), spec.versions
    title = f"{spec.kernel} {', '.join(versions)} over {' x '.join(axes)} ({spec.prof_type} mode)"
    files, lines = {}, [f"# Sweep: {title}", ""]
    counts = frame["status"].value_counts().to_dict() if len(frame) else {}
    total = len(spec.points())
    lines += [f"- Points: {total} ({', '.join(f'{n} {s}' for s, n in sorted(counts.items())) or 'none finished'}"
              f"{f', {total - len(frame)} not run' if len(frame) < total else ''}).",
              f"- Grid: {'; '.join(f'{a} = ' + ', '.join(human(v) for v in vals) for a, vals in spec.axes.items())}"
              + (f"; fixed: {_grid(spec.fixed)}" if spec.fixed else "") + ".",
              ] + _runs(runs)
    lines += _devices(frame)
    lines += _same_code_on_cpu(spec.kernel, versions, frame)
    lines += _no_intervals(frame, versions)
    lines += ["- Times are medians of each point's timed runs: the profile's total (host arrays in, the result "
              "where the plan leaves it: on the device in a GPU run), not its report's 'end to end, host arrays in "
              "and out' (`e2e_host_out_us` in results.csv). Each point is an ordinary profile under `points/`, taken "
              "under the lock of the device it ran on, in a process of its own: a lead between versions inside "
              "what processes of identical code differ by on this host is not resolved by one point each.", ""]
    lines += _failures(frame)
    if frame.empty or not (frame["status"] == "ok").any():
        lines += ["No point finished with a verified result: nothing to fit.", ""]
        return {"report.md": "\n".join(lines)}
    lines += _best(frame, axes, versions, spec.kernel)
    lines += _crossovers(frame, axes, versions)
    lines += _exponents(frame, axes, versions, stages, _not_sizes(spec, axes))
    for name, png in (("scaling.png", scaling_png(frame, axes, versions, stages, title)),
                      ("speedup.png", speedup_png(frame, axes, versions, title))):
        if png is not None:
            files[name] = png
            lines += [f"![{name}]({name})", ""]
    lines += _points(frame, axes)
    files["report.md"] = "\n".join(lines)
    return files


def _run_line(run: dict) -> str:
    wall = run.get("wall_seconds")
    text = f"{run.get('runner', '?')}; wall time " + (f"{wall:,.1f} s" if isinstance(wall, (int, float)) else "missing")
    if "close_seconds" in run:
        text += (f" (start {run['start_seconds']:,.1f} s, points {run['points_seconds']:,.1f} s, shutdown "
                 f"{run['close_seconds']:,.1f} s)")
    return text + ("; interrupted" if run.get("interrupted") else "") + f"; command `{run.get('command', '')}`."


def _runs(runs: list[dict]) -> list[str]:
    """The first run, then each --resume that ran points: every number below came from one of them."""
    if not runs or runs[0].get("runner") is None:
        first = "- Ran on: not recorded (this sweep's folder was written before runs.json was kept)."
    else:
        first = f"- Ran on: {_run_line(runs[0])}"
    return [first] + [f"- Resumed on: {_run_line(r)}" for r in runs[1:]]


def _no_intervals(frame: pd.DataFrame, versions: list[str]) -> list[str]:
    """Points without a 95% interval of their median (under MIN_CI_SAMPLES timed runs) cannot rank versions: said
    once, up front, where two or more versions are compared."""
    ok = usable(frame)
    if len(versions) < 2 or ok.empty or "e2e_ci95_lo_us" not in ok:
        return []
    bare = ok[ok["e2e_ci95_lo_us"].isna() | ok["e2e_ci95_hi_us"].isna()]
    if bare.empty:
        return []
    return [f"- **{len(bare)} of {len(ok)} points have no 95% interval** of their total's median (a point needs "
            f"{MIN_CI_SAMPLES} timed runs for one; give --bench_runs {MIN_CI_SAMPLES} or more): where either of two "
            "versions has none, which is faster is unresolved below, possibly noise."]


def _devices(frame: pd.DataFrame) -> list[str]:
    if "device" not in frame or frame["device"].isna().all():
        return []
    used = frame.dropna(subset=["device"]).groupby(["device", "gpu_uuid"], dropna=False).size()
    cells = [f"{dev}{f' ({uuid})' if isinstance(uuid, str) else ''}: {n} point{'s' if n != 1 else ''}"
             for (dev, uuid), n in used.items()]
    out = [f"- Devices: {'; '.join(cells)}."]
    if (frame.get("runtime") == "cpu").any() and frame["worker"].nunique() > 1:
        out.append("- CPU points took turns on the one CPU lock: timings taken side by side on one CPU would "
                   "distort each other, so more workers only overlap start-up.")
    return out


def _same_code_on_cpu(kernel: str, versions: list[str], frame: pd.DataFrame) -> list[str]:
    """Versions whose CPU points time one version's stages (they differ in their GPU kernels only): the best version
    and the crossovers among them on the CPU are the runs' noise, not the versions'."""
    if "runtime" not in frame or not (frame["runtime"] == "cpu").any():
        return []
    return [f"- On the CPU, {kernel} {' and '.join(vs)} {'both' if len(vs) == 2 else 'all'} run {ran}'s stages "
            "(the versions differ in their GPU kernels only): their CPU points time the same code, so which of them "
            "is best there, and where they cross, is the runs' noise, not the versions'."
            for ran, vs in same_cpu_code(kernel, versions).items()]


def _failures(frame: pd.DataFrame) -> list[str]:
    bad = frame[frame["status"] != "ok"]
    retried = frame[(frame["attempts"] > 1) | (frame["worker_lost"] > 0)]
    out = []
    if not bad.empty:
        out += ["## Failures", "", "| point | status | attempts | error |", "|---|---|---|---|"]
        out += [f"| {r.point} | {r.status} | {r.attempts} | {r.error} |" for r in bad.itertuples()]
        out += ["", "A failed point was run twice (the second time on another worker where there was one); "
                "each failed attempt's log is in `points/<point>/attempt-N-failed.log`. `wrong` means the output "
                "differs from shapely's: its profile is kept and it is in no fit below.", ""]
    if not retried.empty:
        out += ["Points run again: " + ", ".join(
            f"{r.point} ({'worker lost ' + str(int(r.worker_lost)) + 'x' if r.worker_lost else ''}"
            f"{', ' if r.worker_lost and r.attempts > 1 else ''}{'failed once' if r.attempts > 1 else ''})"
            for r in retried.itertuples()) + ".", ""]
    return out


def _same_code_here(frame, grid: dict, a: str, b: str, kernel: str | None) -> bool:
    """Whether versions a and b timed the same code at this grid point: both ran on the CPU, where they run one
    version's stages (same_cpu_code)."""
    if kernel is None or "runtime" not in frame:
        return False
    here = frame[frame["version"].isin([a, b])]
    for name, value in grid.items():
        here = here[here[name] == value]
    return (len(here) >= 2 and (here["runtime"] == "cpu").all()
            and any(a in vs and b in vs for vs in same_cpu_code(kernel, [a, b]).values()))


def _best(frame, axes, versions=None, kernel: str | None = None) -> list[str]:
    rows = best_per_size(frame, axes, versions=versions)
    out = ["## Best version per size", "", "| " + " | ".join(axes) + " | best | total | runner-up | "
           "runner-up slower by |", "|" + "---|" * (len(axes) + 4)]
    for r in rows:
        cells = [human(_int(r["grid"][a])) for a in axes]
        # the versions with no time here: a best without a runner-up beat nothing
        others = ", ".join(f"{v} {_WHY.get(why, why)}" for v, why in r.get("others", {}).items())
        if "runner_up" in r and _same_code_here(frame, r["grid"], r["best"], r["runner_up"], kernel):
            gap = f"{(r['ratio'] - 1) * 100:.1f}% (the same code on the CPU: no winner, the runs' noise)"
            cells += [r["best"], _us(r["time_us"]), r["runner_up"] + (f" ({others})" if others else ""), gap]
            out.append("| " + " | ".join(cells) + " |")
            continue
        if "runner_up" in r:
            gap = f"{(r['ratio'] - 1) * 100:.1f}%" + _TIE[r["tie"]]
            slower = [f"its host CPU ran {r['host_slower_pct']:.1f}% slower, by a fixed Python loop"
                      if r.get("host_slower_pct") is not None else None,
                      f"its launches took {r['launch_slower_pct']:.1f}% longer, by an empty kernel's"
                      if r.get("launch_slower_pct") is not None else None]
            if any(slower):
                gap += f" ({'; '.join(x for x in slower if x)}: part of the gap may be the host's)"
            cells += [r["best"], _us(r["time_us"]), r["runner_up"] + (f" ({others})" if others else ""), gap]
        else:
            cells += [r["best"], _us(r["time_us"]), others or "-", "-"]
        out.append("| " + " | ".join(cells) + " |")
    return out + [""]


_TIE = {True: " (tie: the 95% intervals overlap)", False: "",
        None: f" (unresolved, possibly noise: no 95% interval, fewer than {MIN_CI_SAMPLES} timed runs)"}
_WHY = {"wrong": "wrong (output differs from shapely's)",
        "unverified": "unverified (the check against shapely could not run; the profile says why)"}


def _crossovers(frame, axes, versions) -> list[str]:
    if len(versions) < 2:
        return []
    found = crossovers(frame, axes, versions)
    out = ["## Crossovers", ""]
    skipped = _not_numeric(frame, axes, "no crossing is placed along it; the versions are compared at each of its "
                                        "values")
    if not numeric_axes(frame, axes):
        return out + ["No axis of this grid is numeric: there is no size between two values to cross at.", ""]
    if not found:
        return out + ["None inside the grid: the same version has the lower median at every size measured.",
                      *skipped, ""]
    unclear = [c for c in found if not c["clear"]]
    for c in found:
        if not c["clear"]:
            continue
        lo, hi = (human(_int(v)) for v in c["between"])
        fixed = f" (at {_grid(c['fixed'])})" if c["fixed"] else ""
        out.append(f"- Along {c['axis']}{fixed}: {c['faster_below']} is faster up to {lo} "
                   f"(by {100 * (c['ratio_below'] - 1):.1f}%), {c['faster_above']} from {hi} "
                   f"(by {100 * (c['ratio_above'] - 1):.1f}%); they cross near {c['axis']} = {human(round(c['at']))}.")
    reasons = {"overlap": "the two versions' 95% intervals overlap at one end",
               "no interval": f"a point at one end has no 95% interval: fewer than {MIN_CI_SAMPLES} timed runs"}
    listed = len(found) - len(unclear)
    for why, text in reasons.items():
        these = [c for c in unclear if c.get("why", "overlap") == why]
        if not these:
            continue
        more = " more" if listed else ""
        listed += len(these)
        out.append(f"- {len(these)}{more} crossing{'s' if len(these) > 1 else ''} not resolved ({text}), so possibly "
                   "noise: " + "; ".join(f"{' and '.join(c['versions'])} along {c['axis']} "
                                         f"{human(_int(c['between'][0]))}-{human(_int(c['between'][1]))}"
                                         + (f" at {_grid(c['fixed'])}" if c["fixed"] else "") for c in these) + ".")
    return out + skipped + [""]


def _not_numeric(frame, axes, what: str) -> list[str]:
    """A line per axis whose values are not numbers (a layout, a predicate): said, not silently left out."""
    return [f"- {a} is not numeric: {what}." for a in axes if a not in numeric_axes(frame, axes)]


def _not_sizes(spec, axes) -> list[str]:
    """The numeric axes the plan's work does not grow with (a seed): a slope along one describes no scaling. An axis
    is a size where its largest value needs more memory than its smallest (the plan's own footprint estimate, the
    one that refuses sizes that do not fit)."""
    plan_cls = get_plan_class(spec.kernel, spec.versions[0])
    base = {**spec.fixed, **{a: vals[0] for a, vals in spec.axes.items()}}
    out = []
    for a in axes:
        vals = [v for v in spec.axes[a] if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if len(vals) < 2:
            continue
        low, high = (plan_cls({**base, a: v}).footprint() for v in (min(vals), max(vals)))
        if low is not None and high is not None and \
                high.host_bytes + high.device_bytes <= low.host_bytes + low.device_bytes:
            out.append(a)
    return out


def _exponents(frame, axes, versions, stages, not_sizes=()) -> list[str]:
    sizes = [f"- {a} is not a size (the plan needs no more memory at its largest value than at its smallest): "
             "no growth is fitted along it; the fits along the other axes take one intercept per value of it."
             for a in not_sizes]
    fits = exponents(frame, axes, versions, stages, not_sizes)
    if not [a for a in numeric_axes(frame, axes) if a not in not_sizes]:
        return ["## Scaling exponents", "", "No axis of this grid is numeric and a size: no growth to fit.", ""] \
            + sizes + ([""] if sizes else [])
    if not fits:
        return ["## Scaling exponents", "", "Nothing to fit: a growth needs two or more values above 0 of an axis, "
                "with `ok` points at each.", ""] + sizes + ([""] if sizes else [])
    out = ["## Scaling exponents", "",
           "Time grows as n^b along each axis (the other axes held fixed). b is a least-squares log-log slope "
           "over all sizes, with its 95% interval; \"top\" is the slope between the two largest sizes, where "
           "fixed launch and host costs weigh least. \"model\" is the same fit of the cost model's bytes.",
           "", "| version | axis | measured | b [95% interval] | top | model | |", "|---|---|---|---|---|---|---|"]
    for f in fits:
        flag = f"**grows faster than its cost model** (by > {FASTER_THAN_MODEL})" if f["faster_than_model"] else ""
        top = f"n^{f['top_slope']:.2f}" if f["top_slope"] is not None else "-"
        model = f"n^{f['model_slope']:.2f}" if f["model_slope"] is not None else "-"
        out.append(f"| {f['version']} | {f['axis']} | {f['what']} | {_slope(f)} | {top} | {model} | {flag} |")
    headline = [f for f in fits if f["what"] == "total"]
    if headline:
        out += [""] + [f"- {f['version']}: the total grows as n^{f['slope']:.2f} in {f['axis']}"
                       + (f" (n^{f['top_slope']:.2f} at the top of the range)" if f["top_slope"] is not None else "")
                       + "." for f in headline]
    skipped = _not_numeric(frame, axes, "no growth is fitted along it; the fits along the other axes take one "
                                        "intercept per value of it") + sizes
    return out + [""] + (skipped + [""] if skipped else [])


def _points(frame, axes) -> list[str]:
    out = ["## Points", "", f"Spread is the robust relative spread of a point's timed runs (1.4826 MAD / median); over "
           f"{UNSTABLE_PCT:g}% the point is marked unstable: its median is still the figure, and its 95% interval "
           "(in results.csv) is what decides the ties above. Host loop: the median time of a fixed Python loop "
           "timed before each of the point's timed runs, the host CPU's pace in the point's own process (a "
           "launch-bound plan runs at that pace, and it can differ by half from one process to the next). Launch: "
           "what an empty kernel's launch cost the host, timed after the loop (GPU points), which sees changes of a "
           "launch-bound plan's pace the loop can miss.", "",
           "| point | status | total | spread | host loop | launch | device | GPU | worker | profile |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in frame.sort_values(["version", *axes]).to_dict("records"):
        pct = r.get("e2e_spread_pct")
        # judged as the profiles judge it, from 6 runs: a point with fewer has no 95% interval either
        judged = pd.notna(r.get("e2e_ci95_lo_us"))
        spread = (f"±{pct:.1f}%" + ((" unstable" if pct > UNSTABLE_PCT else "") if judged else " (not judged)")
                  if pd.notna(pct) else "missing")
        uuid = r.get("gpu_uuid") if isinstance(r.get("gpu_uuid"), str) else "-"
        link = f"[profile]({r['profile']}/report.md)" if isinstance(r.get("profile"), str) else "-"
        device = r.get("device") if isinstance(r.get("device"), str) else "-"
        loop, launch = (f"{v:,.1f} us" if isinstance(v, (int, float)) and pd.notna(v) else "-"
                        for v in (r.get("host_pace_us"), r.get("launch_pace_us")))
        out.append(f"| {r['point']} | {r['status']} | {_us(r.get('e2e_us'))} | {spread} | {loop} | {launch} | "
                   f"{device} | {uuid} | {r.get('worker')} | {link} |")
    return out + [""]
