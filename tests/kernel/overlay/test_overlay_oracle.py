"""Overlay areas equal shapely.intersection(a, b).area (rel. 1e-9 of the larger area) on both devices."""
import numpy as np
import pytest
import shapely

from app.kernel.overlay import overlay_areas
from app.kernel.overlay.oracle import compare, shapely_overlay
from app.kernel.overlay.plan import OverlayV1
from tests.conftest import DEVICES


VERSIONS = ["v1", "v2"]


def assert_matches_shapely(left, right, device, version=None):
    got = overlay_areas(left, right, device=device, version=version)
    exp = shapely_overlay(left, right)
    res = compare(got, exp, shapely.area(left), shapely.area(right))
    assert res["matches"], res
    return got


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout,seed", [("random", 0), ("random", 7), ("shifted", 1), ("self", 2), ("grid", 3)])
def test_layouts(device, layout, seed, version):
    plan = OverlayV1({"left": 1500, "right": 1200, "layout": layout, "seed": seed})
    inp = plan.make_inputs()
    left, right = inp.left.to_shapely(), inp.right.to_shapely()
    got = assert_matches_shapely(left, right, device, version)
    assert len(got[0]) > 500
    kinds = shapely.get_type_id(left)
    if layout != "grid":   # the generator's layers carry holes and MultiPolygons
        assert (kinds == 6).any() and (shapely.get_num_interior_rings(left[kinds == 3]) > 0).any()


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("device", DEVICES)
def test_shared_borders_holes_and_touching(device, version):
    # Adjacent squares (shared edges: zero area), a square against itself, a polygon
    # with a hole against the hole's exact outline and a square straddling it,
    # a MultiPolygon, and squares touching at a corner only.
    sq = shapely.box
    left = np.array([
        sq(0, 0, 2, 2),
        shapely.Polygon([(10, 0), (14, 0), (14, 4), (10, 4)], [[(11, 1), (11, 3), (13, 3), (13, 1)]]),
        shapely.MultiPolygon([sq(20, 0, 21, 1), sq(22, 0, 23, 1)]),
        sq(30, 0, 31, 1),
    ], dtype=object)
    right = np.array([
        sq(2, 0, 4, 2),                  # shares an edge with left[0]: zero area, not reported
        sq(0, 0, 2, 2),                  # identical to left[0]
        sq(1, 1, 3, 3),                  # overlaps left[0] by 1
        sq(11, 1, 13, 3),                # exactly the hole of left[1]: zero area
        sq(12, 2, 15, 5),                # straddles left[1]'s hole corner and its shell
        sq(20.5, 0, 22.5, 1),            # overlaps both parts of the MultiPolygon
        sq(31, 1, 32, 2),                # touches left[3] at one corner
    ], dtype=object)
    got = assert_matches_shapely(left, right, device, version)
    pairs = dict(zip(zip(got[0].tolist(), got[1].tolist()), got[2].tolist()))
    assert (0, 0) not in pairs and (1, 3) not in pairs and (3, 6) not in pairs
    assert pairs[(0, 1)] == pytest.approx(4.0) and pairs[(0, 2)] == pytest.approx(1.0)
    assert pairs[(2, 5)] == pytest.approx(1.0)


@pytest.mark.gpu
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("layout", ["random", "self", "grid"])
def test_gpu_and_cpu_stage_metadata_agree(layout, version):
    from app.runtime.device import select
    from app.runtime.execute import backend_for, xp_for
    from app.runtime.nvtx import Nvtx
    from app.runtime.recorder import Recorder

    from app.kernel.plan import get_plan_class

    plan = get_plan_class("overlay", version)({"left": 3000, "right": 3000, "layout": layout})
    inp = plan.make_inputs()
    rec = {}
    for device in ("cpu", "gpu"):
        backend, _ = backend_for(plan, select(device))
        out, rec[device] = Recorder(device, xp_for(device), Nvtx(False, "overlay")).run(plan, inp, backend)
    by = {d: {s["name"]: s for s in r.stages} for d, r in rec.items()}
    for stage, keys in {"segment_mbr_filter": ("polygon_pairs", "pairs_examined", "candidates", "grid_level",
                                               "bbox_tests"),
                        "exact_intersection_refine": ("proper", "touch", "collinear_overlap", "ambiguous_pairs",
                                                      "split_events")}.items():
        for k in keys:
            assert by["cpu"][stage]["meta"][k] == by["gpu"][stage]["meta"][k], (stage, k)
    assert by["cpu"]["area_reconstruction"]["rows_out"] == by["gpu"]["area_reconstruction"]["rows_out"]
