"""The report's pictures, drawn with matplotlib (Agg: no display on the profiling machines).

roofline.png    counter modes: kernels that executed floating-point work against the fp64 and fp32 roofs.
bandwidth.png   counter modes: kernels with no floating-point work, achieved DRAM GB/s against the peak.
stage_chart.png event mode: time per stage, host issue time beside it, and the cost model's memory floor.
timeline.png    nsys mode: the median iteration and each stage's idle time by cause.

Rule for every picture: a value that was not measured (NaN: missing or flagged) is left out, never
drawn as zero or clamped to a corner; ``unplaced_kernels`` names what is in no picture, so the report
can say so (app.report.pictures). The point and row selections are
small pure functions (``fp_points``, ``bandwidth_rows``, ``stage_rows``) so tests check what is drawn
without reading images.
"""
from __future__ import annotations

import io
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from app.analysis.timeline import median_instance  # noqa: E402

PRECISIONS = ("fp64", "fp32")
MARKERS = {"fp64": "o", "fp32": "^"}
ROOF_STYLE = {"fp64": {"color": "black", "ls": "-"}, "fp32": {"color": "#555555", "ls": "-."}}
NO_STAGE = "(outside stages)"
LABELLED = 6           # roofline: name only the longest-running points; the legend colours the rest
MAX_BARS = 25          # bandwidth chart: beyond this the labels become unreadable


def short_name(kernel, width: int = 30) -> str:
    """A kernel's readable name: ``void cub::DeviceRadixSortOnesweepKernel<...>(...)`` ->
    ``DeviceRadixSortOnesweepKernel``. Template arguments and parameters are dropped (they are what
    makes C++ kernel names unreadable on a chart; kernels.csv keeps the full name)."""
    full = str(kernel)
    depth, kept = 0, []
    for ch in full:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth = max(depth - 1, 0)
        elif depth == 0:
            kept.append(ch)
    words = "".join(kept).split()
    name = words[-1].split("::")[-1] if words else ""
    name = name or full.strip()
    return name if len(name) <= width else name[: width - 1] + "\u2026"


def _measured(s: pd.Series) -> pd.Series:
    return pd.to_numeric(s, errors="coerce").notna()


def _stage_column(kernels: pd.DataFrame) -> pd.Series:
    return kernels["stage"].astype(object).where(kernels["stage"].notna(), NO_STAGE)


def _per_kernel(rows: pd.DataFrame, sums: list[str]) -> pd.DataFrame:
    """One row per (stage, kernel): a kernel launched several times in a stage is one point or bar,
    its rates taken from summed bytes, flops and time (the time-weighted rate over its launches)."""
    rows = rows.assign(stage=_stage_column(rows))
    agg = {c: (c, "sum") for c in sums} | {"launches": ("kernel", "size")}
    out = rows.groupby(["stage", "kernel"], sort=False).agg(**agg).reset_index()
    out.insert(2, "name", out["kernel"].map(short_name))
    return out


def fp_points(kernels: pd.DataFrame) -> pd.DataFrame:
    """The roofline's points: one per (stage, kernel, precision) whose FLOP count is measured and > 0,
    with measured DRAM bytes > 0 and duration > 0. Columns: stage, kernel, name, precision, launches,
    duration_us, dram_bytes, flops, intensity (FLOP/DRAM byte), tflops (achieved TFLOP/s).
    fp32 intensity and rate are derived here from fp32_flops (kernel_table derives only fp64's).
    Zero DRAM bytes would put a point at infinite intensity: such kernels are left out, like NaN ones."""
    cols = ["stage", "kernel", "name", "precision", "launches", "duration_us", "dram_bytes", "flops",
            "intensity", "tflops"]
    base = (_measured(kernels["dram_bytes"]) & (kernels["dram_bytes"] > 0)
            & _measured(kernels["duration_us"]) & (kernels["duration_us"] > 0))
    parts = []
    for prec in PRECISIONS:
        col = f"{prec}_flops"
        if col not in kernels:
            continue
        sel = kernels[base & _measured(kernels[col]) & (kernels[col] > 0)]
        if sel.empty:
            continue
        g = _per_kernel(sel.rename(columns={col: "flops"}), ["duration_us", "dram_bytes", "flops"])
        g["precision"] = prec
        g["intensity"] = g["flops"] / g["dram_bytes"]
        g["tflops"] = g["flops"] / (g["duration_us"] / 1e6) / 1e12
        parts.append(g)
    if not parts:
        return pd.DataFrame(columns=cols)
    return pd.concat(parts, ignore_index=True)[cols]


