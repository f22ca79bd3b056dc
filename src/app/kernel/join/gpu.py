"""The join's stages on the GPU: CuPy plus the RawKernels of join.cu.

Nothing returns to the host inside the pipeline except three allocation-size
reads (world box for the grid level, candidate total, hit total), each made
through ``st.read_size`` so it is counted in the stage's metadata.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from app.kernel import grid
from app.kernel.gpu_build import CudaModule
from app.kernel.robust import CCW_ERRBOUND_A

SOURCE = Path(__file__).with_name("join.cu")
STAGE_KERNELS = {
    "bounds": ("polygon_bounds",),
    "morton_sort": ("point_keys",),
    "candidate_filter": ("poly_cell_count", "poly_cell_scatter", "candidate_count", "candidate_emit"),
    "predicate_refine": ("refine", "compact_pairs"),
    "output_sort": ("decode_pairs",),
}
# CuPy/CUB library kernels each stage also launches (no source of ours to show).
LIBRARY_CALLS = {
    "owned_buffer_build": "cupy.asarray (H2D copies), fancy-index take",
    "bounds": "cupy min/max/mean reductions",
    "morton_sort": "cupy.sort (radix sort of 64-bit keys)",
    "candidate_filter": "cupy.cumsum x2, cupy.sort (64-bit cell entries)",
    "predicate_refine": "cupy.cumsum",
    "output_sort": "cupy.sort (64-bit pair keys)",
}


class JoinGPU:
    device = "gpu"

    def __init__(self, tiling: dict):
        import cupy

        self.cp = cupy
        self.tiling = tiling
        self.mod = CudaModule(SOURCE, STAGE_KERNELS, LIBRARY_CALLS)

    def compile(self) -> dict:
        return self.mod.compile({s: t.get("block", 256) for s, t in self.tiling.items()})

    def artifacts(self) -> dict:
        return self.mod.artifacts({s: t.get("block", 256) for s, t in self.tiling.items()})

    def to_host(self, array):
        return self.cp.asnumpy(array)

    def _launch(self, name, n, block, args):
        if n > 0:
            self.mod.fn[name](((n + block - 1) // block,), (block,), args)

    # --- stages ----------------------------------------------------------------------
    def owned_buffer_build(self, state, st, tiling):
        cp, inp = self.cp, state["inputs"]
        polys = inp.polygons
        if polys.n_coords >= 2**31 or len(inp.points) >= 2**31:
            raise ValueError("more than 2^31 points or vertices: the int32 offsets would overflow")
        state["points"] = st.to_device(np.ascontiguousarray(inp.points, dtype=np.float64))
        state["coords"] = st.to_device(np.ascontiguousarray(polys.coords, dtype=np.float64))
        state["ring_offsets"] = st.to_device(polys.ring_offsets.astype(np.int32))
        state["geom_ring_offsets"] = st.to_device(polys.geom_ring_offsets.astype(np.int32))
        state["geom_coord_offsets"] = cp.take(state["ring_offsets"], state["geom_ring_offsets"])
        st.rows_in = st.rows_out = len(inp.points) + polys.n_geoms
        st.meta.update(points=len(inp.points), polygons=polys.n_geoms, rings=polys.n_rings,
                       vertices=polys.n_coords, owned_bytes=int(inp.points.nbytes + polys.nbytes()))

    def bounds(self, state, st, tiling):
        cp = self.cp
        g = state["inputs"].polygons.n_geoms
        bbox = cp.empty((g, 4), dtype=cp.float64)
        self._launch("polygon_bounds", g, tiling["block"], (state["coords"], state["geom_coord_offsets"],
                                                            np.int64(g), bbox))
        pts = state["points"]
        lo, hi = bbox[:, :2].min(axis=0), bbox[:, 2:].max(axis=0)
        if len(pts):
            lo, hi = cp.minimum(lo, pts.min(axis=0)), cp.maximum(hi, pts.max(axis=0))
        wh = (bbox[:, 2:] - bbox[:, :2]).mean(axis=0)
        # One read sizes the grid: world box and mean bbox size choose the level.
        summary = st.read_size(cp.concatenate([lo, hi, wh]), "world box + mean bbox size -> grid level")
        state["bbox"], state["world"], state["mean_wh"] = bbox, summary[:4], (float(summary[4]), float(summary[5]))
        st.rows_in, st.rows_out = g + len(pts), g

    def morton_sort(self, state, st, tiling):
        cp, pts = self.cp, state["points"]
        n = len(pts)
        keys = cp.empty(n, dtype=cp.uint64)
        minx, miny, sx, sy = grid.world_scale(state["world"])
        self._launch("point_keys", n, tiling["block"], (pts, np.int64(n), minx, miny, sx, sy, keys))
        state["point_keys"] = cp.sort(keys)
        st.rows_in = st.rows_out = n

    def candidate_filter(self, state, st, tiling):
        cp, bbox = self.cp, state["bbox"]
        g, n, block = len(bbox), len(state["points"]), tiling["block"]
        level = grid.grid_level(state["world"], *state["mean_wh"], bias=tiling["level_bias"])
        shift = grid.BITS - level
        minx, miny, sx, sy = grid.world_scale(state["world"])
        counts = cp.empty(g, dtype=cp.int64)
        self._launch("poly_cell_count", g, block, (bbox, np.int64(g), minx, miny, sx, sy, np.int32(shift), counts))
        offsets = cp.cumsum(counts)
        e = int(st.read_size(offsets[-1:], "grid entries -> entry buffer size")[0]) if g else 0
        entries = cp.empty(e, dtype=cp.uint64)
        self._launch("poly_cell_scatter", g, block, (bbox, np.int64(g), minx, miny, sx, sy, np.int32(shift),
                                                     offsets, entries))
        entries = cp.sort(entries)
        keys = state["point_keys"]
        pcounts = cp.empty(n, dtype=cp.int64)
        examined = cp.zeros(1, dtype=cp.uint64)
        args = (state["points"], keys, np.int64(n), entries, np.int64(e), bbox, np.int32(2 * shift))
        self._launch("candidate_count", n, block, args + (pcounts, examined))
        poffsets = cp.cumsum(pcounts)
        total = poffsets[-1:].astype(cp.uint64) if n else cp.zeros(1, dtype=cp.uint64)
        c, ex = (int(v) for v in st.read_size(cp.concatenate([total, examined]), "candidate pairs -> buffer size"))
        cand_pt = cp.empty(c, dtype=cp.int32)
        cand_poly = cp.empty(c, dtype=cp.int32)
        self._launch("candidate_emit", n, block, args + (poffsets, cand_pt, cand_poly))
        state["cand_pt"], state["cand_poly"] = cand_pt, cand_poly
        st.rows_in, st.rows_out = n, c
        st.meta.update(pairs_examined=ex, candidates=c, grid_level=level, grid_entries=e)

    def predicate_refine(self, state, st, tiling):
        cp = self.cp
        c = len(state["cand_pt"])
        keep = cp.empty(c, dtype=cp.int32)
        stats = cp.zeros(3, dtype=cp.uint64)
        within = np.int32(state["inputs"].predicate == "within")
        self._launch("refine", c, tiling["block"], (state["points"], state["coords"], state["ring_offsets"],
                                                    state["geom_ring_offsets"], state["cand_pt"], state["cand_poly"],
                                                    np.int64(c), within, CCW_ERRBOUND_A, keep, stats))
        scan = cp.cumsum(keep, dtype=cp.int64)
        total = scan[-1:].astype(cp.uint64) if c else cp.zeros(1, dtype=cp.uint64)
        h, n_exact, n_edges, n_boundary = (int(v) for v in st.read_size(cp.concatenate([total, stats]),
                                                                "hits -> output size"))
        keys = cp.empty(h, dtype=cp.uint64)
        self._launch("compact_pairs", c, tiling["block"], (keep, scan, state["cand_pt"], state["cand_poly"],
                                                           np.int64(c), keys))
        state["hit_keys"] = keys
        st.rows_in, st.rows_out = c, h
        st.meta.update(exact_orientations=n_exact, boundary_pairs=n_boundary, edge_tests=n_edges)

    def output_sort(self, state, st, tiling):
        cp = self.cp
        keys = cp.sort(state["hit_keys"])
        h = len(keys)
        pt = cp.empty(h, dtype=cp.int64)
        poly = cp.empty(h, dtype=cp.int64)
        self._launch("decode_pairs", h, tiling["block"], (keys, np.int64(h), pt, poly))
        state["output"] = (pt, poly)
        st.rows_in = st.rows_out = h
