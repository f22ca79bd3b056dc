"""The join's stages on the GPU: CuPy plus the RawKernels of join.cu.

Nothing returns to the host inside the pipeline except three allocation-size
reads (world box for the grid level in bounds, candidate total in the filter,
hit total at the end of output_sort), each made through ``st.read_size`` so it
is counted in the stage's metadata. CuPy's sorts
(Thrust) are not used, so no library call can synchronise where the counters
cannot see it; the two sorts here are counting sorts (points by grid cell,
hits by point) built from our kernels and scan.cu.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from app.kernel import grid
from app.kernel.gpu_build import GpuBackend
from app.kernel.robust import CCW_ERRBOUND_A

SOURCE = Path(__file__).with_name("join.cu")
STAGE_KERNELS = {
    "bounds": ("init_summary", "polygon_bounds", "point_extent"),
    "morton_sort": ("point_cells", "point_scatter"),
    "candidate_filter": ("candidate_count", "candidate_emit", "poly_cell_count", "poly_cell_fill",
                         "point_candidates"),
    "predicate_refine": ("refine",),
    "output_sort": ("pair_count", "pair_scatter", "segment_sort"),
}
# CuPy library calls each stage also makes (kernels with no source of ours to show).
LIBRARY_CALLS = {
    "owned_buffer_build": "cudaMemcpyAsync from pinned staging buffers (H2D copies), cupy.take",
    "morton_sort": "cupy.zeros (bucket counts)",
    "candidate_filter": "cupy.zeros (stats)",
    "predicate_refine": "cupy.zeros (stats)",
    "output_sort": "cupy.zeros (per-point counts)",
}


class JoinGPU(GpuBackend):
    SOURCE, STAGE_KERNELS, LIBRARY_CALLS = SOURCE, STAGE_KERNELS, LIBRARY_CALLS
    SCAN_STAGES = ("morton_sort", "candidate_filter", "output_sort")

    def __init__(self, tiling: dict, version: str = "v1"):
        super().__init__(tiling, version)
        self.sm_count = self.cp.cuda.Device().attributes["MultiProcessorCount"]

    # --- stages ----------------------------------------------------------------------
    def owned_buffer_build(self, state, st, tiling):
        cp, inp = self.cp, state["inputs"]
        polys = inp.polygons
        if polys.n_coords >= 2**31 or len(inp.points) >= 2**31:
            raise ValueError("more than 2^31 points or vertices: the int32 offsets would overflow")
        # Polygons first: bounds reads them before the points.
        state.update(self.stage_in(st, coords=(polys.coords, np.float64), ring_offsets=(polys.ring_offsets, np.int32),
                                   geom_ring_offsets=(polys.geom_ring_offsets, np.int32),
                                   points=(inp.points, np.float64)))
        state["geom_coord_offsets"] = cp.take(state["ring_offsets"], state["geom_ring_offsets"])
        st.rows_in = st.rows_out = len(inp.points) + polys.n_geoms
        st.meta.update(points=len(inp.points), polygons=polys.n_geoms, rings=polys.n_rings,
                       vertices=polys.n_coords, owned_bytes=int(inp.points.nbytes + polys.nbytes()))

    def bounds(self, state, st, tiling):
        cp, ws = self.cp, self.mod.ws
        g, pts = state["inputs"].polygons.n_geoms, state["points"]
        bbox = ws.empty("bbox", (g, 4), cp.float64)
        summary = ws.empty("summary", 8, cp.float64)
        self.mod.fn["init_summary"]((1,), (32,), (summary,))
        self._launch("polygon_bounds", g, tiling["block"], (state["coords"], state["geom_coord_offsets"],
                                                            np.int64(g), bbox, summary))
        if len(pts):   # fixed grid, grid-stride loop: few blocks, few atomics
            blocks = min((len(pts) + tiling["block"] - 1) // tiling["block"], 4 * self.sm_count)
            self.mod.fn["point_extent"]((blocks,), (tiling["block"],), (pts, np.int64(len(pts)), summary))
        # One read sizes the grid: world box and mean bbox size choose the level.
        host = st.read_size(summary, "world box + mean bbox size -> grid level")
        state["bbox"], state["world"], state["mean_wh"] = bbox, host[:4], (host[4] / max(g, 1), host[5] / max(g, 1))
        st.rows_in, st.rows_out = g + len(pts), g

    def morton_sort(self, state, st, tiling):
        cp, ws, pts = self.cp, self.mod.ws, state["points"]
        n, block = len(pts), tiling["block"]
        level = grid.grid_level(state["world"], *state["mean_wh"], bias=tiling["level_bias"])
        minx, miny, sx, sy = grid.world_scale(state["world"])
        shift = np.int32(grid.BITS - level)
        pcell = ws.empty("pcell", n, cp.uint32)
        slot = ws.empty("point_slot", n, cp.int32)
        counts = ws.zeros("cell_counts", (1 << 2 * level) + 1, cp.int32)
        self._launch("point_cells", n, block, (pts, np.int64(n), minx, miny, sx, sy, shift, pcell, slot, counts))
        cell_start = self.mod.inclusive_scan(counts, cp.int32, "cell_start")
        sorted_pt = ws.empty("sorted_pt", n, cp.int32)
        self._launch("point_scatter", n, block, (pcell, slot, np.int64(n), cell_start, sorted_pt))
        state.update(level=level, cell_start=cell_start, sorted_pt=sorted_pt)
        st.rows_in = st.rows_out = n
        st.meta.update(grid_level=level, grid_cells=1 << 2 * level)

    def candidate_filter(self, state, st, tiling):
        if self.version == "v2":
            return self._candidate_filter_cells(state, st, tiling)
        cp, ws, bbox = self.cp, self.mod.ws, state["bbox"]
        g, block = len(bbox), tiling["block"]
        minx, miny, sx, sy = grid.world_scale(state["world"])
        counts = ws.empty("poly_counts", g, cp.int64)
        stats = ws.zeros("filter_stats", 2, cp.uint64)
        args = (state["points"], bbox, np.int64(g), minx, miny, sx, sy, np.int32(grid.BITS - state["level"]),
                state["cell_start"], state["sorted_pt"])
        self._launch("candidate_count", 32 * g, block, args + (counts, stats))   # a warp per polygon
        offsets = self.mod.inclusive_scan(counts, cp.int64, "poly_offsets")
        examined, c = (int(v) for v in st.read_size(stats, "candidate pairs -> buffer size"))
        if c >= 2**31:
            raise ValueError(f"{c} candidate pairs: more than refine's int32 indexing allows; split the points")
        cand_pt = ws.empty("cand_pt", c, cp.int32)
        cand_poly = ws.empty("cand_poly", c, cp.int32)
        self._launch("candidate_emit", 32 * g, block, args + (offsets, cand_pt, cand_poly))
        state["cand_pt"], state["cand_poly"] = cand_pt, cand_poly
        st.rows_in, st.rows_out = g, c
        st.meta.update(pairs_examined=examined, candidates=c)

    def _candidate_filter_cells(self, state, st, tiling):
        """v2: polygons listed per grid cell (counting sort), each point tests its own cell's list."""
        cp, ws, bbox = self.cp, self.mod.ws, state["bbox"]
        g, n, block = len(bbox), len(state["points"]), tiling["block"]
        level = state["level"]
        cells = 1 << 2 * level
        minx, miny, sx, sy = grid.world_scale(state["world"])
        shift = np.int32(grid.BITS - level)
        geo = (np.int64(g), minx, miny, sx, sy, shift)
        counts = ws.zeros("poly_cell_counts", cells + 1, cp.int32)
        self._launch("poly_cell_count", g, block, (bbox, *geo, counts))
        cell_start = self.mod.inclusive_scan(counts, cp.int32, "poly_cell_start")
        e = int(st.read_size(cell_start[-1:], "grid entries -> entry buffer size")[0])
        entries = ws.empty("poly_entries", e, cp.int32)
        fill = ws.zeros("poly_cell_fill", cells, cp.int32)
        self._launch("poly_cell_fill", g, block, (bbox, *geo, cell_start, fill, entries))
        pcounts = ws.empty("point_counts_v2", n, cp.int64)
        stats = ws.zeros("filter_stats", 2, cp.uint64)
        null = np.intp(0)
        args = (state["points"], state["sorted_pt"], np.int64(n), minx, miny, sx, sy, shift, cell_start, entries, bbox)
        self._launch("point_candidates", n, block, args + (pcounts, null, null, null, stats))
        offsets = self.mod.inclusive_scan(pcounts, cp.int64, "point_offsets_v2")
        examined, c = (int(v) for v in st.read_size(stats, "candidate pairs -> buffer size"))
        if c >= 2**31:
            raise ValueError(f"{c} candidate pairs: more than refine's int32 indexing allows; split the points")
        cand_pt = ws.empty("cand_pt", c, cp.int32)
        cand_poly = ws.empty("cand_poly", c, cp.int32)
        self._launch("point_candidates", n, block, args + (pcounts, offsets, cand_pt, cand_poly, stats))
        state["cand_pt"], state["cand_poly"] = cand_pt, cand_poly
        st.rows_in, st.rows_out = n, c
        st.meta.update(pairs_examined=examined, candidates=c, grid_entries=e)

    def predicate_refine(self, state, st, tiling):
        cp, ws = self.cp, self.mod.ws
        c = len(state["cand_pt"])
        hits = ws.empty("hits", c, cp.uint64)      # hits <= candidates: no size read needed up front
        stats = ws.zeros("refine_stats", 4, cp.uint64)
        within = np.int32(state["inputs"].predicate == "within")
        self._launch("refine", c, tiling["block"], (state["points"], state["coords"], state["ring_offsets"],
                                                    state["geom_ring_offsets"], state["cand_pt"], state["cand_poly"],
                                                    np.int32(c), within, CCW_ERRBOUND_A, hits, stats))
        # The hit count stays on the device: output_sort reads it once, after queueing its own
        # kernels, and fills in this stage's rows_out and counters then.
        state.update(hits=hits, refine_stats=stats, refine_st=st)
        st.rows_in = c

    def output_sort(self, state, st, tiling):
        cp, ws, hits, stats = self.cp, self.mod.ws, state["hits"], state["refine_stats"]
        c, n, block = len(hits), len(state["points"]), tiling["block"]
        slot = ws.empty("hit_slot", c, cp.int32)
        counts = ws.zeros("point_counts", n + 1, cp.int32)
        self._launch("pair_count", c, block, (hits, stats, slot, counts))
        start = self.mod.inclusive_scan(counts, cp.int64, "point_start")
        pt = cp.empty(c, dtype=cp.int64)        # handed to the caller: never workspace
        poly = cp.empty(c, dtype=cp.int64)
        self._launch("pair_scatter", c, block, (hits, stats, slot, start, pt, poly))
        self._launch("segment_sort", n, block, (start, np.int64(n), poly))
        h, n_exact, n_edges, n_boundary = (int(v) for v in st.read_size(stats, "hits -> output size"))
        state["output"] = (pt[:h], poly[:h])
        st.rows_in = st.rows_out = h
        refine = state["refine_st"]
        refine.rows_out = h
        refine.meta.update(exact_orientations=n_exact, boundary_pairs=n_boundary, edge_tests=n_edges)
