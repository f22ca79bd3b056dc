"""Polygon overlay, layer A x layer B: ``overlay_areas`` and the registered plan versions."""
from __future__ import annotations

import numpy as np

from app.kernel.geometry import polygons_from_shapely
from app.kernel.overlay.plan import (OverlayInputs, OverlayV1, OverlayV2, OverlayV3,  # noqa: F401  (registers)
                                     OverlayV4)


def overlay_areas(left, right, device: str = "auto", version: str | None = None, make_valid: bool = False):
    """(a_index, b_index, area) for every pair whose intersection has positive area, sorted by (a, b): int32
    indices (as the join's) and float64 areas.

    ``left`` and ``right`` are shapely Polygons/MultiPolygons (holes allowed); the
    areas equal ``shapely.intersection(a, b).area`` within 1e-9 of the smaller
    polygon's area, or rounding's floor where that is larger (oracle.RULE), also
    where the two layers' boundaries nearly coincide. Coordinates must be 0 or
    between 1e-100 and 1e100 in magnitude (geometry.COORD_RANGE; others are refused
    with a ValueError).
    An invalid polygon (self-intersecting ring, overlapping parts, ...) has no
    defined area and is refused with its index, unless ``make_valid=True``
    repairs both layers with ``shapely.make_valid`` first.
    """
    from app.kernel.plan import get_plan_class
    from app.runtime.execute import run_once

    inputs = OverlayInputs(polygons_from_shapely(left, make_valid=make_valid),
                           polygons_from_shapely(right, make_valid=make_valid))
    plan = get_plan_class("overlay", version)()
    a, b, area = run_once(plan, inputs, device)
    return np.asarray(a, dtype=np.int32), np.asarray(b, dtype=np.int32), np.asarray(area, dtype=np.float64)