def no_fp_mask(kernels: pd.DataFrame) -> pd.Series:
    """Launches measured to execute no floating-point instruction: both counts measured and zero
    (a NaN count is unknown, not zero, so such a launch is in neither picture)."""
    return ((kernels["fp64_flops"] == 0) & (kernels["fp32_flops"] == 0)
            & _measured(kernels["fp64_flops"]) & _measured(kernels["fp32_flops"]))


def bandwidth_rows(kernels: pd.DataFrame, spec: dict | None) -> pd.DataFrame:
    """The bandwidth chart's bars: one per (stage, kernel) with no floating-point work, measured DRAM
    bytes and a duration > 0, longest-running first. Columns: stage, kernel, name, label ("stage: name",
    with the launch count when > 1), launches, duration_us, dram_bytes, achieved_gbps, pct_of_peak
    (NaN without a spec)."""
    sel = kernels[no_fp_mask(kernels) & _measured(kernels["dram_bytes"]) & _measured(kernels["duration_us"])
                  & (kernels["duration_us"] > 0)]
    cols = ["stage", "kernel", "name", "label", "launches", "duration_us", "dram_bytes", "achieved_gbps",
            "pct_of_peak"]
    if sel.empty:
        return pd.DataFrame(columns=cols)
    g = _per_kernel(sel, ["duration_us", "dram_bytes"])
    g["achieved_gbps"] = g["dram_bytes"] / (g["duration_us"] / 1e6) / 1e9
    g["pct_of_peak"] = 100 * g["achieved_gbps"] / spec["memory_gbps"] if spec else float("nan")
    g["label"] = [f"{s}: {n}" + (f" \u00d7{k}" if k > 1 else "") for s, n, k in zip(g["stage"], g["name"],
                                                                                     g["launches"])]
    return g.sort_values("duration_us", ascending=False, kind="stable").reset_index(drop=True)[cols]


def unplaced_kernels(kernels: pd.DataFrame) -> pd.DataFrame:
    """(stage, kernel) pairs in neither picture: FLOP counts, DRAM bytes or duration missing or flagged
    (or FP work with zero DRAM bytes). Reports name them so nothing silently disappears."""
    # (stage, kernel) tuples, not joined strings: pandas 3.0.6 dropped the "\x00" joining an object column to a
    # string one, so on an H200 host no key matched and every kernel of the pictures was called missing.
    stage = _stage_column(kernels)
    placed = set()
    for df in (fp_points(kernels), bandwidth_rows(kernels, None)):
        placed |= set(zip(df["stage"].tolist(), df["kernel"].astype(str).tolist()))
    keys = zip(stage.tolist(), kernels["kernel"].astype(str).tolist())
    left = kernels.assign(stage=stage)[[key not in placed for key in keys]]
    return left.groupby(["stage", "kernel"], sort=False).size().rename("launches").reset_index()


def _stage_colors(stages) -> dict:
    """The same stage keeps the same colour in every picture of one report (order of first appearance)."""
    order = list(dict.fromkeys(stages))
    cmap = plt.get_cmap("tab10")
    return {s: ("#9e9e9e" if s == NO_STAGE else cmap(i % 10)) for i, s in enumerate(order)}


