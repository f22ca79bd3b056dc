"""The few numbers a devlog entry carries, per mode, stored in trace.json as ``summary``.

Every field is measured or derived from a measurement of that profile; a metric
the mode does not measure is None and named in ``missing`` with the reason --
never a zero.
"""
from __future__ import annotations

import math


def _num(v):
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def event_summary(trace: dict, roof: dict, findings: list[dict], ops: list[dict], bottleneck: str) -> dict:
    e = roof.get("end_to_end") if roof.get("available") else None
    occ = [s["metadata"]["theoretical_occupancy_pct"] for s in trace["stages"]
           if s["metadata"].get("theoretical_occupancy_pct") is not None]
    missing = {"sm_pct": "sm__throughput is a counter; event mode measures time only (run --prof_type annotation)"}
    if e is None:
        why = roof.get("why", "no roofline")
        missing |= {"achieved_tflops": why, "achieved_gbps": why}
    if not occ:
        missing["occupancy_pct"] = "no compiled kernels to compute it from (CPU run)"
    return {
        "duration_us": trace["total_elapsed_seconds"] * 1e6,
        "achieved_tflops": _num(e["achieved_tflops"]) if e else None,
        "achieved_gbps": _num(e["achieved_gbps"]) if e else None,
        "rates_from": "cost-model bytes and FLOPs over measured time (stages after the host->device copy)",
        "occupancy_pct": min(occ) if occ else None, "occupancy_kind": "theoretical, lowest stage",
        "sm_pct": None, "bottleneck": bottleneck,
        "issues": [f"{f['stage']}: {f['key_issue']}" for f in findings if f["key_issue"] != "-"],
        "insights": [f"{o['name']} (trigger {o['trigger']})" for o in ops[:3]],
        "missing": missing,
    }


def counter_summary(stages, kernels, ops: list[dict]) -> dict:
    """annotation and ncu modes: ncu's own per-kernel metrics of the stage kernels (those the stages' times
    sum), summed or time-weighted. A kernel outside every stage counts in neither the time nor the rates."""
    kernels = kernels[kernels["stage"].notna()]
    w = kernels["duration_us"]
    missing, totals = {}, {}
    untimed = int(w.isna().sum())
    dur = float(w.sum()) if not untimed and len(w) else None
    if dur is None:
        missing["duration_us"] = (f"gpu__time_duration.sum missing or flagged for {untimed} of {len(w)} stage "
                                  "kernels" if untimed else "no stage kernels in this capture")

    def weighted(key: str, col: str):
        if col not in kernels or kernels[col].isna().any() or dur is None or not dur > 0:
            missing[key] = (f"{col} missing for some kernels of this capture" if dur is not None
                            else missing["duration_us"] + " (the weights)")
            return None
        return float((kernels[col] * w).sum() / dur)

    top = stages[stages["kernels"] > 0].sort_values("duration_us", ascending=False)
    for key, cols in (("achieved_tflops", ("fp64_flops", "fp32_flops")), ("achieved_gbps", ("dram_bytes",))):
        present = [c for c in cols if c in kernels]
        gaps = int(sum(kernels[c].isna().sum() for c in present))
        if not present or gaps:
            # A sum over kernels that lack the metric would understate it: report it missing instead.
            missing[key] = f"{'/'.join(cols)} missing for {gaps or len(kernels)} kernel(s) of this capture"
            totals[key] = None
        else:
            totals[key] = float(sum(kernels[c].sum() for c in present))
        if totals[key] is not None and not dur:
            missing[key] = missing.get("duration_us", "no kernel time to divide by")
    flops, dram = totals["achieved_tflops"], totals["achieved_gbps"]
    judged = dur is not None and len(top)
    return {
        "duration_us": dur,
        "achieved_tflops": flops / (dur * 1e-6) / 1e12 if flops is not None and dur else None,
        "achieved_gbps": dram / (dur * 1e-6) / 1e9 if dram is not None and dur else None,
        "rates_from": "ncu-measured DRAM bytes and FLOPs of the stage kernels over their summed time",
        "occupancy_pct": weighted("occupancy_pct", "achieved_occupancy_pct"),
        "occupancy_kind": "achieved, time-weighted", "sm_pct": weighted("sm_pct", "sm_pct"),
        # Which stage takes the most time is unknown while a stage kernel's time is.
        "bottleneck": str(top.iloc[0]["bottleneck"]) if judged else "n/a",
        "issues": [f"{r.stage}: {r.bottleneck}" for r in top.head(3).itertuples()],
        "insights": [f"{o['name']} (trigger {o['trigger']})" for o in ops[:3]],
        "missing": missing,
    }


def nsys_summary(trace: dict, analysis: dict) -> dict:
    it = analysis["iteration"]
    counters = "a trace records no counters (run --prof_type annotation)"
    share = 100 * it["busy_us"] / it["span_us"] if it["span_us"] else 0.0
    return {
        "duration_us": it["span_us"], "achieved_tflops": None, "achieved_gbps": None, "rates_from": None,
        "occupancy_pct": None, "occupancy_kind": None, "sm_pct": None,
        "bottleneck": f"GPU busy {share:.0f}% of the iteration" + ("" if share >= 70 else
                                                                   " (latency-bound: host orchestration)"),
        "issues": [f"[{f['severity']}] {f['rule']} in {f['stage']}: {f['evidence']}" for f in analysis["findings"][:5]],
        "insights": list(analysis["answers"]),
        "missing": {k: counters for k in ("achieved_tflops", "achieved_gbps", "occupancy_pct", "sm_pct")},
    }
