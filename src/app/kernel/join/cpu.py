"""The join's stages in vectorised numpy: the CPU path, same stage names as gpu.py."""
from __future__ import annotations

import numpy as np

from app.kernel import grid
from app.kernel.pip import classify, edge_valid


class JoinCPU:
    device = "cpu"

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
        state["geom_coord_offsets"] = polys.geom_coord_offsets().astype(np.int64)
        st.rows_in = st.rows_out = len(inp.points) + polys.n_geoms
        st.meta.update(points=len(inp.points), polygons=polys.n_geoms, rings=polys.n_rings,
                       vertices=polys.n_coords, owned_bytes=int(inp.points.nbytes + polys.nbytes()))

    def bounds(self, state, st, tiling):
        coords, gco = state["coords"], state["geom_coord_offsets"]
        starts = gco[:-1]
        bbox = np.empty((len(starts), 4))
        bbox[:, 0] = np.minimum.reduceat(coords[:, 0], starts)
        bbox[:, 1] = np.minimum.reduceat(coords[:, 1], starts)
        bbox[:, 2] = np.maximum.reduceat(coords[:, 0], starts)
        bbox[:, 3] = np.maximum.reduceat(coords[:, 1], starts)
        pts = state["points"]
        lo, hi = bbox[:, :2].min(0), bbox[:, 2:].max(0)
        if len(pts):
            lo, hi = np.minimum(lo, pts.min(0)), np.maximum(hi, pts.max(0))
        world = np.r_[lo, hi]
        state["bbox"], state["world"] = bbox, world
        state["mean_wh"] = (float((bbox[:, 2] - bbox[:, 0]).mean()), float((bbox[:, 3] - bbox[:, 1]).mean()))
        st.rows_in, st.rows_out = len(starts) + len(pts), len(starts)

    def morton_sort(self, state, st, tiling):
        pts = state["points"]
        minx, miny, sx, sy = grid.world_scale(state["world"])
        codes = grid.morton(grid.quantise(pts[:, 0], minx, sx), grid.quantise(pts[:, 1], miny, sy))
        order = np.argsort(codes, kind="stable")
        state["order"], state["codes"] = order, codes[order]
        st.rows_in = st.rows_out = len(pts)

    def candidate_filter(self, state, st, tiling):
        bbox, world = state["bbox"], state["world"]
        level = grid.grid_level(world, *state["mean_wh"], bias=tiling["level_bias"])
        shift = np.uint32(grid.BITS - level)
        minx, miny, sx, sy = grid.world_scale(world)
        # Each polygon is listed in every grid cell its bbox touches.
        x0 = grid.quantise(bbox[:, 0], minx, sx) >> shift
        y0 = grid.quantise(bbox[:, 1], miny, sy) >> shift
        x1 = grid.quantise(bbox[:, 2], minx, sx) >> shift
        y1 = grid.quantise(bbox[:, 3], miny, sy) >> shift
        nx, ny = (x1 - x0 + 1).astype(np.int64), (y1 - y0 + 1).astype(np.int64)
        per_poly = nx * ny
        poly = np.repeat(np.arange(len(bbox)), per_poly)
        local = np.arange(len(poly)) - np.repeat(np.cumsum(per_poly) - per_poly, per_poly)
        cx = x0[poly] + (local % nx[poly]).astype(np.uint32)
        cy = y0[poly] + (local // nx[poly]).astype(np.uint32)
        cell = grid.morton(cx, cy)
        by_cell = np.argsort(cell, kind="stable")
        entry_cell, entry_poly = cell[by_cell], poly[by_cell]
        # Points in Morton order look up their own cell's polygon list.
        pcell = state["codes"] >> np.uint32(2 * int(shift))
        lo = np.searchsorted(entry_cell, pcell, side="left")
        hi = np.searchsorted(entry_cell, pcell, side="right")
        counts = hi - lo
        sorted_pt = np.repeat(np.arange(len(pcell)), counts)
        ent = lo[sorted_pt] + np.arange(len(sorted_pt)) - np.repeat(np.cumsum(counts) - counts, counts)
        cand_poly = entry_poly[ent]
        cand_pt = state["order"][sorted_pt]
        p = state["points"][cand_pt]
        b = bbox[cand_poly]
        hit = (b[:, 0] <= p[:, 0]) & (p[:, 0] <= b[:, 2]) & (b[:, 1] <= p[:, 1]) & (p[:, 1] <= b[:, 3])
        state["cand_pt"], state["cand_poly"] = cand_pt[hit], cand_poly[hit]
        st.rows_in, st.rows_out = len(pcell), int(hit.sum())
        st.meta.update(pairs_examined=int(len(hit)), candidates=int(hit.sum()), grid_level=level,
                       grid_entries=int(len(entry_cell)))

    def predicate_refine(self, state, st, tiling):
        valid = edge_valid(state["ring_offsets"], len(state["coords"]))
        parity, boundary, exact = classify(state["points"], state["coords"], state["geom_coord_offsets"],
                                           valid, state["cand_pt"], state["cand_poly"])
        keep = (parity & ~boundary) if state["inputs"].predicate == "within" else (parity | boundary)
        state["hit_pt"], state["hit_poly"] = state["cand_pt"][keep], state["cand_poly"][keep]
        st.rows_in, st.rows_out = len(keep), int(keep.sum())
        gco = state["geom_coord_offsets"]
        edges_per_geom = np.diff(gco) - np.diff(state["inputs"].polygons.geom_ring_offsets)
        st.meta.update(exact_orientations=exact, boundary_pairs=int(boundary.sum()),
                       edge_tests=int(edges_per_geom[state["cand_poly"]].sum()))

    def output_sort(self, state, st, tiling):
        pt, poly = state["hit_pt"], state["hit_poly"]
        order = np.lexsort((poly, pt))
        state["output"] = (pt[order].astype(np.int64), poly[order].astype(np.int64))
        st.rows_in = st.rows_out = len(order)
