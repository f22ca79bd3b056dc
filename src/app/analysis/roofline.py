"""Roofline from the plan's cost model: achieved rates against conf/devices.json peaks."""
from __future__ import annotations

from app.analysis.calibration import spec_for
from app.analysis.devices import ridge_points


def roofline_point(bytes_: float, flops: float, seconds: float, spec: dict, precision: str = "fp64") -> dict:
    """One stage (or the whole plan) on the device's roofline.

    ``pct_of_roofline`` = the fastest time the roofline allows / the measured time:
    max(bytes / peak GB/s, flops / peak FLOP/s) / seconds.
    """
    peak_bw = spec["memory_gbps"] * 1e9
    peak_fl = spec["peak_tflops"].get(precision, 0.0) * 1e12
    t_mem = bytes_ / peak_bw
    t_cmp = flops / peak_fl if peak_fl else 0.0
    out = {
        "bytes": bytes_, "flops": flops, "seconds": seconds, "precision": precision,
        "arithmetic_intensity": flops / bytes_ if bytes_ else None,
        "achieved_gbps": bytes_ / seconds / 1e9 if seconds > 0 else None,
        "achieved_tflops": flops / seconds / 1e12 if seconds > 0 else None,
        "roofline_seconds": max(t_mem, t_cmp),
        "bound_by": "memory" if t_mem >= t_cmp else "compute",
    }
    out["dram_pct"] = 100 * out["achieved_gbps"] * 1e9 / peak_bw if seconds > 0 else None
    out["flop_pct"] = 100 * flops / seconds / peak_fl if seconds > 0 and peak_fl else None
    out["pct_of_roofline"] = 100 * out["roofline_seconds"] / seconds if seconds > 0 else None
    out["flags"] = _flags(out, spec, precision)
    if out["flags"]:        # shown with the reason, used for no class, gain or advice
        out |= {"dram_pct": None, "flop_pct": None, "pct_of_roofline": None}
    return out


def _flags(p: dict, spec: dict, precision: str) -> list[str]:
    """What makes a point impossible: a cost model's negative bytes or FLOPs, a time that is not positive, or a
    rate above the device's peak -- the cost model counts the least a stage must move or compute, so it cannot
    run faster than the peak: its time or its cost is wrong."""
    out = []
    if p["bytes"] < 0 or p["flops"] < 0:
        out.append(f"the cost model's {p['bytes']:g} bytes and {p['flops']:g} FLOPs cannot be negative")
    if not p["seconds"] > 0:
        out.append(f"a time of {p['seconds'] * 1e6:g} us is not a measurement")
    if (p["dram_pct"] or 0) > 100:
        out.append(f"its cost model's bytes at {p['achieved_gbps']:,.1f} GB/s, {p['dram_pct']:.1f}% of the "
                   f"{spec['memory_gbps']:,.0f} GB/s peak: the time or the cost model is wrong")
    if (p["flop_pct"] or 0) > 100:
        out.append(f"its cost model's FLOPs at {p['achieved_tflops']:,.2f} TFLOP/s, {p['flop_pct']:.1f}% of the "
                   f"{precision} peak: the time or the cost model is wrong")
    return out


def plan_roofline(device_name: str, selected: str, stages: list[dict], precision: str = "fp64",
                  uuid: str | None = None, after_build_seconds: float | None = None) -> dict:
    """Per stage and end to end; says why when there is no roofline for this device. With ``uuid``, this
    GPU's calibrated peaks are used when cached (``peaks_source`` says which). ``after_build_seconds``: the runs'
    own median time of the stages after the copies (event mode's Timing figure), the end-to-end point's time where
    given; else the stages' own medians added up, which differ from any run's by the runs' spread."""
    if selected != "gpu":
        return {"available": False, "why": "ran on the CPU: conf/devices.json holds GPU peaks only"}
    key, spec = spec_for(device_name, uuid)
    if spec is None:
        return {"available": False,
                "why": f"device {device_name!r} is not in conf/devices.json; add its peaks there"}
    per_stage, tot_b, tot_f, tot_t = {}, 0.0, 0.0, 0.0
    for s in stages:
        cost = s["cost"]
        if cost["kind"] != "dram":   # host<->device copies run at link speed, not on this roofline
            continue
        per_stage[s["name"]] = roofline_point(cost["bytes"], cost["flops"], s["elapsed_seconds"], spec, precision)
        tot_b, tot_f, tot_t = tot_b + cost["bytes"], tot_f + cost["flops"], tot_t + s["elapsed_seconds"]
    flagged = [name for name, p in per_stage.items() if p["flags"]]
    # A sum over a flagged stage (a time that is no measurement, an impossible rate) is no end-to-end figure.
    tot_t = after_build_seconds if after_build_seconds else tot_t
    end = roofline_point(tot_b, tot_f, tot_t, spec, precision) if tot_t > 0 and not flagged else None
    return {
        "available": True, "device_model": key, "precision": precision,
        "peak_gbps": spec["memory_gbps"], "peak_tflops": spec["peak_tflops"].get(precision),
        "ridge_flop_per_byte": ridge_points(spec).get(precision), "ridge_points": ridge_points(spec),
        "sources": spec["sources"], "peaks_source": spec["peaks_source"], "stages": per_stage,
        "end_to_end": end,
        "end_to_end_why": (f"not summed: {', '.join(flagged)} flagged" if flagged else
                           "no device stage took any time" if end is None else None),
        "scope": "stages after the host->device copy",
    }