def _pct(v: float) -> str:
    """Small shares keep a decimal: most of our kernels sit at 0.1-5% of peak, where "0%" says nothing."""
    return f"{v:.1f}%" if v < 10 else f"{v:.0f}%"


def png_bytes(fig, layout: bool = True, **savefig) -> bytes:
    """The figure as PNG bytes, closed. ``layout=False`` keeps a layout the caller set (a figure legend
    beside the panels); ``savefig`` passes dpi or bbox_inches on."""
    buf = io.BytesIO()
    if layout:
        fig.tight_layout()
    fig.savefig(buf, format="png", **savefig)
    plt.close(fig)
    return buf.getvalue()


def roofline_png(kernels, spec, title: str) -> bytes | None:
    """Log-log roofline: the DRAM roof, the fp64 and fp32 compute roofs with their ridge points, and one
    point per kernel per precision it executed (circle fp64, triangle fp32; colour = stage). None when
    there is no spec (no peaks to draw) or no kernel with measured FP work to place."""
    if spec is None:
        return None
    pts = fp_points(kernels)
    if pts.empty:
        return None
    bw = spec["memory_gbps"] * 1e9
    peaks = {p: spec["peak_tflops"][p] * 1e12 for p in PRECISIONS if spec.get("peak_tflops", {}).get(p)}
    ridges = {p: f / bw for p, f in peaks.items()}
    x_lo = min(pts["intensity"].min(), 1e-2) / 4
    x_hi = max([pts["intensity"].max()] + list(ridges.values())) * 8
    y_lo = min(pts["tflops"].min(), x_lo * bw / 1e12) / 4
    y_hi = max([pts["tflops"].max()] + [f / 1e12 for f in peaks.values()]) * 3
    fig, ax = plt.subplots(figsize=(8.5, 5.5), dpi=110)
    ai = np.logspace(math.log10(x_lo), math.log10(x_hi), 400)
    # The memory roof is shared; each precision's roof bends flat at its own ridge point.
    ax.plot(ai, ai * bw / 1e12, color="#1f4e79", lw=1, ls=":", label=f"DRAM roof {spec['memory_gbps']:,.0f} GB/s")
    for prec, peak in peaks.items():
        ax.plot(ai, np.minimum(peak, ai * bw) / 1e12, lw=1.6, label=f"{prec} roof {peak / 1e12:g} TFLOP/s",
                **ROOF_STYLE[prec])
        ax.plot([ridges[prec]], [peak / 1e12], marker="D", ms=6, color=ROOF_STYLE[prec]["color"])
        ax.annotate(f"{prec} ridge {ridges[prec]:.1f} FLOP/B", (ridges[prec], peak / 1e12),
                    textcoords="offset points", xytext=(6, 5 if prec == "fp32" else -11), fontsize=7)
    colors = _stage_colors(_stage_column(kernels))
    for (stage, prec), grp in pts.groupby(["stage", "precision"], sort=False):
        ax.scatter(grp["intensity"], grp["tflops"], s=36, marker=MARKERS[prec], color=colors[stage],
                   edgecolor="black", linewidth=0.4, zorder=3)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(x_lo, x_hi)
    ax.set_ylim(y_lo, y_hi)
    ax.set_xlabel("arithmetic intensity (FLOP per DRAM byte, of that precision)")
    ax.set_ylabel("achieved TFLOP/s")
    roof_handles, _ = ax.get_legend_handles_labels()
    plotted = set(pts["stage"])
    handles = roof_handles + [Line2D([], [], ls="", marker=MARKERS[p], color="grey", label=f"{p} work")
                              for p in PRECISIONS] + [Patch(color=c, label=s) for s, c in colors.items()
                                                      if s in plotted]
    ax.legend(handles=handles, fontsize=6.5, loc="upper left", ncol=2, framealpha=0.85)
    ax.grid(True, which="both", alpha=0.2)
    n_fp = pts.groupby(["stage", "kernel"]).ngroups
    n_no_fp = len(bandwidth_rows(kernels, spec))
    sub = f"{n_fp} kernel(s) with floating-point work; {LABELLED} longest named" if len(pts) > LABELLED \
        else f"{n_fp} kernel(s) with floating-point work"
    if n_no_fp:
        sub += f"; {n_no_fp} kernel(s) without FP work are in bandwidth.png"
    ax.set_title(f"{title}\n{sub}", fontsize=8.5)
    # Name only the longest-running points (the ones worth a look); the stage legend covers the rest.
    top = pts.sort_values("duration_us", ascending=False).head(LABELLED)
    fig.tight_layout()                        # label spacing is worked out on the final axes size
    for r, (dx, dy) in zip(top.itertuples(), _label_offsets(ax, top["intensity"], top["tflops"])):
        ax.annotate(f"{r.name} ({r.precision})", (r.intensity, r.tflops), textcoords="offset points",
                    xytext=(dx, dy), fontsize=6.5, va="center", zorder=4,
                    arrowprops={"arrowstyle": "-", "lw": 0.5, "color": "grey", "shrinkA": 1, "shrinkB": 3})
    return png_bytes(fig)


