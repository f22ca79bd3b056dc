"""shapely's answer for the join: the oracle of tests and verification, never the kernel."""
from __future__ import annotations

import numpy as np

from app.kernel.geometry import PolygonBuffers


def shapely_join(points: np.ndarray, polygons: PolygonBuffers | np.ndarray, predicate: str):
    import shapely

    geoms = polygons.to_shapely() if isinstance(polygons, PolygonBuffers) else polygons
    tree = shapely.STRtree(geoms)
    pt, poly = tree.query(shapely.points(points), predicate=predicate)
    order = np.lexsort((poly, pt))
    return pt[order].astype(np.int64), poly[order].astype(np.int64)
