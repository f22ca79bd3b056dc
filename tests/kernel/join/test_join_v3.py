"""join v3: the grid chosen on the device, candidate room kept from run to run, one read at the end."""
import math

import numpy as np
import pytest

from app.kernel import grid
from app.kernel.plan import get_plan_class


def test_the_grid_level_is_the_exact_floor_of_log2_even_just_below_a_power_of_two():
    # 1024 / (1 + 2^-52) lies just below 1024: its log2 rounds up to 10.0, the level must be 9.
    m = float(np.nextafter(1.0, 2.0))
    assert math.log2(1024 / m) == 10.0
    assert grid.grid_level((0, 0, 1024, 1024), m, m) == 9
    assert grid.grid_level((0, 0, 1024, 1024), 1.0, 1.0) == 10          # exactly 2^10
    assert grid.grid_level((0, 0, 1024, 1024), 1.0, 1.0, bias=-1) == 9
    assert grid.grid_level((0, 0, 1, 1), 2.0, 2.0) == 1                  # clamped below
    assert grid.grid_level((0, 0, 1, 1), 0.0, 0.0) == grid.MAX_LEVEL     # a cell is never smaller than 4^-11


def _run(plan, inputs, backend):
    import cupy as cp

    from app.runtime.nvtx import Nvtx
    from app.runtime.recorder import Recorder

    out, rec = Recorder("gpu", cp, Nvtx(False, "join")).run(plan, inputs, backend)
    return tuple(cp.asnumpy(a) for a in out), {s["name"]: s for s in rec.stages}


@pytest.mark.gpu
@pytest.mark.parametrize("world,mean,bias", [
    ((0.0, 0.0, 1024.0, 1024.0), float(np.nextafter(1.0, 2.0)), 0),    # just below a power of two
    ((0.0, 0.0, 1024.0, 1024.0), 1.0, 0), ((0.0, 0.0, 1024.0, 1024.0), 1.0, 1),
    ((-3.5, 2.25, 7.0, 2.5), 0.01, -1),                                # flat world: x sets the extent
    ((5.0, 5.0, 5.0, 5.0), 0.0, 0),                                    # a single point
    ((0.0, 0.0, 1e-300, 1e-300), 0.0, 0)])
def test_the_device_picks_the_hosts_grid(world, mean, bias):
    import cupy as cp

    from app.kernel.join.gpu import GRID, LEDGER_WORDS, JoinGPU

    plan = get_plan_class("join", "v3")({"points": 10, "polygons": 10})
    backend = JoinGPU(plan.tiling, "v3")
    backend.compile()
    g = 7
    summary = cp.asarray([*world, mean * g, mean * g, 0.0, 0.0])
    ledger = cp.zeros(LEDGER_WORDS, cp.uint64)
    backend.mod.fn["grid_params"]((1,), (32,), (summary, np.int64(g), np.int32(bias), np.int32(grid.MAX_LEVEL),
                                                ledger))
    words = cp.asnumpy(ledger[GRID])
    level = grid.grid_level(world, mean * g / g, mean * g / g, bias=bias)
    assert words[:4].view(np.float64).tolist() == list(grid.world_scale(world))
    assert words[4:].tolist() == [level, grid.BITS - level, 1 << 2 * level, (1 << 2 * level) + 1]
    # v3 and v4 choose the grid in point_cells_grid, as they count the points into its cells: the same words, and
    # output_sort's per-point counts zeroed (all N + 1 of them), the cell table counted from where it stood.
    zeroed = cp.zeros(LEDGER_WORDS, cp.uint64)
    table = (1 << 2 * level) + 1
    counts = cp.zeros(table + 5, cp.int32)
    n = 999
    point_counts = cp.full(n + 2, 7, cp.int32)
    pts = cp.asarray(np.column_stack([np.linspace(world[0], world[2], n), np.linspace(world[1], world[3], n)]))
    pcell = cp.zeros(n, cp.uint32)
    slot = cp.zeros(n, cp.int32)
    backend.mod.fn["point_cells_grid"]((4,), (256,), (pts, np.int64(n), summary, np.int64(g), np.int32(bias),
                                                      np.int32(grid.MAX_LEVEL), zeroed, pcell, slot, counts,
                                                      point_counts))
    assert cp.asnumpy(zeroed[GRID]).tolist() == words.tolist()
    assert not cp.asnumpy(point_counts[:n + 1]).any() and int(point_counts[n + 1]) == 7
    cells = cp.asnumpy(pcell)
    assert (cells < 1 << 2 * level).all()
    assert np.array_equal(cp.asnumpy(counts[1:table]), np.bincount(cells, minlength=table - 1))
    # With no points, one block still stores the grid.
    again = cp.zeros(LEDGER_WORDS, cp.uint64)
    backend.mod.fn["point_cells_grid"]((1,), (256,), (pts, np.int64(0), summary, np.int64(g), np.int32(bias),
                                                      np.int32(grid.MAX_LEVEL), again, pcell, slot, counts,
                                                      point_counts))
    assert cp.asnumpy(again[GRID]).tolist() == words.tolist()