def _label_offsets(ax, xs, ys, gap: float = 9.0, width: float = 110.0) -> list[tuple[float, float]]:
    """Text offsets (points) so that labels of nearby points neither print over each other nor over
    the points: a label starts right of every labelled point near it (``width`` across, 3 ``gap`` up or
    down), and from the highest point down a label that would overlap one already placed moves below
    it. A thin line joins each label to its point."""
    per_px = 72 / ax.figure.dpi
    disp = ax.transData.transform(np.column_stack([np.asarray(xs, float), np.asarray(ys, float)])) * per_px
    placed: list[tuple[float, float]] = []
    offsets = [(0.0, 0.0)] * len(disp)
    for i in np.argsort(-disp[:, 1], kind="stable"):
        x, y = disp[i]
        near = disp[(np.abs(disp[:, 0] - x) < width) & (np.abs(disp[:, 1] - y) < 3 * gap)]
        x_text = near[:, 0].max() + 14
        for px, py in sorted(placed, key=lambda p: -p[1]):
            if abs(px - x_text) < width and abs(py - y) < gap:
                y = py - gap
        placed.append((x_text, y))
        offsets[i] = (x_text - x, y - disp[i, 1])
    return offsets


def bandwidth_png(kernels, spec, title: str) -> bytes | None:
    """Horizontal bars: achieved DRAM GB/s of each kernel without floating-point work, longest-running
    on top, the device's datasheet peak as a vertical line. None without a spec or without such kernels."""
    if spec is None:
        return None
    rows = bandwidth_rows(kernels, spec)
    if rows.empty:
        return None
    shown, left_out = rows.head(MAX_BARS), max(len(rows) - MAX_BARS, 0)
    peak = spec["memory_gbps"]
    colors = _stage_colors(_stage_column(kernels))
    fig, ax = plt.subplots(figsize=(9, 1.6 + 0.3 * len(shown)), dpi=110)
    y = np.arange(len(shown))
    ax.barh(y, shown["achieved_gbps"], color=[colors[s] for s in shown["stage"]], edgecolor="black", lw=0.3)
    ax.axvline(peak, color="#c00000", ls="--", lw=1.2, label=f"peak {peak:,.0f} GB/s (datasheet)")
    x_hi = max(peak, float(shown["achieved_gbps"].max())) * 1.45      # room for the text right of each bar
    for yi, r in zip(y, shown.itertuples()):
        ax.text(r.achieved_gbps + x_hi * 0.01, yi, f"{r.achieved_gbps:,.0f} GB/s = {_pct(r.pct_of_peak)} of peak, "
                f"{r.duration_us:,.1f} us", va="center", fontsize=6.5)
    ax.set_yticks(y)
    ax.set_yticklabels(shown["label"], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, x_hi)
    ax.set_xlabel("achieved DRAM GB/s (bytes read + written / kernel time)")
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(True, axis="x", alpha=0.2)
    sub = f"{len(shown)} longest-running kernel(s) without floating-point work, longest on top"
    if left_out:
        sub += f"; {left_out} shorter one(s) left out"
    ax.set_title(f"{title}\n{sub}", fontsize=8.5)
    return png_bytes(fig)


