"""shapely's answer for the overlay: the oracle of tests and verification, never the kernel."""
from __future__ import annotations

import numpy as np

from app.kernel.geometry import PolygonBuffers


def shapely_overlay(left, right):
    """(a, b, area) for every pair with a positive intersection area, sorted by (a, b)."""
    import shapely

    la = left.to_shapely() if isinstance(left, PolygonBuffers) else np.asarray(left, dtype=object)
    rb = right.to_shapely() if isinstance(right, PolygonBuffers) else np.asarray(right, dtype=object)
    a, b = shapely.STRtree(rb).query(la, predicate="intersects")
    area = shapely.area(shapely.intersection(la[a], rb[b]))
    keep = area > 0
    order = np.lexsort((b[keep], a[keep]))
    return a[keep][order].astype(np.int64), b[keep][order].astype(np.int64), area[keep][order]


def compare(got, exp, left_areas, right_areas, rel: float = 1e-9) -> dict:
    """Pairs must match and areas agree within ``rel`` of the larger polygon's area.
    A pair only one side reports is forgiven when its area is below that tolerance."""
    scale = lambda a, b: np.maximum(left_areas[a], right_areas[b])  # noqa: E731
    shape = _shape_problem(got, len(left_areas), len(right_areas))
    if shape:
        return {"matches": False, "mismatched_pairs": None, "worst": [], "problem": shape,
                "pairs": int(len(got[0])), "expected_pairs": int(len(exp[0]))}
    gk = dict(zip(zip(got[0].tolist(), got[1].tolist()), got[2].tolist()))
    ek = dict(zip(zip(exp[0].tolist(), exp[1].tolist()), exp[2].tolist()))
    bad = []
    for key in gk.keys() | ek.keys():
        g, e = gk.get(key, 0.0), ek.get(key, 0.0)
        tol = rel * scale(np.int64(key[0]), np.int64(key[1]))
        if abs(g - e) > tol:
            bad.append((key, g, e))
    bad.sort(key=lambda r: -abs(r[1] - r[2]))
    return {"matches": not bad, "mismatched_pairs": len(bad), "worst": bad[:5],
            "pairs": len(gk), "expected_pairs": len(ek)}


def _shape_problem(got, n_left: int, n_right: int) -> str | None:
    """What makes ``got`` no valid answer before any area is compared: ragged columns, indices out of
    range, a pair reported twice, or rows not sorted by (a, b) as the output contract says."""
    a, b, area = (np.asarray(x) for x in got)
    if not (len(a) == len(b) == len(area)):
        return f"columns of different lengths ({len(a)}, {len(b)}, {len(area)})"
    if len(a) == 0:
        return None
    if a.min() < 0 or a.max() >= n_left or b.min() < 0 or b.max() >= n_right:
        return "a polygon index out of range"
    if not np.isfinite(area).all():
        return "a non-finite area"
    key = a.astype(np.int64) * n_right + b.astype(np.int64)
    if (np.diff(key) == 0).any():
        return "a pair reported twice"
    if (np.diff(key) < 0).any():
        return "rows not sorted by (a, b)"
    return None
