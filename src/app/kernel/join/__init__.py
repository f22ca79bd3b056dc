"""Spatial join, points x polygons: ``spatial_join``, ``JoinReplay`` (many batches of the same counts) and the
registered plan versions."""
from __future__ import annotations

import numpy as np

from app.kernel.geometry import points_from_any, polygons_from_shapely
from app.kernel.join.plan import (PREDICATES, JoinInputs, JoinV1, JoinV2, JoinV3, JoinV4,  # noqa: F401  (registers)
                                  JoinV5)
from app.kernel.join.replay import JoinReplay  # noqa: F401  (batches of the same counts, replayed as a CUDA graph)


def spatial_join(points, polygons, predicate: str = "within", device: str = "auto", version: str | None = None,
                 make_valid: bool = False):
    """(point_index, polygon_index) int32 arrays, sorted by point then polygon. int32 because the plan refuses
    2^31 points or vertices: half the bytes of int64 to write on the GPU and to copy back.

    ``points``: (N, 2) floats or shapely Points. A point that is None, empty, NaN
    or infinite keeps its index and matches nothing (as in shapely).
    ``polygons``: shapely Polygons / MultiPolygons (holes allowed). An invalid
    polygon is refused with its index -- its interior is undefined -- unless
    ``make_valid=True`` repairs it with ``shapely.make_valid`` first.
    ``within`` is strict interior like ``shapely.within``; ``intersects`` counts
    the boundary.
    """
    from app.errors import BadParameter
    from app.kernel.plan import get_plan_class
    from app.runtime.execute import run_once

    if predicate not in PREDICATES:
        raise BadParameter(f"unknown predicate {predicate!r}; use one of {', '.join(PREDICATES)}")
    xy, kept = points_from_any(points)
    inputs = JoinInputs(xy, polygons_from_shapely(polygons, make_valid=make_valid), predicate)
    plan = get_plan_class("join", version)()
    pt, poly = run_once(plan, inputs, device)
    pt = np.asarray(pt, dtype=np.int32)
    # Unusable points were left out of the run: map positions back to the caller's indices
    # (monotone, so the output stays sorted by point then polygon).
    return (kept[pt].astype(np.int32) if kept is not None else pt), np.asarray(poly, dtype=np.int32)