def stage_rows(trace: dict, roof: dict) -> pd.DataFrame:
    """Per stage in plan order: device_us (the stage's measured time, median of timed runs), host_us
    (time the host spent issuing it), floor_us (the cost model's bytes / peak GB/s; NaN where
    there is no roofline or the stage is a host<->device copy) and a note on what the numbers mean."""
    available = bool(roof and roof.get("available"))
    rows = []
    for s in trace.get("stages", []):
        point = (roof.get("stages") or {}).get(s["name"]) if available else None
        floor = point["bytes"] / (roof["peak_gbps"] * 1e9) * 1e6 if point is not None else float("nan")
        device_us = (s.get("elapsed_seconds") or 0.0) * 1e6
        notes = []
        if s.get("device") == "cpu":
            notes.append("ran on the CPU")
        elif device_us <= 0:
            notes.append("no GPU work")
        if available and point is None:
            kind = (s.get("cost") or {}).get("kind")
            notes.append("host link copy: no DRAM floor" if kind == "host_link" else "no DRAM floor")
        host = s.get("host_seconds")
        rows.append({"stage": s["name"], "device": s.get("device"), "device_us": device_us,
                     "host_us": host * 1e6 if host is not None else float("nan"), "floor_us": floor,
                     "note": "; ".join(notes)})
    return pd.DataFrame(rows, columns=["stage", "device", "device_us", "host_us", "floor_us", "note"])


def stage_chart_subtitle(roof: dict) -> str:
    """The stage chart's second title line: where the floor comes from, or why there is none."""
    if roof and roof.get("available"):
        return (f"floor = the cost model's DRAM bytes / {roof['peak_gbps']:,.0f} GB/s "
                f"({roof['device_model']})")
    return "no memory-roof floor: " + ((roof or {}).get("why") or "no roofline for this run")


LEGEND_ROWS = 1.4     # the stage chart's empty band for its legend, in stage rows


def stage_chart_png(trace: dict, roof: dict, title: str) -> bytes | None:
    """Event mode: per stage a thick bar of measured time and, inside it, a thin bar of host issue
    time. GPU work is asynchronous, so the two overlap in time and are never stacked; host close to the
    stage time means the stage is launch-bound. A black diamond marks the memory-roof floor. None only
    when the trace has no stages."""
    fig = stage_chart_figure(trace, roof, title)
    return None if fig is None else png_bytes(fig)