@pytest.mark.gpu
@pytest.mark.parametrize("version", ["v3", "v4", "v5"])
def test_a_run_leaves_the_cell_table_zeroed_and_the_summary_ready_for_the_next(version):
    """v3 and v4 launch no init_run or memset on a warm run: the scatter of the run before zeroed the cell table
    and set the summary back to its identities. After every run both must be so."""
    import cupy as cp

    from app.kernel.join.gpu import JoinGPU
    from app.kernel.join.oracle import shapely_join

    plan = get_plan_class("join", version)({"points": 20_000, "polygons": 2_000})
    inputs = plan.make_inputs()
    backend = JoinGPU(plan.tiling, version)
    backend.compile()
    expected = shapely_join(inputs.points, inputs.polygons, "within")
    for _ in range(3):
        (pt, poly), _stages = _run(plan, inputs, backend)
        np.testing.assert_array_equal(pt, expected[0])
        np.testing.assert_array_equal(poly, expected[1])
        summary, counts = backend._ready
        assert not cp.asnumpy(counts).any()
        assert cp.asnumpy(summary).tolist() == [math.inf, math.inf, -math.inf, -math.inf, 0.0, 0.0, 0.0, 0.0]


@pytest.mark.gpu
@pytest.mark.parametrize("version", ["v3", "v4", "v5"])
def test_a_run_stopped_after_counting_leaves_the_next_run_exact(version):
    """A run that stops between counting the points into the cell table and the scatter that zeroes it (here the
    scan's launch is interrupted, as by Ctrl-C) leaves the table dirty: the next run must zero it again, not
    count on top of it. The next run's points differ, so a stale count would misplace them. v5 counts, scans and
    scatters in one launch: stopped before it, after the bounds changed the summary, the next run must set the
    summary again."""
    from app.kernel.join.gpu import JoinGPU
    from app.kernel.join.oracle import shapely_join

    plans = [get_plan_class("join", version)({"points": 20_000, "polygons": 2_000, "seed": s}) for s in (0, 1)]
    backend = JoinGPU(plans[0].tiling, version)
    backend.compile()
    first = plans[0].make_inputs()
    _run(plans[0], first, backend)             # warm: the next run's bounds trusts what this one left
    owner, name = (backend, "_launch_cooperative") if version == "v5" else (backend.mod, "inclusive_scan")
    launch = getattr(owner, name)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    setattr(owner, name, interrupted)
    with pytest.raises(KeyboardInterrupt):
        _run(plans[0], first, backend)
    setattr(owner, name, launch)
    assert backend._ready is None
    inputs = plans[1].make_inputs()
    expected = shapely_join(inputs.points, inputs.polygons, "within")
    (pt, poly), _stages = _run(plans[1], inputs, backend)
    np.testing.assert_array_equal(pt, expected[0])
    np.testing.assert_array_equal(poly, expected[1])


@pytest.mark.gpu
@pytest.mark.parametrize("version", ["v3", "v4", "v5"])
@pytest.mark.parametrize("predicate", ["within", "intersects"])
def test_candidates_past_the_room_grow_it_and_run_again_exactly(predicate, version):
    from app.kernel.join.gpu import JoinGPU
    from app.kernel.join.oracle import shapely_join

    plan = get_plan_class("join", version)({"points": 30_000, "polygons": 3_000, "layout": "clustered",
                                            "predicate": predicate})
    inputs = plan.make_inputs()
    backend = JoinGPU(plan.tiling, version)
    backend.compile()
    backend._room = 100                        # far too small: the first run must find out and grow
    expected = shapely_join(inputs.points, inputs.polygons, predicate)
    (pt, poly), stages = _run(plan, inputs, backend)
    np.testing.assert_array_equal(pt, expected[0])
    np.testing.assert_array_equal(poly, expected[1])
    c = stages["candidate_filter"]["meta"]["candidates"]
    assert c > 100 and "ran again" in stages["output_sort"]["meta"]["candidate_room_grown"]
    assert stages["candidate_filter"]["meta"]["candidate_room"] == backend._room >= c
    # The next run fits the grown room: no regrowth, same result, and its only host read is the result's size.
    (pt2, poly2), again = _run(plan, inputs, backend)
    np.testing.assert_array_equal(pt2, expected[0])
    np.testing.assert_array_equal(poly2, expected[1])
    assert "candidate_room_grown" not in again["output_sort"]["meta"]
    reads = {name: s["counters"]["allocation_size_reads"] for name, s in again.items()}
    assert reads == dict.fromkeys(reads, 0) | {"output_sort": 1}
    assert again["output_sort"]["counters"]["result_size_reads"] == 1
    assert again["candidate_filter"]["rows_out"] == c == again["predicate_refine"]["rows_in"]
    assert again["predicate_refine"]["rows_out"] == len(expected[0])


