"""The join equals shapely.STRtree.query on both devices, boundary cases included."""
import numpy as np
import pytest
import shapely

from app.kernel.join import spatial_join
from app.kernel.join.oracle import shapely_join
from app.kernel.join.plan import JoinV1
from tests.conftest import DEVICES


VERSIONS = ["v1", "v2", "v3", "v4", "v5"]


def assert_same_as_shapely(points, polygons, predicate, device, version=None):
    got = spatial_join(points, polygons, predicate=predicate, device=device, version=version)
    exp = shapely_join(np.asarray(points, dtype=float), np.asarray(polygons, dtype=object), predicate)
    np.testing.assert_array_equal(got[0], exp[0])
    np.testing.assert_array_equal(got[1], exp[1])
    return got


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("predicate", ["within", "intersects"])
@pytest.mark.parametrize("layout,seed", [("uniform", 0), ("uniform", 3), ("clustered", 1), ("clustered", 5)])
def test_random_layers(device, predicate, layout, seed, version):
    plan = JoinV1({"points": 20_000, "polygons": 2_000, "layout": layout, "seed": seed, "predicate": predicate})
    inp = plan.make_inputs()
    got = assert_same_as_shapely(inp.points, inp.polygons.to_shapely(), predicate, device, version)
    assert len(got[0]) > 1000   # the layout really produces hits


def boundary_points(polys: np.ndarray, rng) -> np.ndarray:
    """Vertices, exact edge points of axis-aligned edges, edge midpoints (near edges), hole interiors."""
    coords = shapely.get_coordinates(shapely.get_rings(shapely.get_parts(polys)))
    a, b = coords[:-1], coords[1:]
    mids = (a + b) / 2                          # rounding puts these on, left or right of the edge
    near = mids + rng.integers(-1, 2, mids.shape) * np.spacing(mids)
    return np.concatenate([coords, mids, near])


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("vertices", [9, 45])     # 45: shells longer than the 32 edges the GPU's test takes at once
def test_points_on_vertices_edges_and_near_edges(device, version, vertices):
    rng = np.random.default_rng(11)
    plan = JoinV1({"points": 0, "polygons": 300, "vertices": vertices, "seed": 2})
    polys = plan.make_inputs().polygons.to_shapely()
    pts = boundary_points(polys, rng)
    within = set(zip(*(a.tolist() for a in assert_same_as_shapely(pts, polys, "within", device, version))))
    inter = set(zip(*(a.tolist() for a in assert_same_as_shapely(pts, polys, "intersects", device, version))))
    # Every vertex lies on its polygon's boundary: intersects, never within.
    n_vertices = len(shapely.get_coordinates(shapely.get_rings(shapely.get_parts(polys))))
    assert within < inter
    assert sum(p < n_vertices for p, _ in inter - within) >= n_vertices


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("predicate", ["within", "intersects"])
def test_grid_squares_with_holes_and_multipolygons(device, predicate, version):
    # Axis-aligned squares sharing edges: points on shared edges and corners belong to
    # several polygons' boundaries; holes and MultiPolygon parts are exercised too.
    squares = [shapely.box(x, y, x + 1, y + 1) for x in range(6) for y in range(6)]
    holed = shapely.Polygon([(10, 0), (14, 0), (14, 4), (10, 4)], [[(11, 1), (11, 3), (13, 3), (13, 1)]])
    multi = shapely.MultiPolygon([shapely.box(20, 0, 21, 1), shapely.box(22, 0, 23, 1)])
    polys = np.array(squares + [holed, multi], dtype=object)
    g = np.arange(0, 24.01, 0.5)
    xx, yy = np.meshgrid(g, np.arange(-0.5, 6.51, 0.25))
    pts = np.c_[xx.ravel(), yy.ravel()]
    got = assert_same_as_shapely(pts, polys, predicate, device, version)
    pairs = set(zip(got[0].tolist(), got[1].tolist()))
    hole_center = int(np.flatnonzero((pts[:, 0] == 12) & (pts[:, 1] == 2))[0])
    assert (hole_center, 36) not in pairs      # inside the hole is outside the polygon
    corner = int(np.flatnonzero((pts[:, 0] == 1) & (pts[:, 1] == 1))[0])
    assert ((corner, 0) in pairs) == (predicate == "intersects")


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("device", DEVICES)
def test_the_result_columns_are_int32_from_the_plan_and_the_api(device, version):
    """Indices stay under 2^31 (the plan refuses more points or vertices), so the result is two int32 columns:
    half the bytes of int64 to write and to copy back. The plan's own output is checked, not only the API's."""
    from app.kernel.plan import get_plan_class
    from app.runtime.execute import run_once

    plan = get_plan_class("join", version)({"points": 2_000, "polygons": 200})
    inp = plan.make_inputs()
    pt, poly = run_once(plan, inp, device)
    assert pt.dtype == poly.dtype == np.int32 and len(pt) > 0
    assert plan.verify(inp, (pt, poly))["matches"]
    # A point shapely cannot use (NaN) is left out of the run: its index mapping keeps the dtype.
    got = spatial_join(np.array([[np.nan, 0.0], [0.5, 0.5]]), [shapely.box(0, 0, 1, 1)], device=device, version=version)
    assert got[0].dtype == got[1].dtype == np.int32 and got[0].tolist() == [1] and got[1].tolist() == [0]


@pytest.mark.parametrize("device", DEVICES)
def test_empty_inputs(device):
    polys = np.array([shapely.box(0, 0, 1, 1)], dtype=object)
    got = spatial_join(np.empty((0, 2)), polys, device=device)
    assert len(got[0]) == len(got[1]) == 0
    got = spatial_join(np.array([[5.0, 5.0]]), polys, device=device)   # no candidate at all
    assert len(got[0]) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("layout", ["uniform", "clustered"])
def test_gpu_and_cpu_stage_metadata_agree(layout, version):
    """Same quantisation and filter on both devices: identical rows and counters per stage."""
    from app.runtime.device import select
    from app.runtime.execute import backend_for, xp_for
    from app.runtime.nvtx import Nvtx
    from app.runtime.recorder import Recorder

    from app.kernel.plan import get_plan_class

    plan = get_plan_class("join", version)({"points": 50_000, "polygons": 5_000, "layout": layout})
    inp = plan.make_inputs()
    records = {}
    for device in ("cpu", "gpu"):
        sel = select(device)
        backend, _ = backend_for(plan, sel)
        _, rec = Recorder(device, xp_for(device), Nvtx(False, "join")).run(plan, inp, backend)
        records[device] = rec
    for c, g in zip(records["cpu"].stages, records["gpu"].stages):
        assert (c["rows_in"], c["rows_out"]) == (g["rows_in"], g["rows_out"]), c["name"]
        for key in ("pairs_examined", "candidates", "grid_level", "grid_cells", "exact_orientations",
                    "edge_tests", "orientation_tests", "boundary_pairs", "grid_entries"):
            assert c["meta"].get(key) == g["meta"].get(key), (c["name"], key)
