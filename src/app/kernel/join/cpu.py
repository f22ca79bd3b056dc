"""The join's stages in vectorised numpy: the CPU path, same stages and algorithm as gpu.py."""
from __future__ import annotations

import numpy as np

from app.kernel import grid
from app.kernel.pip import classify, edge_table
from app.kernel.ranges import expand as _expand


class JoinCPU:
    device = "cpu"

    def __init__(self, version: str = "v1"):
        self.version = version

    def compile(self) -> dict:
        return {}  # nothing to JIT on the CPU

    @staticmethod
    def to_host(array):
        return np.asarray(array)

    def artifacts(self) -> dict:
        return {}  # compiled/ holds GPU kernels only

    def owned_buffer_build(self, state, st, tiling):
        inp = state["inputs"]
        polys = inp.polygons
        # Owned, contiguous copies: later stages never touch caller memory.
        state["points"] = np.array(inp.points, dtype=np.float64, order="C")
        state["coords"] = np.array(polys.coords, dtype=np.float64, order="C")
        state["ring_offsets"] = np.array(polys.ring_offsets, dtype=np.int64)
        state["geom_ring_offsets"] = np.array(polys.geom_ring_offsets, dtype=np.int64)
        state["geom_coord_offsets"] = state["ring_offsets"][state["geom_ring_offsets"]]
        st.rows_in = st.rows_out = len(inp.points) + polys.n_geoms
        st.meta.update(points=len(inp.points), polygons=polys.n_geoms, rings=polys.n_rings,
                       vertices=polys.n_coords, owned_bytes=int(inp.points.nbytes + polys.nbytes()))

    def bounds(self, state, st, tiling):
        coords, gco = state["coords"], state["geom_coord_offsets"]
        starts = gco[:-1]
        x, y = coords[:, 0].copy(), coords[:, 1].copy()
        bbox = np.stack([np.minimum.reduceat(x, starts), np.minimum.reduceat(y, starts),
                         np.maximum.reduceat(x, starts), np.maximum.reduceat(y, starts)], axis=1)
        pts = state["points"]
        lo, hi = bbox[:, :2].min(0), bbox[:, 2:].max(0)
        if len(pts):
            px, py = pts[:, 0], pts[:, 1]
            lo = np.minimum(lo, [px.min(), py.min()])
            hi = np.maximum(hi, [px.max(), py.max()])
        state["bbox"], state["world"] = bbox, np.r_[lo, hi]
        g = max(len(starts), 1)
        state["mean_wh"] = (float((bbox[:, 2] - bbox[:, 0]).sum() / g), float((bbox[:, 3] - bbox[:, 1]).sum() / g))
        st.rows_in, st.rows_out = len(starts) + len(pts), len(starts)

    def morton_sort(self, state, st, tiling):
        pts = state["points"]
        level = grid.grid_level(state["world"], *state["mean_wh"], bias=tiling["level_bias"])
        minx, miny, sx, sy = grid.world_scale(state["world"])
        shift = np.uint32(grid.BITS - level)
        pcell = grid.morton(grid.quantise(pts[:, 0], minx, sx) >> shift, grid.quantise(pts[:, 1], miny, sy) >> shift)
        cells = 1 << 2 * level
        state["sorted_pt"] = np.argsort(pcell, kind="stable")
        state["cell_start"] = np.concatenate([[0], np.cumsum(np.bincount(pcell, minlength=cells))])
        state["level"] = level
        st.rows_in = st.rows_out = len(pts)
        st.meta.update(grid_level=level, grid_cells=cells)

    def candidate_filter(self, state, st, tiling):
        if self.version == "v2":
            return self._candidate_filter_cells(state, st, tiling)
        bbox, world, level = state["bbox"], state["world"], state["level"]
        shift = np.uint32(grid.BITS - level)
        minx, miny, sx, sy = grid.world_scale(world)
        x0 = grid.quantise(bbox[:, 0], minx, sx) >> shift
        y0 = grid.quantise(bbox[:, 1], miny, sy) >> shift
        x1 = grid.quantise(bbox[:, 2], minx, sx) >> shift
        y1 = grid.quantise(bbox[:, 3], miny, sy) >> shift
        nx, ny = (x1 - x0 + 1).astype(np.int64), (y1 - y0 + 1).astype(np.int64)
        # Each polygon scans the point buckets of every cell its bbox covers.
        poly, local = _expand(np.zeros(len(bbox), dtype=np.int64), nx * ny)
        cell = grid.morton(x0[poly] + (local % nx[poly]).astype(np.uint32),
                           y0[poly] + (local // nx[poly]).astype(np.uint32))
        cs = state["cell_start"]
        owner, j = _expand(cs[cell], cs[cell + 1] - cs[cell])
        cand_poly = poly[owner]
        cand_pt = state["sorted_pt"][j]
        p, b = state["points"][cand_pt], bbox[cand_poly]
        hit = (b[:, 0] <= p[:, 0]) & (p[:, 0] <= b[:, 2]) & (b[:, 1] <= p[:, 1]) & (p[:, 1] <= b[:, 3])
        state["cand_pt"], state["cand_poly"] = cand_pt[hit], cand_poly[hit]
        st.rows_in, st.rows_out = len(bbox), int(hit.sum())
        st.meta.update(pairs_examined=int(len(hit)), candidates=int(hit.sum()))

    def _candidate_filter_cells(self, state, st, tiling):
        """v2: polygons listed per grid cell, each point (Morton-bucketed) tests its own cell's list."""
        bbox, level, pts = state["bbox"], state["level"], state["points"]
        shift = np.uint32(grid.BITS - level)
        minx, miny, sx, sy = grid.world_scale(state["world"])
        x0 = grid.quantise(bbox[:, 0], minx, sx) >> shift
        y0 = grid.quantise(bbox[:, 1], miny, sy) >> shift
        nx = ((grid.quantise(bbox[:, 2], minx, sx) >> shift) - x0 + 1).astype(np.int64)
        ny = ((grid.quantise(bbox[:, 3], miny, sy) >> shift) - y0 + 1).astype(np.int64)
        poly, local = _expand(np.zeros(len(bbox), dtype=np.int64), nx * ny)
        cell = grid.morton(x0[poly] + (local % nx[poly]).astype(np.uint32),
                           y0[poly] + (local // nx[poly]).astype(np.uint32))
        by_cell = np.argsort(cell, kind="stable")
        entries = poly[by_cell]
        cell_start = np.concatenate([[0], np.cumsum(np.bincount(cell, minlength=1 << 2 * level))])
        order = state["sorted_pt"]
        p = pts[order]
        pcell = grid.morton(grid.quantise(p[:, 0], minx, sx) >> shift, grid.quantise(p[:, 1], miny, sy) >> shift)
        row, j = _expand(cell_start[pcell], cell_start[pcell + 1] - cell_start[pcell])
        cand_pt, cand_poly = order[row], entries[j]
        q, b = pts[cand_pt], bbox[cand_poly]
        hit = (b[:, 0] <= q[:, 0]) & (q[:, 0] <= b[:, 2]) & (b[:, 1] <= q[:, 1]) & (q[:, 1] <= b[:, 3])
        state["cand_pt"], state["cand_poly"] = cand_pt[hit], cand_poly[hit]
        st.rows_in, st.rows_out = len(pts), int(hit.sum())
        st.meta.update(pairs_examined=int(len(hit)), candidates=int(hit.sum()), grid_entries=int(len(entries)))

    def predicate_refine(self, state, st, tiling):
        edges = edge_table(state["coords"], state["ring_offsets"], state["geom_ring_offsets"])
        parity, boundary, exact = classify(state["points"], edges, state["cand_pt"], state["cand_poly"])
        keep = (parity & ~boundary) if state["inputs"].predicate == "within" else (parity | boundary)
        state["hit_pt"], state["hit_poly"] = state["cand_pt"][keep], state["cand_poly"][keep]
        st.rows_in, st.rows_out = len(keep), int(keep.sum())
        st.meta.update(exact_orientations=exact, boundary_pairs=int(boundary.sum()),
                       edge_tests=int(np.diff(edges.geom_offsets)[state["cand_poly"]].sum()))

    def output_sort(self, state, st, tiling):
        keys = np.sort((state["hit_pt"].astype(np.int64) << 32) | state["hit_poly"].astype(np.int64))
        state["output"] = (keys >> 32, keys & 0xFFFFFFFF)
        st.rows_in = st.rows_out = len(keys)
