"""Spread of repeated measurements (truth rule 6)."""
from __future__ import annotations

import statistics

STABLE_REL_STDEV = 0.02


def spread(values: list[float]) -> dict:
    vals = [float(v) for v in values]
    if not vals:
        return {"runs": 0}
    med = statistics.median(vals)
    sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
    rel = sd / med if med > 0 else 0.0
    return {
        "runs": len(vals), "median": med, "min": min(vals), "max": max(vals),
        "mean": statistics.fmean(vals), "stdev": sd, "rel_stdev": rel,
        # One run has no spread to judge: not called stable.
        "stable": len(vals) > 1 and rel <= STABLE_REL_STDEV,
        # The raw timed-run samples, so `compare` can judge a change against them.
        "samples": vals,
    }
