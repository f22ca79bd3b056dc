"""shapely's answer for the overlay: the oracle of tests and verification, never the kernel.

The tolerance (``RULE``) is per pair, from the pair's two polygons: an intersection's area
cannot exceed the smaller polygon's, so ``rel`` of that area, with an absolute floor of
FLOOR_ULPS ulps of the pair's largest |coordinate| times the smaller polygon's perimeter.
The floor is what rounding alone may cost: each intersection point is rounded to within a
few ulps of the coordinates (the kernels' split parameters are within a few ulps of the
exact ones, and the point e0 + t (e1 - e0) is rounded once more), and moving a vertex of
the intersection's boundary by d changes its area by at most d times the boundary next to
it. A pair only one side reports is a mismatch when its area is above that floor: a
dropped pair of 0.25 m^2 beside a 40 km square is caught, where a tolerance of 1e-9 of the
larger polygon's area (1.6 m^2) let it pass.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from app.kernel.geometry import PolygonBuffers
from app.kernel.plan import columns_problem

REL = 1e-9
FLOOR_ULPS = 16


def rule_text(rel: float = REL, floor: bool = True) -> str:
    """The tolerance in words, as verification records and reports state it."""
    r = f"{rel:.0e}".replace("e-0", "e-")
    if not floor:      # callers that give areas only (no perimeters or coordinates)
        return (f"areas within {r} of the smaller polygon's area (no absolute floor: perimeters and coordinates "
                f"not given); a pair only one side reports is a mismatch above that")
    return (f"areas within {r} of the smaller polygon's area, and never closer than {FLOOR_ULPS} ulps of the pair's "
            f"largest |coordinate| times the smaller polygon's perimeter (rounding's floor); a pair only one side "
            f"reports is a mismatch when its area is above that floor")


RULE = rule_text()


@dataclass(frozen=True)
class LayerMeasures:
    """Per polygon of a layer: its area, perimeter and largest |coordinate| (what the tolerance is made of)."""
    area: np.ndarray
    perimeter: np.ndarray
    max_abs: np.ndarray


def layer_measures(layer) -> LayerMeasures:
    """The measures of a layer given as PolygonBuffers or shapely (Multi)Polygons."""
    import shapely

    geoms = layer.to_shapely() if isinstance(layer, PolygonBuffers) else np.asarray(layer, dtype=object)
    coords, owner = shapely.get_coordinates(geoms, return_index=True)
    max_abs = np.zeros(len(geoms))
    np.maximum.at(max_abs, owner, np.abs(coords).max(axis=1) if len(coords) else np.zeros(0))
    return LayerMeasures(shapely.area(geoms), shapely.length(geoms), max_abs)


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


def pair_tolerances(a, b, left, right, rel: float = REL):
    """(tolerance of a pair both sides report, tolerance of a pair only one side reports) for pairs (a, b), from
    LayerMeasures (or, for callers that give areas only, arrays of areas: no floor)."""
    a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
    if not isinstance(left, LayerMeasures) or not isinstance(right, LayerMeasures):
        la = left.area if isinstance(left, LayerMeasures) else np.asarray(left, dtype=np.float64)
        rb = right.area if isinstance(right, LayerMeasures) else np.asarray(right, dtype=np.float64)
        tol = rel * np.minimum(la[a], rb[b])
        return tol, tol
    floor = FLOOR_ULPS * np.spacing(np.maximum(left.max_abs[a], right.max_abs[b])) * \
        np.minimum(left.perimeter[a], right.perimeter[b])
    return np.maximum(rel * np.minimum(left.area[a], right.area[b]), floor), floor


def compare(got, exp, left, right, rel: float = REL) -> dict:
    """Pairs must match and areas agree within the pair's tolerance (``RULE``). ``left`` and ``right`` are
    LayerMeasures (layer_measures), or arrays of the polygons' areas (then no floor: rule_text(floor=False)). The
    record says the rule it applied (``tolerance``)."""
    full = isinstance(left, LayerMeasures) and isinstance(right, LayerMeasures)
    n_left = len(left.area if isinstance(left, LayerMeasures) else left)
    n_right = len(right.area if isinstance(right, LayerMeasures) else right)
    rule = rule_text(rel, full)
    shape = _shape_problem(got, n_left, n_right)
    if shape:
        first = np.asarray(got[0]) if len(got) else np.zeros(0)
        return {"matches": False, "mismatched_pairs": None, "worst": [], "problem": shape,
                "pairs": len(first) if first.ndim else 0, "expected_pairs": int(len(exp[0])), "tolerance": rule}
    gk = dict(zip(zip(np.asarray(got[0]).tolist(), np.asarray(got[1]).tolist()), np.asarray(got[2]).tolist()))
    ek = dict(zip(zip(np.asarray(exp[0]).tolist(), np.asarray(exp[1]).tolist()), np.asarray(exp[2]).tolist()))
    keys = sorted(gk.keys() | ek.keys())
    ka = np.array([k[0] for k in keys], dtype=np.int64)
    kb = np.array([k[1] for k in keys], dtype=np.int64)
    both_tol, one_tol = pair_tolerances(ka, kb, left, right, rel)
    bad = []
    for key, t_both, t_one in zip(keys, both_tol.tolist(), one_tol.tolist()):
        g, e = gk.get(key, 0.0), ek.get(key, 0.0)
        tol = t_both if (key in gk and key in ek) else t_one
        if abs(g - e) > tol:
            bad.append((key, g, e))
    bad.sort(key=lambda r: -abs(r[1] - r[2]))
    return {"matches": not bad, "mismatched_pairs": len(bad), "worst": bad[:5],
            "pairs": len(gk), "expected_pairs": len(ek), "tolerance": rule}


def _shape_problem(got, n_left: int, n_right: int) -> str | None:
    """What makes ``got`` no valid answer before any area is compared: ragged columns, indices out of
    range, a pair reported twice, or rows not sorted by (a, b) as the output contract says; before those, not three
    1-D columns (a, b: integers; area: numbers)."""
    problem, cols = columns_problem(got, {"a": "iu", "b": "iu", "area": "iuf"})
    if problem:
        return problem
    a, b, area = cols
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
