"""Spatial join, points x polygons: ``spatial_join`` and the registered plan versions."""
from __future__ import annotations

import numpy as np

from app.kernel.geometry import points_from_any, polygons_from_shapely
from app.kernel.join.plan import PREDICATES, JoinInputs, JoinV1, JoinV2  # noqa: F401  (registers versions)


def spatial_join(points, polygons, predicate: str = "within", device: str = "auto", version: str | None = None):
    """(point_index, polygon_index) int64 arrays, sorted by point then polygon.

    ``points``: (N, 2) floats or shapely Points; ``polygons``: shapely Polygons /
    MultiPolygons (holes allowed). ``within`` is strict interior like
    ``shapely.within``; ``intersects`` counts the boundary.
    """
    from app.errors import BadParameter
    from app.kernel.plan import get_plan_class
    from app.runtime.execute import run_once

    if predicate not in PREDICATES:
        raise BadParameter(f"unknown predicate {predicate!r}; use one of {', '.join(PREDICATES)}")
    inputs = JoinInputs(points_from_any(points), polygons_from_shapely(polygons), predicate)
    plan = get_plan_class("join", version)()
    pt, poly = run_once(plan, inputs, device)
    return np.asarray(pt, dtype=np.int64), np.asarray(poly, dtype=np.int64)