@pytest.mark.gpu
@pytest.mark.parametrize("per_warp", [1, 2, 4, 8, 16])
def test_v4_filter_finds_the_same_pairs_whatever_polygons_a_warp_takes(per_warp):
    """candidate_fill_K: a warp counts K polygons, reserves room for all of them with one atomic add, then writes
    each polygon's pairs at its own offset. 3,001 polygons leave the last warp part-empty; a room of 100 pairs
    makes the writes stop at the room's end and the run grow it and go again."""
    from app.kernel.join.gpu import JoinGPU
    from app.kernel.join.oracle import shapely_join

    plan = get_plan_class("join", "v4")({"points": 30_000, "polygons": 3_001, "layout": "clustered"})
    inputs = plan.make_inputs()
    backend = JoinGPU(plan.tiling, "v4")
    backend.compile()
    backend.polygons_per_warp = lambda g: per_warp
    expected = shapely_join(inputs.points, inputs.polygons, "within")
    (pt, poly), stages = _run(plan, inputs, backend)
    np.testing.assert_array_equal(pt, expected[0])
    np.testing.assert_array_equal(poly, expected[1])
    first = stages["candidate_filter"]["meta"]
    backend._room = 100
    (pt, poly), stages = _run(plan, inputs, backend)
    np.testing.assert_array_equal(pt, expected[0])
    np.testing.assert_array_equal(poly, expected[1])
    assert "ran again" in stages["output_sort"]["meta"]["candidate_room_grown"]
    again = stages["candidate_filter"]["meta"]
    assert (again["pairs_examined"], again["candidates"]) == (first["pairs_examined"], first["candidates"])


