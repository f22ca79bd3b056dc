"""join_extent, the bounds stage's launch: every polygon's box, and the summary the grid is chosen from (world box,
summed and largest box sizes), against numpy, for polygon counts that leave lanes, warps and the fixed grid's
stride partly filled."""
import numpy as np
import pytest

from app.kernel.plan import get_plan_class


@pytest.mark.gpu
@pytest.mark.parametrize("version", ["v1", "v4"])
@pytest.mark.parametrize("polygons,vertices", [(1, 3), (7, 200), (2_001, 16), (20_011, 5)])
def test_polygon_boxes_and_summary_are_numpys(polygons, vertices, version):
    """The threads a polygon go from 8 (1 to 2,001 polygons on an H100 or H200: 132 SMs, 4 blocks of 256 an SM hold
    16,896 polygons at 8) to 4 (20,011); 200 vertices are many loads a lane, 3 fewer than a group's lanes."""
    import cupy as cp

    from app.kernel.join.gpu import JoinGPU
    from app.runtime.nvtx import Nvtx
    from app.runtime.recorder import Recorder

    plan = get_plan_class("join", version)({"points": 3_000, "polygons": polygons, "vertices": vertices})
    inputs = plan.make_inputs()
    backend = JoinGPU(plan.tiling, version)
    backend.compile()
    state = plan.run_stages({"inputs": inputs}, plan.stages[:2], backend,
                            Recorder("gpu", cp, Nvtx(False, "join"), per_stage=False))
    assert [s.name for s in plan.stages[:2]] == ["owned_buffer_build", "bounds"]
    bbox, summary = cp.asnumpy(state["bbox"]), cp.asnumpy(state["summary"])
    p = inputs.polygons
    starts = p.ring_offsets[p.geom_ring_offsets[:-1]]
    ends = p.ring_offsets[p.geom_ring_offsets[1:]]
    xy = p.coords.reshape(-1, 2)
    expected = np.array([[*xy[a:b].min(axis=0), *xy[a:b].max(axis=0)] for a, b in zip(starts, ends)])
    assert len(expected) == polygons and (ends - starts).max() >= (vertices + 1)
    np.testing.assert_array_equal(bbox, expected)
    w, h = expected[:, 2] - expected[:, 0], expected[:, 3] - expected[:, 1]
    pts = inputs.points
    world = [min(expected[:, 0].min(), pts[:, 0].min()), min(expected[:, 1].min(), pts[:, 1].min()),
             max(expected[:, 2].max(), pts[:, 0].max()), max(expected[:, 3].max(), pts[:, 1].max())]
    assert summary[:4].tolist() == world
    np.testing.assert_allclose(summary[4:6], [w.sum(), h.sum()], rtol=1e-12)    # sums: in the atomics' order
    assert summary[6:].tolist() == [w.max(), h.max()]
    lanes = backend.extent_lanes(polygons, plan.tiling["bounds"]["block"])
    assert lanes == (4 if polygons == 20_011 else 8) or backend.sm_count != 132
