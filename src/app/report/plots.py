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
