"""The counter modes' pictures (roofline.png, bandwidth.png) and the report sections that embed them.

Every picture that cannot be drawn gets a section saying why in plain words, so a missing picture is
never a silent gap in report.md.
"""
from __future__ import annotations

import pandas as pd

from app.report.markdown import Section

ROOFLINE_TITLE = "Roofline (measured, kernels with floating-point work)"
BANDWIDTH_TITLE = "DRAM bandwidth (kernels without floating-point work)"
DEVICES_TABLE = "the devices table (conf/devices.json)"
NAMED = 10        # kernels named in the "not in either picture" note


def picture_sections(kernels: pd.DataFrame, spec: dict | None, title: str,
                     device_name: str | None = None) -> tuple[dict[str, bytes], list[Section]]:
    """roofline.png and bandwidth.png from kernel_table's output, and a Section per picture: the
    embedded image with a one-line reading guide, or the reason it is not there. ``device_name`` only
    names the GPU in the "not in the devices table" reason."""
    from app.report import plots      # matplotlib: only when a plot is drawn

    files: dict[str, bytes] = {}
    sections: list[Section] = []
    gpu = repr(device_name) if device_name else "This GPU"
    bw_png = plots.bandwidth_png(kernels, spec, title)
    roof_png = plots.roofline_png(kernels, spec, title)

    if roof_png is not None:
        files["roofline.png"] = roof_png
        sections.append(Section(ROOFLINE_TITLE, text=(
            "![Roofline: achieved TFLOP/s against FLOP per DRAM byte, fp64 and fp32 roofs](roofline.png)\n\n"
            + _roofs(spec) + " "
            "How to read it: each point is one kernel of one stage (circle = its fp64 work, triangle = its fp32 "
            "work, colour = stage); left of a ridge point (diamond) the DRAM roof caps it, right of it the "
            "compute roof, and the distance below the roof over a point is its headroom.")))
    else:
        sections.append(Section(ROOFLINE_TITLE, text=_no_roofline(kernels, spec, gpu, bw_png is not None)))

    if bw_png is not None:
        files["bandwidth.png"] = bw_png
        sections.append(Section(BANDWIDTH_TITLE, text=(
            "![Achieved DRAM GB/s per kernel without floating-point work, against the peak](bandwidth.png)\n\n"
            "How to read it: one bar per kernel (its launches in one stage pooled), the kernels taking the most "
            "time on top; the dashed line is the datasheet peak, so a top bar far left of it is a kernel held "
            "back by something other than DRAM bandwidth (latency, occupancy, atomics).")))
    else:
        sections.append(Section(BANDWIDTH_TITLE, text=_no_bandwidth(kernels, spec, gpu)))

    left = plots.unplaced_kernels(kernels)
    if files and len(left):        # with no picture at all the reasons above already cover every kernel
        names = [f"{s}: {plots.short_name(k)}" for s, k in zip(left["stage"], left["kernel"])]
        more = f" and {len(names) - NAMED} more" if len(names) > NAMED else ""
        sections[-1].note = (f"Not in either picture, {len(names)} kernel(s) whose FLOP counts, DRAM bytes or "
                             f"duration are missing or flagged (see kernels.csv): {', '.join(names[:NAMED])}{more}.")
    return files, sections


def _roofs(spec: dict) -> str:
    peaks, gbps = spec["peak_tflops"], spec["memory_gbps"]
    return (f"Peaks, {spec.get('peaks_source', 'datasheet')}: {gbps:,.0f} GB/s; {peaks['fp64']:,.1f} TFLOP/s fp64 "
            f"(ridge {peaks['fp64'] * 1e3 / gbps:.1f} FLOP/byte) and {peaks['fp32']:,.1f} TFLOP/s fp32 (ridge "
            f"{peaks['fp32'] * 1e3 / gbps:.1f} FLOP/byte). "
            "% roofline in the Kernels table = the time the kernel would take at its binding roof / its "
            "measured time.")


def _no_roofline(kernels: pd.DataFrame, spec: dict | None, gpu: str, has_bandwidth: bool) -> str:
    if spec is None:
        return (f"No roofline: {gpu} is not in {DEVICES_TABLE}, so its peak bandwidth and FLOP rates are "
                "unknown; `python -m app.kernel devices` shows the table and where it lives: add the GPU's "
                "datasheet peaks there to draw one. Every measured figure above stands without it.")
    fp = pd.Series(False, index=kernels.index)
    for col in ("fp64_flops", "fp32_flops"):
        if col in kernels:
            fp |= kernels[col] > 0
    if fp.any():
        return (f"No roofline: {int(fp.sum())} kernel launch(es) executed floating-point instructions, but their "
                "DRAM bytes or duration are missing, flagged or zero, so none can be placed (see kernels.csv).")
    see = "; see the bandwidth chart." if has_bandwidth else "."
    unknown = sum(int(kernels[c].isna().sum()) for c in ("fp64_flops", "fp32_flops") if c in kernels)
    if unknown:
        return ("No roofline: no profiled kernel has a measured floating-point count above zero (some FLOP "
                f"counters were missing or flagged){see}")
    return f"No roofline: none of the profiled kernels executed floating-point instructions{see}"


def _no_bandwidth(kernels: pd.DataFrame, spec: dict | None, gpu: str) -> str:
    if spec is None:
        return (f"No bandwidth chart: {gpu} is not in {DEVICES_TABLE}, so there is no peak GB/s to compare "
                "with; add its datasheet peaks to draw one.")
    return ("No bandwidth chart: no profiled kernel is known to execute no floating-point instructions with "
            "measured DRAM bytes (every kernel did FP work and is on the roofline, or its FLOP counts or DRAM "
            "bytes are missing or flagged).")
