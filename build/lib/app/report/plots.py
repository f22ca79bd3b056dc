"""roofline.png: log-log, the device's fp64 roofs and ridge point, one point per kernel labelled by stage."""
from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def roofline_png(kernels, spec, title: str) -> bytes | None:
    if spec is None:
        return None
    peak_bw, peak_fl = spec["memory_gbps"] * 1e9, spec["peak_tflops"]["fp64"] * 1e12
    ridge = peak_fl / peak_bw
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    ai = np.logspace(-4, 3, 200)
    ax.plot(ai, np.minimum(peak_fl, ai * peak_bw) / 1e12, color="black", lw=1.5, label="fp64 roof")
    ax.axvline(ridge, color="grey", ls=":", lw=1)
    ax.annotate(f"ridge {ridge:.1f} FLOP/B", (ridge, peak_fl / 1e12), textcoords="offset points", xytext=(4, -12),
                fontsize=8)
    k = kernels[(kernels["dram_bytes"] > 0) & (kernels["duration_us"] > 0)]
    floor = 1e-4
    for stage, grp in k.groupby(k["stage"].fillna("(no stage)")):
        x = np.maximum(grp["arithmetic_intensity"].fillna(floor), floor)
        y = np.maximum(grp["achieved_tflops_fp64"], 1e-7)
        ax.scatter(x, y, s=22, label=stage)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (fp64 FLOP / DRAM byte)")
    ax.set_ylabel("TFLOP/s (fp64)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(True, which="both", alpha=0.2)
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


OP_COLORS = {"kernel": "#1f77b4", "HtoD": "#2ca02c", "DtoH": "#d62728", "DtoD": "#9467bd", "memset": "#7f7f7f"}
CAUSE_COLORS = {"busy": "#1f77b4", "before_first_op": "#ff7f0e", "launch_gap": "#d62728", "sync_wait": "#9467bd",
                "launch_latency": "#8c564b", "after_last_op": "#e377c2", "no_gpu_work": "#bcbd22"}


def timeline_png(tl, analysis: dict, title: str) -> bytes:
    """Top: the median iteration (stage ranges on the host, ops per stream). Bottom: each stage's span
    split into GPU busy and idle by cause (medians)."""
    iters = sorted(analysis["iterations"], key=lambda r: r["span_ns"])
    it = iters[len(iters) // 2]
    lo, hi = it["start_ns"], it["end_ns"]
    stages = analysis["stages"]
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(10, 3.2 + 0.35 * len(stages)), dpi=110,
                                 gridspec_kw={"height_ratios": [1.2, 1]})
    rows = [f"stream {s}" for s in sorted(set(tl.ops["stream"].tolist()))]
    ylabels = ["stages (host)"] + rows
    names = [s["name"] for s in stages]
    inst = [r for r in analysis["instances"] if lo <= r["start_ns"] and r["end_ns"] <= hi and r["name"] in names]
    for i, r in enumerate(inst):
        ax.broken_barh([((r["start_ns"] - lo) / 1e3, r["span_ns"] / 1e3)], (len(rows) - 0.4, 0.8),
                       facecolors=plt.cm.tab20(i % 20), edgecolor="black", lw=0.3)
        if r["span_ns"] > 0.06 * (hi - lo):        # name the wide ones; the lower panel names them all
            ax.text((r["start_ns"] - lo) / 1e3, len(rows), " " + r["name"], fontsize=6, va="center")
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
    ax.set_xlabel("us since the iteration's range opened (median iteration)", fontsize=8)
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
    bx.set_xlabel("us per instance (median): span = GPU busy + idle by cause", fontsize=8)
    bx.tick_params(labelsize=7)
    bx.legend(fontsize=6, loc="lower right", ncol=4)
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()