def stage_chart_figure(trace: dict, roof: dict, title: str):
    """The stage chart's figure (stage_chart_png), laid out, or None when the trace has no stages."""
    rows = stage_rows(trace, roof)
    if rows.empty:
        return None
    positive = pd.concat([rows["device_us"], rows["host_us"], rows["floor_us"]])
    positive = positive[positive > 0]
    # Floors are often 10-1000x below the stage time: on a linear axis they would sit on zero unseen.
    log = len(positive) > 0 and positive.max() / positive.min() > 50
    fig, ax = plt.subplots(figsize=(9, 2.4 + 0.45 * len(rows)), dpi=110)
    y = np.arange(len(rows))
    clock = trace.get("timing", {}).get("clock", "stage clock")
    dev_color = ["#e39b3b" if d == "cpu" else "#1f77b4" for d in rows["device"]]
    ax.barh(y, rows["device_us"], height=0.62, color=dev_color, edgecolor="black", lw=0.3)
    ax.barh(y, rows["host_us"].fillna(0), height=0.2, color="#333333", zorder=3)
    has_floor = rows["floor_us"].notna()
    ax.scatter(rows.loc[has_floor, "floor_us"], y[has_floor.to_numpy()], marker="D", s=40, color="black",
               edgecolor="white", linewidth=0.6, zorder=4)
    top = float(positive.max()) if len(positive) else 1.0
    for yi, r in zip(y, rows.itertuples()):
        text = f"{r.device_us:,.1f} us, host {r.host_us:,.1f} us"
        if r.floor_us == r.floor_us:
            text += f", floor {r.floor_us:,.2f} us"
        if r.note:
            text += f" ({r.note})"
        x = max(r.device_us, 0 if r.host_us != r.host_us else r.host_us)
        x = x * 1.15 if log and x > 0 else (x + top * 0.01 if x > 0 else (positive.min() if log else 0))
        ax.text(x, yi, text, va="center", fontsize=6.5)
    ax.set_yticks(y)
    ax.set_yticklabels(rows["stage"], fontsize=7.5)
    # An empty band below the last stage holds the legend, which sat on the last stage's bar and its figures.
    ax.set_ylim(len(rows) + LEGEND_ROWS - 0.5, -0.5)
    if log:
        ax.set_xscale("log")
        ax.set_xlim(positive.min() / 3, top * 40)
    else:
        ax.set_xlim(0, top * 1.9)
    runs = trace.get("timing", {}).get("timed_runs")
    ax.set_xlabel(f"us per stage, median of {runs} timed runs{' (log scale)' if log else ''}; the thin host-issue "
                  "bar overlaps the stage bar in time, the two do not add", fontsize=7.5)
    on_cpu = rows["device"] == "cpu"
    handles = ([Patch(color="#1f77b4", label=f"stage time on the GPU, {clock}")] if (~on_cpu).any() else []) \
        + ([Patch(color="#e39b3b", label=f"stage time on the CPU, {clock}")] if on_cpu.any() else []) \
        + [Patch(color="#333333", label="host issue time (overlaps, not additive)")]
    if has_floor.any():
        handles.append(Line2D([], [], ls="", marker="D", color="black", label="memory-roof floor: min bytes / peak GB/s"))
    ax.legend(handles=handles, fontsize=6.5, loc="lower right", framealpha=0.85)
    ax.grid(True, axis="x", which="both", alpha=0.2)
    ax.set_title(f"{title}\n{stage_chart_subtitle(roof)}", fontsize=8.5)
    fig.tight_layout()
    return fig


OP_COLORS = {"kernel": "#1f77b4", "HtoD": "#2ca02c", "DtoH": "#d62728", "DtoD": "#9467bd", "memset": "#7f7f7f"}
CAUSE_COLORS = {"busy": "#1f77b4", "before_first_op": "#ff7f0e", "launch_gap": "#d62728", "sync_wait": "#9467bd",
                "launch_call": "#17becf", "launch_latency": "#8c564b", "after_last_op": "#e377c2",
                "no_gpu_work": "#bcbd22"}
LABEL_PT_PER_CHAR = 3.6      # a 6 pt label's average character width, for fitting stage names in their bars


def shown_iteration(analysis: dict) -> dict:
    """The iteration instance the report's tables read (the lower middle one for an even count), so the figure
    shows the same iteration: it had plotted the upper middle one under the label 'median iteration'."""
    return median_instance(analysis["iterations"])


