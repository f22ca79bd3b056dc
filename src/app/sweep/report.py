"""A sweep's report.md, written from results.csv alone (so a resumed or interrupted sweep reports
what it has): where it ran, what failed, the best version per size, crossovers, scaling exponents,
the pictures, and every point with a link to its profile."""
from __future__ import annotations

import math

import pandas as pd

from app.kernel.plan import human, same_cpu_code
from app.sweep.plots import scaling_png, speedup_png
from app.runtime.stats import STABLE_REL_SPREAD
from app.sweep.scaling import FASTER_THAN_MODEL, best_per_size, crossovers, exponents

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


def sweep_files(spec, frame: pd.DataFrame, stages: list[str], run: dict) -> dict:
    """report.md, scaling.png and speedup.png for the table ``frame``."""
    axes, versions = list(spec.axes), spec.versions
    title = f"{spec.kernel} {', '.join(versions)} over {' x '.join(axes)} ({spec.prof_type} mode)"
    files, lines = {}, [f"# Sweep: {title}", ""]
    counts = frame["status"].value_counts().to_dict() if len(frame) else {}
    total = len(spec.points())
    lines += [f"- Points: {total} ({', '.join(f'{n} {s}' for s, n in sorted(counts.items())) or 'none finished'}"
              f"{f', {total - len(frame)} not run' if len(frame) < total else ''}).",
              f"- Grid: {'; '.join(f'{a} = ' + ', '.join(human(v) for v in vals) for a, vals in spec.axes.items())}"
              + (f"; fixed: {_grid(spec.fixed)}" if spec.fixed else "") + ".",
              f"- Ran on: {run.get('runner', '?')}; wall time {run.get('wall_seconds', float('nan')):,.1f} s"
              + (f" (start {run['start_seconds']:,.1f} s, points {run['points_seconds']:,.1f} s, shutdown "
                 f"{run['close_seconds']:,.1f} s)" if "close_seconds" in run else "") + ".",
              f"- Command: `{run.get('command', '')}`"]
    lines += _devices(frame)
    lines += _same_code_on_cpu(spec.kernel, versions, frame)
    lines += ["- Times are medians of each point's timed runs, end to end (host arrays in). Each point is an "
              "ordinary profile under `points/`, taken under the lock of the device it ran on.", ""]
    lines += _failures(frame)
    if frame.empty or not (frame["status"] == "ok").any():
        lines += ["No point finished with a verified result: nothing to fit.", ""]
        return {"report.md": "\n".join(lines)}
    lines += _best(frame, axes)
    lines += _crossovers(frame, axes, versions)
    lines += _exponents(frame, axes, versions, stages)
    for name, png in (("scaling.png", scaling_png(frame, axes, versions, stages, title)),
                      ("speedup.png", speedup_png(frame, axes, versions, title))):
        if png is not None:
            files[name] = png
            lines += [f"![{name}]({name})", ""]
    lines += _points(frame, axes)
    files["report.md"] = "\n".join(lines)
    return files


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


def _best(frame, axes) -> list[str]:
    rows = best_per_size(frame, axes)
    out = ["## Best version per size", "", "| " + " | ".join(axes) + " | best | end to end | runner-up | "
           "runner-up slower by |", "|" + "---|" * (len(axes) + 4)]
    for r in rows:
        cells = [human(_int(r["grid"][a])) for a in axes]
        if "runner_up" in r:
            gap = f"{(r['ratio'] - 1) * 100:.1f}%" + (" (tie: the 95% intervals overlap)" if r["tie"] else "")
            slower = [f"its host CPU ran {r['host_slower_pct']:.1f}% slower, by a fixed Python loop"
                      if r.get("host_slower_pct") is not None else None,
                      f"its launches took {r['launch_slower_pct']:.1f}% longer, by an empty kernel's"
                      if r.get("launch_slower_pct") is not None else None]
            if any(slower):
                gap += f" ({'; '.join(x for x in slower if x)}: part of the gap may be the host's)"
            cells += [r["best"], _us(r["time_us"]), r["runner_up"], gap]
        else:
            cells += [r["best"], _us(r["time_us"]), "-", "-"]
        out.append("| " + " | ".join(cells) + " |")
    return out + [""]


