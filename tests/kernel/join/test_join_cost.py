"""The join's cost model against what ncu measured in this project's own capture (tests/fixtures/ncu, join v2 at
20k points x 2k polygons on an H200): the model's FLOPs are the operations the kernel runs, not an estimate."""
import numpy as np
import pytest

from app.kernel.pip import classify, edge_table
from app.kernel.plan import get_plan_class
from app.runtime.nvtx import Nvtx
from app.runtime.profiling.parsers.ncu_csv import parse_raw
from app.runtime.recorder import Recorder
from tests.conftest import fixture_text


def _cpu_stages(params: dict) -> dict:
    from app.runtime.execute import xp_for

    plan = get_plan_class("join", "v2")(params)
    inputs = plan.make_inputs()
    _, rec = Recorder("cpu", xp_for("cpu"), Nvtx(False, "join")).run(plan, inputs, plan.backend("cpu"))
    return {s["name"]: plan.cost(s["name"], s["rows_in"], s["rows_out"], s["meta"], inputs) for s in rec.stages}


def test_refine_flops_are_the_ones_ncu_counted():
    raw, _ = parse_raw(fixture_text("ncu/join.full.raw.csv"))
    refine = raw[raw["kernel"] == "refine"]
    assert len(refine) == 1
    measured = float(refine["dadd"].iloc[0] + refine["dmul"].iloc[0] + 2 * refine["dfma"].iloc[0])
    model = _cpu_stages({"points": 20_000, "polygons": 2_000})["predicate_refine"]
    # The capture's points and polygons are the default seed's, so the CPU path tests the same edges.
    # Exactly: 6 DADD and 3 DMUL an orientation test's filter, no exact fallback at these sizes. Counting every
    # edge scanned, as the model did, gave 7.4x this.
    assert measured > 0 and model.flops == measured


def test_orientation_tests_are_the_edges_whose_height_range_holds_the_point():
    import shapely

    from app.kernel.geometry import polygons_from_shapely

    rng = np.random.default_rng(5)
    geoms = [shapely.box(0, 0, 4, 4), shapely.Polygon([(0, 0), (6, 0), (3, 5)], [[(2, 1), (4, 1), (3, 2)]])]
    polys = polygons_from_shapely(geoms)
    pts = np.concatenate([rng.uniform(-1, 7, (300, 2)), [[1, 0], [2, 4], [3, 1], [5, 5]]])   # some level with ends
    pt, geom = (a.ravel() for a in np.meshgrid(np.arange(len(pts)), np.arange(len(geoms)), indexing="ij"))
    edges = edge_table(polys.coords, polys.ring_offsets, polys.geom_ring_offsets)
    *_, tests = classify(pts, edges, pt, geom)
    y = pts[pt, 1]
    expected = 0
    for g in range(len(geoms)):
        e0, e1 = edges.geom_offsets[g], edges.geom_offsets[g + 1]
        lo, hi = edges.ylo[e0:e1], edges.yhi[e0:e1]
        yy = y[geom == g][:, None]
        expected += int(((lo <= yy) & (yy <= hi)).sum())
    assert tests == expected and 0 < tests < len(pt) * 5


def test_morton_sort_counts_the_bucketed_coordinates_v4_and_v5_write():
    """v4 and v5 write the points' coordinates again in bucketed order (16 B a point), which their filter reads:
    the stage's bytes count that write where its metadata says it ran (the GPU's), not on v1's CPU stages."""
    from app.kernel.join.plan import JoinInputs

    plan = get_plan_class("join", "v5")({"points": 1_000, "polygons": 100})
    inputs = plan.make_inputs()
    assert isinstance(inputs, JoinInputs)
    meta = {"grid_cells": 256}
    plain = plan.cost("morton_sort", 1_000, 1_000, meta, inputs).bytes
    bucketed = plan.cost("morton_sort", 1_000, 1_000, meta | {"bucketed_coordinates": 1_000}, inputs).bytes
    assert plain == 1_000 * 20 + 256 * 8 and bucketed - plain == 16 * 1_000


@pytest.mark.gpu
@pytest.mark.parametrize("version,bucketed", [("v3", False), ("v4", True), ("v5", True)])
def test_the_gpu_morton_sort_says_whether_it_wrote_bucketed_coordinates(version, bucketed):
    import cupy as cp

    plan = get_plan_class("join", version)({"points": 5_000, "polygons": 500})
    inputs = plan.make_inputs()
    from app.runtime.device import select
    from app.runtime.execute import backend_for

    backend, _ = backend_for(plan, select("gpu"))
    _, rec = Recorder("gpu", cp, Nvtx(False, "join")).run(plan, inputs, backend)
    meta = {s["name"]: s["meta"] for s in rec.stages}["morton_sort"]
    assert meta.get("bucketed_coordinates") == (5_000 if bucketed else None)
