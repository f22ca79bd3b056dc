"""The overlay's stages in vectorised numpy: the CPU path, same stages as gpu.py.

Area of A ∩ B by Green's theorem: the boundary of the intersection is made of
the pieces of A's rings inside B and of B's rings inside A, each keeping its
ring's orientation (shells CCW, holes CW). Every edge of each candidate pair is
split at the points where the other polygon's boundary meets it; each piece is
kept when its midpoint lies strictly inside the other polygon, and pieces on a
shared (collinear) boundary are kept once, from A, when both run the same way.
"""
from __future__ import annotations

import numpy as np

from app.kernel import grid
from app.kernel.pip import classify, edge_table
from app.kernel.ranges import expand
from app.kernel.segments import OVERLAP, PROPER, TOUCH, classify_pairs


def layer_bboxes(coords, geom_coord_offsets):
    starts = geom_coord_offsets[:-1]
    x, y = coords[:, 0].copy(), coords[:, 1].copy()
    return np.stack([np.minimum.reduceat(x, starts), np.minimum.reduceat(y, starts),
                     np.maximum.reduceat(x, starts), np.maximum.reduceat(y, starts)], axis=1)


def bbox_pairs(ba: np.ndarray, bb: np.ndarray, bias: int = 0):
    """All (a, b) with overlapping bboxes, sorted by (a, b): a uniform grid, each pair
    reported once, from the cell holding the lower-left corner of the bbox overlap."""
    world = np.r_[np.minimum(ba[:, :2].min(0), bb[:, :2].min(0)), np.maximum(ba[:, 2:].max(0), bb[:, 2:].max(0))]
    both = np.concatenate([ba, bb])
    level = grid.grid_level(world, float((both[:, 2] - both[:, 0]).mean()),
                            float((both[:, 3] - both[:, 1]).mean()), bias)
    shift = np.uint32(grid.BITS - level)
    minx, miny, sx, sy = grid.world_scale(world)

    def cells(box):
        x0 = grid.quantise(box[:, 0], minx, sx) >> shift
        y0 = grid.quantise(box[:, 1], miny, sy) >> shift
        nx = (grid.quantise(box[:, 2], minx, sx) >> shift) - x0 + 1
        ny = (grid.quantise(box[:, 3], miny, sy) >> shift) - y0 + 1
        owner, local = expand(np.zeros(len(box), dtype=np.int64), nx.astype(np.int64) * ny)
        nxo = nx[owner].astype(np.int64)
        return owner, grid.morton(x0[owner] + (local % nxo).astype(np.uint32),
                                  y0[owner] + (local // nxo).astype(np.uint32))

    b_owner, b_cell = cells(bb)
    order = np.argsort(b_cell, kind="stable")
    b_owner, b_cell = b_owner[order], b_cell[order]
    a_owner, a_cell = cells(ba)
    lo = np.searchsorted(b_cell, a_cell, side="left")
    hi = np.searchsorted(b_cell, a_cell, side="right")
    row, j = expand(lo, hi - lo)
    a, b, cell = a_owner[row], b_owner[j], a_cell[row]
    A, B = ba[a], bb[b]
    hit = (A[:, 0] <= B[:, 2]) & (B[:, 0] <= A[:, 2]) & (A[:, 1] <= B[:, 3]) & (B[:, 1] <= A[:, 3])
    ref = grid.morton(grid.quantise(np.maximum(A[:, 0], B[:, 0]), minx, sx) >> shift,
                      grid.quantise(np.maximum(A[:, 1], B[:, 1]), miny, sy) >> shift)
    keep = hit & (ref == cell)
    a, b = a[keep], b[keep]
    order = np.lexsort((b, a))
    return a[order], b[order], {"grid_level": level, "bbox_tests": int(len(hit))}


class OverlayCPU:
    device = "cpu"

    def __init__(self, version: str = "v1"):
        self.version = version

    def compile(self) -> dict:
        return {}

    @staticmethod
    def to_host(array):
        return np.asarray(array)

    def artifacts(self) -> dict:
        return {}

    def owned_buffer_build(self, state, st, tiling):
        inp = state["inputs"]
        for side, layer in (("a", inp.left), ("b", inp.right)):
            state[side] = {"coords": np.array(layer.coords, dtype=np.float64, order="C"),
                           "ring_offsets": np.array(layer.ring_offsets, dtype=np.int64),
                           "geom_ring_offsets": np.array(layer.geom_ring_offsets, dtype=np.int64)}
        st.rows_in = st.rows_out = inp.left.n_geoms + inp.right.n_geoms
        st.meta.update(left=inp.left.n_geoms, right=inp.right.n_geoms,
                       vertices=inp.left.n_coords + inp.right.n_coords,
                       owned_bytes=int(inp.left.nbytes() + inp.right.nbytes()))

    def segment_extraction(self, state, st, tiling):
        for side in ("a", "b"):
            L = state[side]
            L["edges"] = e = edge_table(L["coords"], L["ring_offsets"], L["geom_ring_offsets"])
            L["bbox"] = layer_bboxes(L["coords"], L["ring_offsets"][L["geom_ring_offsets"]])
            L["xlo"], L["xhi"] = np.minimum(e.ax, e.bx), np.maximum(e.ax, e.bx)
        st.rows_in = state["a"]["bbox"].shape[0] + state["b"]["bbox"].shape[0]
        st.rows_out = len(state["a"]["edges"].ax) + len(state["b"]["edges"].ax)
        st.meta.update(segments_left=len(state["a"]["edges"].ax), segments_right=len(state["b"]["edges"].ax))

    def segment_mbr_filter(self, state, st, tiling):
        A, B = state["a"], state["b"]
        pa, pb, info = bbox_pairs(A["bbox"], B["bbox"], tiling["level_bias"])
        ea = np.diff(A["edges"].geom_offsets)[pa]
        eb = np.diff(B["edges"].geom_offsets)[pb]
        # Edges of a that reach b's bbox (and of b that reach a's): only they can meet.
        pair_a, ia = expand(A["edges"].geom_offsets[pa], ea)
        near_a = _mbr_hits(A, ia, B["bbox"][pb[pair_a]])
        pair_a, ia = pair_a[near_a], ia[near_a]
        pair_b, jb = expand(B["edges"].geom_offsets[pb], eb)
        near_b = _mbr_hits(B, jb, A["bbox"][pa[pair_b]])
        pair_b, jb = pair_b[near_b], jb[near_b]
        # Brute force within each pair: every near edge of a x every near edge of b.
        na = np.bincount(pair_a, minlength=len(pa))
        nb = np.bincount(pair_b, minlength=len(pa))
        a_start = np.cumsum(na) - na
        b_start = np.cumsum(nb) - nb
        owner, k = expand(np.zeros(len(pa), dtype=np.int64), na * nb)
        i = ia[a_start[owner] + k // nb[owner]]
        j = jb[b_start[owner] + k % nb[owner]]
        Ea, Eb = A["edges"], B["edges"]
        hit = ((A["xlo"][i] <= B["xhi"][j]) & (B["xlo"][j] <= A["xhi"][i])
               & (Ea.ylo[i] <= Eb.yhi[j]) & (Eb.ylo[j] <= Ea.yhi[i]))
        state.update(pa=pa, pb=pb, ea=ea, eb=eb, seg_pair=owner[hit], seg_i=i[hit], seg_j=j[hit])
        st.rows_in, st.rows_out = len(pa), int(hit.sum())
        st.meta.update(polygon_pairs=len(pa), pairs_examined=int(len(hit)), candidates=int(hit.sum()),
                       grid_level=info["grid_level"], bbox_tests=info["bbox_tests"])

    def exact_intersection_refine(self, state, st, tiling):
        Ea, Eb = state["a"]["edges"], state["b"]["edges"]
        p, i, j = state["seg_pair"], state["seg_i"], state["seg_j"]
        r = classify_pairs(Ea.ax[i], Ea.ay[i], Ea.bx[i], Ea.by[i], Eb.ax[j], Eb.ay[j], Eb.bx[j], Eb.by[j])
        # Slots: per pair, a's edges then b's edges, each at its local index.
        slot_base = np.cumsum(state["ea"] + state["eb"]) - (state["ea"] + state["eb"])
        slot_e = slot_base[p] + (i - Ea.geom_offsets[state["pa"][p]])
        slot_f = slot_base[p] + state["ea"][p] + (j - Eb.geom_offsets[state["pb"][p]])
        ev_slot = np.concatenate([slot_e, slot_e, slot_f, slot_f])
        ev_t = np.concatenate([r.e_t[:, 0], r.e_t[:, 1], r.f_t[:, 0], r.f_t[:, 1]])
        ok = ~np.isnan(ev_t)
        ov = np.flatnonzero(r.kind == OVERLAP)
        state.update(ev_slot=ev_slot[ok], ev_t=ev_t[ok], slot_base=slot_base,
                     ov_slot=np.concatenate([slot_e[ov], slot_f[ov]]),
                     ov_lo=np.concatenate([r.e_ov[ov, 0], r.f_ov[ov, 0]]),
                     ov_hi=np.concatenate([r.e_ov[ov, 1], r.f_ov[ov, 1]]),
                     # A keeps a shared piece when both run the same way; B never does (no double count).
                     ov_keep=np.concatenate([r.same_dir[ov], np.zeros(len(ov), dtype=bool)]))
        st.rows_in, st.rows_out = len(p), int(ok.sum())
        st.meta.update(proper=int((r.kind == PROPER).sum()), touch=int((r.kind == TOUCH).sum()),
                       collinear_overlap=int(len(ov)), ambiguous_pairs=int(r.ambiguous.sum()),
                       split_events=int(ok.sum()))

    def reconstruction_event_sort(self, state, st, tiling):
        order = np.lexsort((state["ev_t"], state["ev_slot"]))
        state["ev_slot"], state["ev_t"] = state["ev_slot"][order], state["ev_t"][order]
        st.rows_in = st.rows_out = len(order)

    def area_reconstruction(self, state, st, tiling):
        A, B = state["a"], state["b"]
        pa, pb, ea, eb = state["pa"], state["pb"], state["ea"], state["eb"]
        n_slots = int((ea + eb).sum())
        slot_pair = np.repeat(np.arange(len(pa)), ea + eb)
        local = np.arange(n_slots) - state["slot_base"][slot_pair]
        is_a = local < ea[slot_pair]
        edge = np.where(is_a, A["edges"].geom_offsets[pa[slot_pair]] + local,
                        B["edges"].geom_offsets[pb[slot_pair]] + local - ea[slot_pair])
        # A slot whose edge misses the other polygon's bbox lies wholly outside it.
        other_box = np.where(is_a[:, None], B["bbox"][pb[slot_pair]], A["bbox"][pa[slot_pair]])
        x0, y0, x1, y1 = _edge_coords(A, B, edge, is_a)
        reach = ((np.minimum(x0, x1) <= other_box[:, 2]) & (other_box[:, 0] <= np.maximum(x0, x1))
                 & (np.minimum(y0, y1) <= other_box[:, 3]) & (other_box[:, 1] <= np.maximum(y0, y1)))
        live = np.flatnonzero(reach)
        # Fragment bounds: 0 and 1 of every live slot, plus the sorted split events.
        ev_live = reach[state["ev_slot"]]
        f_slot = np.concatenate([live, live, state["ev_slot"][ev_live]])
        f_t = np.concatenate([np.zeros(len(live)), np.ones(len(live)), state["ev_t"][ev_live]])
        order = np.lexsort((f_t, f_slot))
        f_slot, f_t = f_slot[order], f_t[order]
        nxt = np.flatnonzero((f_slot[1:] == f_slot[:-1]) & (f_t[1:] > f_t[:-1]))
        s, t0, t1 = f_slot[nxt], f_t[nxt], f_t[nxt + 1]
        keep = np.zeros(len(s), dtype=bool)
        on_shared = np.zeros(len(s), dtype=bool)
        if len(state["ov_slot"]):
            tm = 0.5 * (t0 + t1)
            ov_order = np.argsort(state["ov_slot"], kind="stable")
            ov_slot = state["ov_slot"][ov_order]
            lo = np.searchsorted(ov_slot, s, side="left")
            hi = np.searchsorted(ov_slot, s, side="right")
            frag, k = expand(lo, hi - lo)
            k = ov_order[k]
            inside_ov = (state["ov_lo"][k] <= tm[frag]) & (tm[frag] <= state["ov_hi"][k])
            on_shared[frag[inside_ov]] = True
            keep[frag[inside_ov & state["ov_keep"][k]]] = True
        test = np.flatnonzero(~on_shared)
        sa = is_a[s[test]]
        mid_t = 0.5 * (t0[test] + t1[test])
        ex0, ey0, ex1, ey1 = x0[s[test]], y0[s[test]], x1[s[test]], y1[s[test]]
        mids = np.stack([ex0 + mid_t * (ex1 - ex0), ey0 + mid_t * (ey1 - ey0)], axis=1)
        other_geom = np.where(sa, pb[slot_pair[s[test]]], pa[slot_pair[s[test]]])
        inside = np.zeros(len(test), dtype=bool)
        for layer, mask in ((B, sa), (A, ~sa)):
            idx = np.flatnonzero(mask)
            parity, boundary, _ = classify(mids, layer["edges"], idx, other_geom[idx])
            inside[idx] = parity & ~boundary
        keep[test] = inside
        # Shoelace over the kept pieces, relative to the pair's A-bbox centre (less cancellation).
        k = np.flatnonzero(keep)
        ks = s[k]
        pair = slot_pair[ks]
        ox = 0.5 * (A["bbox"][pa[pair], 0] + A["bbox"][pa[pair], 2])
        oy = 0.5 * (A["bbox"][pa[pair], 1] + A["bbox"][pa[pair], 3])
        px0, py0 = _point_at(x0[ks], y0[ks], x1[ks], y1[ks], t0[k])
        px1, py1 = _point_at(x0[ks], y0[ks], x1[ks], y1[ks], t1[k])
        cross = (px0 - ox) * (py1 - oy) - (px1 - ox) * (py0 - oy)
        area = 0.5 * np.bincount(pair, weights=cross, minlength=len(pa))
        pos = area > 0
        state["output"] = (pa[pos].astype(np.int64), pb[pos].astype(np.int64), area[pos])
        st.rows_in, st.rows_out = len(pa), int(pos.sum())
        st.meta.update(fragments=int(len(s)), fragments_kept=int(len(k)), pip_tests=int(len(test)),
                       slots=n_slots, live_slots=int(len(live)))


def _mbr_hits(L, e, box):
    E = L["edges"]
    return ((L["xlo"][e] <= box[:, 2]) & (box[:, 0] <= L["xhi"][e])
            & (E.ylo[e] <= box[:, 3]) & (box[:, 1] <= E.yhi[e]))


def _edge_coords(A, B, edge, is_a):
    Ea, Eb = A["edges"], B["edges"]
    ea = np.where(is_a, edge, 0)
    eb = np.where(is_a, 0, edge)
    return (np.where(is_a, Ea.ax[ea], Eb.ax[eb]), np.where(is_a, Ea.ay[ea], Eb.ay[eb]),
            np.where(is_a, Ea.bx[ea], Eb.bx[eb]), np.where(is_a, Ea.by[ea], Eb.by[eb]))


def _point_at(x0, y0, x1, y1, t):
    """The point at parameter t; t = 0 and t = 1 give the endpoints exactly."""
    return (np.where(t == 1.0, x1, x0 + t * (x1 - x0)), np.where(t == 1.0, y1, y0 + t * (y1 - y0)))