def fit_label(name: str, width_pt: float) -> str:
    """``name`` cut to fit a bar ``width_pt`` points wide (with a trailing '.'), or '' where not even three
    characters fit: adjacent stages' full names had run together ('reconstructionarea_reconstruction')."""
    room = int(width_pt // LABEL_PT_PER_CHAR) - 1        # a leading space
    if room >= len(name):
        return " " + name
    return " " + name[:room - 1] + "." if room >= 4 else ""


def timeline_png(tl, analysis: dict, title: str) -> bytes:
    """Top: the median iteration, the whole iteration's row of the accounting table (stage ranges on the host, ops
    per stream). Bottom: each stage's span
    split into GPU busy and idle by cause (each stage's median instance)."""
    it = shown_iteration(analysis)
    lo, hi = it["start_ns"], it["end_ns"]
    stages = analysis["stages"]
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(10, 3.2 + 0.35 * len(stages)), dpi=110,
                                 gridspec_kw={"height_ratios": [1.2, 1]})
    rows = [f"stream {s}" for s in sorted(set(tl.ops["stream"].tolist()))]
    ylabels = ["stages (host)"] + rows
    names = [s["name"] for s in stages]
    inst = [r for r in analysis["instances"] if lo <= r["start_ns"] and r["end_ns"] <= hi and r["name"] in names]
    axis_pt = 10 * 72 * 0.85                          # the top axes' width in points, about (10 in figure)
    for i, r in enumerate(inst):
        ax.broken_barh([((r["start_ns"] - lo) / 1e3, r["span_ns"] / 1e3)], (len(rows) - 0.4, 0.8),
                       facecolors=plt.cm.tab20(i % 20), edgecolor="black", lw=0.3)
        label = fit_label(r["name"], axis_pt * r["span_ns"] / (hi - lo))   # within its own bar; the lower panel
        if label:                                                          # names them all
            ax.text((r["start_ns"] - lo) / 1e3, len(rows), label, fontsize=6, va="center")
    ops = tl.ops[(tl.ops["end"] > lo) & (tl.ops["start"] < hi)]
    key = [k if k != "memcpy" else (c if c in OP_COLORS else "DtoD") for k, c in zip(ops["kind"], ops["copy"])]
    for j, row in enumerate(rows):
        on_row = (ops["stream"].map(lambda s: f"stream {s}") == row).to_numpy()
        for kind in OP_COLORS:
            sel = ops[on_row & (np.array(key, dtype=object) == kind)]
            if len(sel):
                ax.broken_barh([((a - lo) / 1e3, max((b - a) / 1e3, 0.3)) for a, b in zip(sel["start"], sel["end"])],
                               (len(rows) - 1 - j - 0.35, 0.7), facecolors=OP_COLORS[kind], label=kind)
    ax.set_yticks(range(len(ylabels)))
    ax.set_yticklabels(list(reversed(rows)) + ["stages (host)"], fontsize=7)
    ax.set_xlim(0, (hi - lo) / 1e3)
    ax.set_xlabel(f"us since the iteration's range opened (iteration {it['instance'] + 1} of "
                  f"{len(analysis['iterations'])}: the median one, the whole iteration's row in the accounting "
                  "table;\neach stage's row of the tables is that stage's own median instance)", fontsize=8)
    handles, labels = ax.get_legend_handles_labels()
    uniq = dict(zip(labels, handles))
    ax.legend(uniq.values(), uniq.keys(), fontsize=6, loc="lower right", ncol=5)
    ax.set_title(title, fontsize=9)
    left = np.zeros(len(stages))
    parts = [("busy", [s["busy_us"] for s in stages])] + \
            [(c, [s["idle_us"][c] for s in stages]) for c in CAUSE_COLORS if c != "busy"]
    for key, vals in parts:
        vals = np.array(vals)
        if vals.any():
            bx.barh(names, vals, left=left, color=CAUSE_COLORS[key], label=key.replace("_", " "))
            left += vals
    bx.invert_yaxis()
    bx.set_xlabel("us, each stage's median instance: span = GPU busy + idle by cause", fontsize=8)
    bx.tick_params(labelsize=7)
    bx.legend(fontsize=6, loc="lower right", ncol=4)
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()