def _crossovers(frame, axes, versions) -> list[str]:
    if len(versions) < 2:
        return []
    found = crossovers(frame, axes, versions)
    out = ["## Crossovers", ""]
    if not found:
        return out + ["None inside the grid: the same version is faster at every size measured.", ""]
    unclear = [c for c in found if not c["clear"]]
    for c in found:
        if not c["clear"]:
            continue
        lo, hi = (human(_int(v)) for v in c["between"])
        fixed = f" (at {_grid(c['fixed'])})" if c["fixed"] else ""
        out.append(f"- Along {c['axis']}{fixed}: {c['faster_below']} is faster up to {lo} "
                   f"(by {100 * (c['ratio_below'] - 1):.1f}%), {c['faster_above']} from {hi} "
                   f"(by {100 * (c['ratio_above'] - 1):.1f}%); they cross near {c['axis']} = {human(round(c['at']))}.")
    if unclear:
        more = " more" if len(unclear) < len(found) else ""
        out.append(f"- {len(unclear)}{more} crossing{'s' if len(unclear) > 1 else ''} within the run spread (the two "
                   "versions' 95% intervals overlap at one end), so possibly noise: " + "; ".join(
                       f"{c['axis']} {human(_int(c['between'][0]))}-{human(_int(c['between'][1]))}"
                       + (f" at {_grid(c['fixed'])}" if c["fixed"] else "") for c in unclear) + ".")
    return out + [""]


def _exponents(frame, axes, versions, stages) -> list[str]:
    fits = exponents(frame, axes, versions, stages)
    out = ["## Scaling exponents", "",
           "Time grows as n^b along each axis (the other axes held fixed). b is a least-squares log-log slope "
           "over all sizes, with its 95% interval; \"top\" is the slope between the two largest sizes, where "
           "fixed launch and host costs weigh least. \"model\" is the same fit of the cost model's minimum bytes.",
           "", "| version | axis | measured | b [95% interval] | top | model | |", "|---|---|---|---|---|---|---|"]
    for f in fits:
        flag = f"**grows faster than its cost model** (by > {FASTER_THAN_MODEL})" if f["faster_than_model"] else ""
        top = f"n^{f['top_slope']:.2f}" if f["top_slope"] is not None else "-"
        model = f"n^{f['model_slope']:.2f}" if f["model_slope"] is not None else "-"
        out.append(f"| {f['version']} | {f['axis']} | {f['what']} | {_slope(f)} | {top} | {model} | {flag} |")
    headline = [f for f in fits if f["what"] == "end to end"]
    if headline:
        out += [""] + [f"- {f['version']}: end-to-end time grows as n^{f['slope']:.2f} in {f['axis']}"
                       + (f" (n^{f['top_slope']:.2f} at the top of the range)" if f["top_slope"] is not None else "")
                       + "." for f in headline]
    return out + [""]


def _points(frame, axes) -> list[str]:
    out = ["## Points", "", f"Spread is the robust relative spread of a point's timed runs (1.4826 MAD / median); over "
           f"{UNSTABLE_PCT:g}% the point is marked unstable: its median is still the figure, and its 95% interval "
           "(in results.csv) is what decides the ties above. Host loop: the median time of a fixed Python loop "
           "timed before each of the point's timed runs, the host CPU's pace in the point's own process (a "
           "launch-bound plan runs at that pace, and it can differ by half from one process to the next). Launch: "
           "what an empty kernel's launch cost the host, timed after the loop (GPU points), which sees changes of a "
           "launch-bound plan's pace the loop can miss.", "",
           "| point | status | end to end | spread | host loop | launch | device | GPU | worker | profile |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in frame.sort_values(["version", *axes]).to_dict("records"):
        pct = r.get("e2e_spread_pct")
        spread = (f"±{pct:.1f}%" + (" unstable" if pct > UNSTABLE_PCT else "")) if pd.notna(pct) else "missing"
        uuid = r.get("gpu_uuid") if isinstance(r.get("gpu_uuid"), str) else "-"
        link = f"[profile]({r['profile']}/report.md)" if isinstance(r.get("profile"), str) else "-"
        device = r.get("device") if isinstance(r.get("device"), str) else "-"
        loop, launch = (f"{v:,.1f} us" if isinstance(v, (int, float)) and pd.notna(v) else "-"
                        for v in (r.get("host_pace_us"), r.get("launch_pace_us")))
        out.append(f"| {r['point']} | {r['status']} | {_us(r.get('e2e_us'))} | {spread} | {loop} | {launch} | "
                   f"{device} | {uuid} | {r.get('worker')} | {link} |")
    return out + [""]