@pytest.mark.gpu
@pytest.mark.parametrize("per_warp", [1, 8])
def test_v4_warps_past_their_stash_write_by_a_second_scan_the_same_pairs(per_warp):
    """candidate_fill keeps a warp's candidates in shared memory (STASH_PAIRS of them) and writes them from
    there; a warp that finds more scans its cells again. Squares over thousands of points among small ones
    make both kinds of warp in one launch, and both must give shapely's pairs, in a room that fits and in one
    that overflows."""
    import shapely

    from app.kernel.geometry import polygons_from_shapely
    from app.kernel.join.gpu import STASH_PAIRS, JoinGPU
    from app.kernel.join.oracle import shapely_join
    from app.kernel.join.plan import JoinInputs

    rng = np.random.default_rng(7)
    points = rng.random((40_000, 2))
    small = [shapely.box(x, y, x + 0.01, y + 0.01) for x, y in rng.random((600, 2)) * 0.99]
    big = [shapely.box(0.1 * i, 0.0, 0.1 * i + 0.08, 0.5) for i in range(8)]     # ~1,600 points each
    polygons = polygons_from_shapely(small[:300] + big + small[300:])
    inputs = JoinInputs(points, polygons, "within")
    expected = shapely_join(points, polygons, "within")
    counts = np.bincount(expected[1], minlength=polygons.n_geoms)
    assert counts.max() > STASH_PAIRS and (counts <= STASH_PAIRS // 16).sum() > 500     # both kinds of warp
    plan = get_plan_class("join", "v4")({"points": len(points), "polygons": polygons.n_geoms})
    backend = JoinGPU(plan.tiling, "v4")
    backend.compile()
    backend.polygons_per_warp = lambda g: per_warp
    for room in (None, 1_000):                 # None: the first run's room (two pairs a point) fits
        backend._room = room
        (pt, poly), stages = _run(plan, inputs, backend)
        np.testing.assert_array_equal(pt, expected[0])
        np.testing.assert_array_equal(poly, expected[1])
        assert ("candidate_room_grown" in stages["output_sort"]["meta"]) is (room is not None)


def test_candidate_fills_stash_is_the_size_the_host_gives_it():
    """The kernel's per-warp stash is a #define; the host sizes the launch's shared memory from its copy."""
    import re
    from pathlib import Path

    from app.kernel.join import gpu

    source = Path(gpu.__file__).with_name("join.cu").read_text()
    assert int(re.search(r"#define STASH_PAIRS (\d+)", source).group(1)) == gpu.STASH_PAIRS


@pytest.mark.gpu
def test_the_filters_artifacts_count_its_stash_in_shared_memory_and_occupancy():
    import json

    from app.kernel.join.gpu import STASH_PAIRS, JoinGPU

    plan = get_plan_class("join", "v4")({})
    backend = JoinGPU(plan.tiling, "v4")
    backend.compile()
    block = plan.tiling["candidate_filter"]["block"]
    kernels = json.loads(backend.artifacts()["candidate_filter"]["resources.json"])["kernels"]
    for k in (1, 2, 4, 8, 16):
        fill = kernels[f"candidate_fill_{k}"]
        assert fill["dynamic_shared_bytes"] == block // 32 * STASH_PAIRS * 8
        assert 0 < fill["theoretical_occupancy_pct"] <= 100
    assert kernels["candidate_count"]["dynamic_shared_bytes"] == 0


def test_v4_gives_a_warp_more_polygons_only_where_every_sm_stays_busy():
    from app.kernel.join.gpu import MAX_POLYGONS_PER_WARP, POLYGONS_PER_WARP_FROM, JoinGPU

    backend = JoinGPU.__new__(JoinGPU)      # the choice needs only the SM count: no GPU
    backend.sm_count = 132
    per_sm = POLYGONS_PER_WARP_FROM * 132
    assert [backend.polygons_per_warp(g) for g in (1, 10_000, 2 * per_sm - 1, 2 * per_sm, 4 * per_sm, 100_000,
                                                   10**7)] == [1, 1, 1, 2, 4, 8, MAX_POLYGONS_PER_WARP]


@pytest.mark.gpu
@pytest.mark.parametrize("gather_from", [0, 10**12])
def test_v4_bucketed_coordinates_are_the_same_scattered_or_gathered(gather_from, monkeypatch):
    """From GATHER_XY_FROM points v4 scatters the indices and gathers the coordinates (two launches), below it
    scatters both (one): the oracle tests run below it, so both paths are forced here."""
    from app.kernel.join import gpu
    from app.kernel.join.oracle import shapely_join

    monkeypatch.setattr(gpu, "GATHER_XY_FROM", gather_from)
    plan = get_plan_class("join", "v4")({"points": 20_000, "polygons": 2_000, "predicate": "intersects"})
    inputs = plan.make_inputs()
    backend = gpu.JoinGPU(plan.tiling, "v4")
    backend.compile()
    (pt, poly), _ = _run(plan, inputs, backend)
    expected = shapely_join(inputs.points, inputs.polygons, "intersects")
    np.testing.assert_array_equal(pt, expected[0])
    np.testing.assert_array_equal(poly, expected[1])


@pytest.mark.gpu
def test_v5_lays_out_large_point_sets_as_v4_does():
    """From GATHER_XY_FROM points v5's cooperative morton_sort scatters the indices, waits for the grid, then
    gathers the coordinates (v4's two launches): the same bucketed order and coordinates as v4, and the join
    exact, with more points than its grid has threads (each thread strides over several)."""
    import cupy as cp

    from app.kernel.join.gpu import GATHER_XY_FROM, JoinGPU
    from app.kernel.join.oracle import shapely_join

    layouts = {}
    for version in ("v4", "v5"):
        plan = get_plan_class("join", version)({"points": GATHER_XY_FROM + 75_000, "polygons": 5_000})
        inputs = plan.make_inputs()
        backend = JoinGPU(plan.tiling, version)
        backend.compile()
        (pt, poly), _ = _run(plan, inputs, backend)
        ws = backend.mod.ws
        n = len(inputs.points)
        sorted_pt = cp.asnumpy(ws.empty("sorted_pt", n, cp.int32))
        layouts[version] = (pt, poly, sorted_pt, cp.asnumpy(ws.empty("sorted_xy", (n, 2), cp.float64)),
                            cp.asnumpy(ws.empty("pcell", n, cp.uint32))[sorted_pt])
    expected = shapely_join(inputs.points, inputs.polygons, "within")
    np.testing.assert_array_equal(layouts["v5"][0], expected[0])
    np.testing.assert_array_equal(layouts["v5"][1], expected[1])
    sorted_pt, sorted_xy, cells = layouts["v5"][2:]
    np.testing.assert_array_equal(sorted_xy, inputs.points[sorted_pt])
    assert np.array_equal(np.sort(sorted_pt), np.arange(len(inputs.points)))
    # Each cell's points in one run, the runs in cell order, as v4's (the order within a run is the atomics').
    assert (np.diff(cells.astype(np.int64)) >= 0).all()
    np.testing.assert_array_equal(cells, layouts["v4"][4])
