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
    def outputs_to_host(arrays) -> tuple:
        return tuple(np.asarray(a) for a in arrays)

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
        pcell = grid.cell_of(pts[:, 0], pts[:, 1], state["world"], level)
        state["sorted_pt"], state["cell_start"] = grid.bucket(pcell, level)
        state["level"] = level
        st.rows_in = st.rows_out = len(pts)
        st.meta.update(grid_level=level, grid_cells=1 << 2 * level)

    def candidate_filter(self, state, st, tiling):
        if self.version == "v2":
            return self._candidate_filter_cells(state, st, tiling)
        bbox = state["bbox"]
        # Each polygon scans the point buckets of every cell its bbox covers.
        poly, cell = grid.covered_cells(bbox, state["world"], state["level"])
        cs = state["cell_start"]
        owner, j = _expand(cs[cell], cs[cell + 1] - cs[cell])
        self._keep_hits(state, st, state["sorted_pt"][j], poly[owner], rows_in=len(bbox))

    def _candidate_filter_cells(self, state, st, tiling):
        """v2: polygons listed per grid cell, each point (Morton-bucketed) tests its own cell's list."""
        bbox, level, pts = state["bbox"], state["level"], state["points"]
        poly, cell = grid.covered_cells(bbox, state["world"], level)
        by_cell, cell_start = grid.bucket(cell, level)
        entries = poly[by_cell]
        order = state["sorted_pt"]
        pcell = grid.cell_of(pts[order, 0], pts[order, 1], state["world"], level)
        row, j = _expand(cell_start[pcell], cell_start[pcell + 1] - cell_start[pcell])
        self._keep_hits(state, st, order[row], entries[j], rows_in=len(pts))
        st.meta["grid_entries"] = int(len(entries))

    @staticmethod
    def _keep_hits(state, st, cand_pt, cand_poly, rows_in):
        """Keep the (point, polygon) pairs whose bbox holds the point (closed bbox)."""
        # Column by column with np.take: gathering whole rows and comparing strided columns took 3x as long.
        pts, bbox = state["points"], state["bbox"]
        px, py = np.take(pts[:, 0], cand_pt), np.take(pts[:, 1], cand_pt)
        hit = np.take(bbox[:, 0], cand_poly) <= px
        hit &= px <= np.take(bbox[:, 2], cand_poly)
        hit &= np.take(bbox[:, 1], cand_poly) <= py
        hit &= py <= np.take(bbox[:, 3], cand_poly)
        state["cand_pt"], state["cand_poly"] = cand_pt[hit], cand_poly[hit]
        st.rows_in, st.rows_out = rows_in, int(hit.sum())
        st.meta.update(pairs_examined=int(len(hit)), candidates=int(hit.sum()))

    def predicate_refine(self, state, st, tiling):
        edges = edge_table(state["coords"], state["ring_offsets"], state["geom_ring_offsets"])
        parity, boundary, exact, tests = classify(state["points"], edges, state["cand_pt"], state["cand_poly"])
        keep = (parity & ~boundary) if state["inputs"].predicate == "within" else (parity | boundary)
        state["hit_pt"], state["hit_poly"] = state["cand_pt"][keep], state["cand_poly"][keep]
        st.rows_in, st.rows_out = len(keep), int(keep.sum())
        st.meta.update(exact_orientations=exact, boundary_pairs=int(boundary.sum()),
                       edge_tests=int(np.diff(edges.geom_offsets)[state["cand_poly"]].sum()), orientation_tests=tests)

    def output_sort(self, state, st, tiling):
        keys = np.sort((state["hit_pt"].astype(np.int64) << 32) | state["hit_poly"].astype(np.int64))
        state["output"] = ((keys >> 32).astype(np.int32), (keys & 0xFFFFFFFF).astype(np.int32))   # as the GPU's
        st.rows_in = st.rows_out = len(keys)
