"""The overlay's stages in vectorised numpy: the CPU path, same stages as gpu.py.

Area of A ∩ B by Green's theorem: the boundary of the intersection is made of
the pieces of A's rings inside B and of B's rings inside A, each keeping its
ring's orientation (shells CCW, holes CW). Every edge of each candidate pair is
split at the points where the other polygon's boundary meets it; each piece is
kept when a point inside it lies strictly inside the other polygon, and pieces on
a shared (collinear) boundary are kept once, from A, when both run the same way.

Exactness where the boundaries nearly coincide: a piece's test point is
e0 + tm (e1 - e0) on its edge (tm the middle of its bounds), classified exactly for
that point (pip.classify_segment_points), not for its rounding, which can fall on
the other side of a boundary the piece runs along. A proper crossing's parameter is
the ratio of two orientations, each to about an ulp (segments.py), so the pieces are
where the exact ones are, to a few ulps of their edge. Every contact of the two
boundaries leaves a record on both edges (a touch at a segment's own end a mark at
t = 0 or 1; a crossing, or a vertex of one edge on the other, whose parameter rounds
to an end kept there), so a ring with no record does not meet the other boundary at
all, and one of its vertices (an input point, off that boundary) decides it.

v1 and v2 test every piece. v3 (v1's candidates) carries each cut ring's
inside/outside status along it, as overlay_v3.cu's area_cut_rings does: refine says
which splits are proper crossings, and a piece is tested only where the status is
unknown (``_walk``). On random layers that is about one test in thirty of v1's,
with the same pieces kept.
"""
from __future__ import annotations

import numpy as np

from app.kernel import grid, pip
from app.kernel.pip import classify, classify_segment_points, edge_table, segment_points
from app.kernel.ranges import expand
from app.kernel.segments import OVERLAP, PROPER, TOUCH, classify_pairs
from app.kernel.sorting import lex_order


def layer_bboxes(coords, geom_coord_offsets):
    starts = geom_coord_offsets[:-1]
    x, y = coords[:, 0].copy(), coords[:, 1].copy()
    return np.stack([np.minimum.reduceat(x, starts), np.minimum.reduceat(y, starts),
                     np.maximum.reduceat(x, starts), np.maximum.reduceat(y, starts)], axis=1)


def bbox_pairs(ba: np.ndarray, bb: np.ndarray, bias: int = 0):
    """All (a, b) with overlapping bboxes, sorted by (a, b).

    B is bucketed by the grid cell of its bbox's lower-left corner (one entry per
    b); a's bbox meets b's only if that corner lies in a's bbox grown down and left
    by the largest bbox width/height, so each a scans those cells and no pair is
    found twice. overlay.cu's polygon_pairs does the same.
    """
    both = np.concatenate([ba, bb])
    world = np.r_[both[:, :2].min(0), both[:, 2:].max(0)]
    w, h = both[:, 2] - both[:, 0], both[:, 3] - both[:, 1]
    level = grid.grid_level(world, float(w.sum() / len(both)), float(h.sum() / len(both)), bias)
    sorted_b, cell_start = grid.bucket(grid.cell_of(bb[:, 0], bb[:, 1], world, level), level)
    grown = np.column_stack([ba[:, 0] - w.max(), ba[:, 1] - h.max(), ba[:, 2], ba[:, 3]])
    a_owner, cell = grid.covered_cells(grown, world, level)
    row, j = expand(cell_start[cell], cell_start[cell + 1] - cell_start[cell])
    a, b = np.take(a_owner, row), np.take(sorted_b, j)
    # Column by column with np.take, the tests in place (whole-row gathers took about three times as long).
    hit = np.take(np.ascontiguousarray(ba[:, 0]), a) <= np.take(np.ascontiguousarray(bb[:, 2]), b)
    hit &= np.take(np.ascontiguousarray(bb[:, 0]), b) <= np.take(np.ascontiguousarray(ba[:, 2]), a)
    hit &= np.take(np.ascontiguousarray(ba[:, 1]), a) <= np.take(np.ascontiguousarray(bb[:, 3]), b)
    hit &= np.take(np.ascontiguousarray(bb[:, 1]), b) <= np.take(np.ascontiguousarray(ba[:, 3]), a)
    kept = np.flatnonzero(hit)
    a, b = np.take(a, kept), np.take(b, kept)
    order = lex_order(b, a)
    return a[order], b[order], {"grid_level": level, "bbox_tests": int(len(hit))}


class OverlayCPU:
    device = "cpu"

    def __init__(self, version: str = "v1"):
        self.version = version

    def compile(self) -> dict:
        return {}

    @staticmethod
    def outputs_to_host(arrays) -> tuple:
        return tuple(np.asarray(a) for a in arrays)

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
            L["bbox_cols"] = tuple(np.ascontiguousarray(L["bbox"][:, k]) for k in range(4))   # for np.take
            L["xlo"], L["xhi"] = np.minimum(e.ax, e.bx), np.maximum(e.ax, e.bx)
            ring_edges = np.diff(L["ring_offsets"]) - 1
            L["ring_edge_offsets"] = np.concatenate([[0], np.cumsum(ring_edges)])
            L["edge_ring"] = np.repeat(np.arange(len(ring_edges)), ring_edges)
            # Twice each ring's signed area, relative to its first vertex (little cancellation).
            first = L["ring_edge_offsets"][:-1][L["edge_ring"]]
            cross = (e.ax - e.ax[first]) * (e.by - e.ay[first]) - (e.bx - e.ax[first]) * (e.ay - e.ay[first])
            L["ring_area2"] = np.bincount(L["edge_ring"], weights=cross, minlength=len(ring_edges))
            L["ring_box"] = np.stack([np.minimum.reduceat(L["xlo"], L["ring_edge_offsets"][:-1]),
                                      np.minimum.reduceat(e.ylo, L["ring_edge_offsets"][:-1]),
                                      np.maximum.reduceat(L["xhi"], L["ring_edge_offsets"][:-1]),
                                      np.maximum.reduceat(e.yhi, L["ring_edge_offsets"][:-1])], axis=1)
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
        near_a = _mbr_hits(A, ia, B, np.take(pb, pair_a))
        pair_a, ia = pair_a[near_a], ia[near_a]
        pair_b, jb = expand(B["edges"].geom_offsets[pb], eb)
        near_b = _mbr_hits(B, jb, A, np.take(pa, pair_b))
        pair_b, jb = pair_b[near_b], jb[near_b]
        if self.version == "v2":
            owner, i, j = _sweep_pairs(pair_a, ia, A["edges"].yhi[ia], pair_b, jb, B["edges"].ylo[jb], len(pa))
            examined = len(i)
            owner, i, j = _boxes_hit(A, B, owner, i, j)
        else:
            owner, i, j, examined = _all_near_edge_pairs(A, B, pair_a, ia, pair_b, jb, len(pa))
        state.update(pa=pa, pb=pb, ea=ea, eb=eb, seg_pair=owner, seg_i=i, seg_j=j)
        # Rows in: both layers' polygons, as the GPU backend counts them (the pairs are in the metadata).
        st.rows_in, st.rows_out = len(A["bbox"]) + len(B["bbox"]), len(i)
        st.meta.update(polygon_pairs=len(pa), pairs_examined=examined, candidates=len(i),
                       grid_level=info["grid_level"], bbox_tests=info["bbox_tests"])

    def exact_intersection_refine(self, state, st, tiling):
        Ea, Eb = state["a"]["edges"], state["b"]["edges"]
        p, i, j = state["seg_pair"], state["seg_i"], state["seg_j"]
        v3 = self.version == "v3"      # records say which splits flip the status
        # Every version marks touches at a segment's own end and keeps crossings that round to an end: a ring with
        # no record then meets the other boundary nowhere (see the module's docstring).
        r = classify_pairs(Ea.ax[i], Ea.ay[i], Ea.bx[i], Ea.by[i], Eb.ax[j], Eb.ay[j], Eb.bx[j], Eb.by[j], marks=True)
        # Slots: per pair, a's edges then b's edges, each at its local index.
        slot_base = np.cumsum(state["ea"] + state["eb"]) - (state["ea"] + state["eb"])
        slot_e = slot_base[p] + (i - Ea.geom_offsets[state["pa"][p]])
        slot_f = slot_base[p] + state["ea"][p] + (j - Eb.geom_offsets[state["pb"][p]])
        ev_slot = np.concatenate([slot_e, slot_e, slot_f, slot_f])
        ev_t = np.concatenate([r.e_t[:, 0], r.e_t[:, 1], r.f_t[:, 0], r.f_t[:, 1]])
        ok = ~np.isnan(ev_t)
        ov = np.flatnonzero(r.kind == OVERLAP)
        proper = r.kind == PROPER
        state["ev_flip"] = np.concatenate([proper, proper, proper, proper])[ok] if v3 else None
        state.update(ev_slot=ev_slot[ok], ev_t=ev_t[ok], slot_base=slot_base,
                     ov_slot=np.concatenate([slot_e[ov], slot_f[ov]]),
                     ov_lo=np.concatenate([r.e_ov[ov, 0], r.f_ov[ov, 0]]),
                     ov_hi=np.concatenate([r.e_ov[ov, 1], r.f_ov[ov, 1]]),
                     # A keeps a shared piece when both run the same way; B never does (no double count).
                     ov_keep=np.concatenate([r.same_dir[ov], np.zeros(len(ov), dtype=bool)]))
        t = ev_t[ok]
        splits = int(((t > 0.0) & (t < 1.0)).sum())       # the records strictly inside a segment
        st.rows_in, st.rows_out = len(p), int(ok.sum())
        st.meta.update(proper=int(proper.sum()), touch=int((r.kind == TOUCH).sum()),
                       collinear_overlap=int(len(ov)), ambiguous_pairs=int(r.ambiguous.sum()),
                       split_events=splits)
        if v3:
            st.meta["end_marks"] = int(ok.sum()) - splits     # (v1 and v2 mark the same; the GPU counts v3's)

    def reconstruction_event_sort(self, state, st, tiling):
        order = lex_order(state["ev_t"], state["ev_slot"])
        state["ev_slot"], state["ev_t"] = state["ev_slot"][order], state["ev_t"][order]
        if state["ev_flip"] is not None:
            state["ev_flip"] = state["ev_flip"][order]
        st.rows_in = st.rows_out = len(order)

    def area_reconstruction(self, state, st, tiling):
        A, B = state["a"], state["b"]
        pa, pb, ea = state["pa"], state["pb"], state["ea"]
        # Which (pair, side, ring) carry records (splits, marks) or shared pieces: only their edges
        # need cutting; every other ring meets the other polygon's boundary nowhere, and lies wholly
        # inside or wholly outside it, which one of its vertices decides.
        ev_pair, ev_is_a, ev_edge = _slot_edges(state, state["ev_slot"])
        ov_pair, ov_is_a, ov_edge = _slot_edges(state, state["ov_slot"])
        ring_a = [A["edge_ring"][ev_edge[ev_is_a]], A["edge_ring"][ov_edge[ov_is_a]]]
        ring_b = [B["edge_ring"][ev_edge[~ev_is_a]], B["edge_ring"][ov_edge[~ov_is_a]]]
        cut_a = np.unique(np.concatenate([_ring_key(ev_pair[ev_is_a], ring_a[0], A),
                                          _ring_key(ov_pair[ov_is_a], ring_a[1], A)]))
        cut_b = np.unique(np.concatenate([_ring_key(ev_pair[~ev_is_a], ring_b[0], B),
                                          _ring_key(ov_pair[~ov_is_a], ring_b[1], B)]))
        area2 = np.zeros(len(pa))
        pip_tests = 0
        fragments = kept = 0
        for side, L, O, geoms, other_geoms, cut in ((True, A, B, pa, pb, cut_a), (False, B, A, pb, pa, cut_b)):
            gro = L["geom_ring_offsets"]
            pair, ring = expand(gro[geoms], gro[geoms + 1] - gro[geoms])
            is_cut = _member(_ring_key(pair, ring, L), cut)
            # Whole rings: one vertex each (its first), if the ring reaches the other polygon's bbox at all.
            whole = np.flatnonzero(~is_cut & _boxes_meet(L["ring_box"][ring], O["bbox"][other_geoms[pair]]))
            e0 = L["ring_edge_offsets"][ring[whole]]
            E = L["edges"]
            inside, _, in_box = _classify_vertices(np.stack([E.ax[e0], E.ay[e0]], axis=1), O,
                                                   other_geoms[pair[whole]])
            # v3 counts the tests that ran (test points in the other polygon's bbox), as its GPU kernels do.
            pip_tests += int(in_box.sum()) if self.version == "v3" else len(whole)
            area2 += np.bincount(pair[whole[inside]], weights=L["ring_area2"][ring[whole[inside]]],
                                 minlength=len(pa))
            # Cut rings: every edge, split at its events. v1 and v2 decide each piece on its own; v3 carries the
            # inside/outside status along each ring (see _walk).
            cut_idx = np.flatnonzero(is_cut)
            ring_row, edge = expand(L["ring_edge_offsets"][ring[cut_idx]],
                                    np.diff(L["ring_edge_offsets"])[ring[cut_idx]])
            epair = pair[cut_idx][ring_row]
            if self.version != "v3":
                # An edge that misses the other polygon's bbox has no events and lies outside it.
                reach = _mbr_hits(L, edge, O, np.take(other_geoms, epair))
                epair, edge, ring_row = epair[reach], edge[reach], None
            local = edge - L["edges"].geom_offsets[geoms[epair]]
            slot = state["slot_base"][epair] + (local if side else ea[epair] + local)
            c2, nfrag, nkept, ntests = self._cut_pieces(state, L, O, slot, epair, edge, other_geoms, ring_row)
            area2 += c2
            fragments, kept, pip_tests = fragments + nfrag, kept + nkept, pip_tests + ntests
        area = 0.5 * area2
        pos = area > 0
        state["output"] = (pa[pos].astype(np.int32), pb[pos].astype(np.int32), area[pos])   # as the GPU's
        st.rows_in, st.rows_out = len(pa), int(pos.sum())
        st.meta.update(cut_rings=int(len(cut_a) + len(cut_b)), fragments=fragments, fragments_kept=kept,
                       pip_tests=pip_tests)

    def _cut_pieces(self, state, L, O, slot, epair, edge, other_geoms, ring_row=None):
        """Twice the shoelace sum per pair of the kept pieces of these edges (pair origin), the pieces made,
        kept, and the point-in-polygon tests run. With ``ring_row`` (v3: each edge's cut ring, every edge of
        it given) the pieces' status is carried along each ring (see _walk)."""
        A = state["a"]
        pa = state["pa"]
        E = L["edges"]
        n = len(slot)
        # Rows in slot order, so the events (sorted by slot, then t, in reconstruction_event_sort) come
        # out grouped by row and sorted within it, with no sort here. A pair's slots follow its polygons'
        # edges ring by ring, so this is also the order in which a walk along each ring meets them.
        by_slot = np.argsort(slot, kind="stable")
        slot, epair, edge = slot[by_slot], epair[by_slot], edge[by_slot]
        # Slot -> row of these edges (-1: not one of them). Slots are unique per side and dense, so one
        # table lookup replaces a hashed isin and a sorted search for events and shared pieces alike.
        ev_slot, ov_slot = state["ev_slot"], state["ov_slot"]
        row_of = np.full(max(slot.max(initial=-1), ev_slot.max(initial=-1), ov_slot.max(initial=-1)) + 1, -1,
                         dtype=np.int64)
        row_of[slot] = np.arange(n)
        # Piece bounds per row: 0, its split events in order (all within [0, 1]), then 1.
        ev_row = row_of[ev_slot]
        ev_sel = ev_row >= 0
        ev_row, ev_t = ev_row[ev_sel], state["ev_t"][ev_sel]
        ev_flip = state["ev_flip"][ev_sel] if ring_row is not None else None
        per_row = np.bincount(ev_row, minlength=n) + 2
        first = np.cumsum(per_row) - per_row
        f_row = np.repeat(np.arange(n), per_row)
        f_t = np.empty(len(f_row))
        f_t[first] = 0.0
        f_t[first + per_row - 1] = 1.0
        rank = np.arange(len(ev_row)) - (np.cumsum(per_row - 2) - (per_row - 2))[ev_row]
        ev_at = first[ev_row] + 1 + rank
        f_t[ev_at] = ev_t
        nxt = np.flatnonzero((f_row[1:] == f_row[:-1]) & (f_t[1:] > f_t[:-1]))   # a piece starts at each
        r, t0, t1 = f_row[nxt], f_t[nxt], f_t[nxt + 1]
        keep = np.zeros(len(r), dtype=bool)
        shared = np.zeros(len(r), dtype=bool)
        ov_row = row_of[ov_slot]
        ov = np.flatnonzero(ov_row >= 0)
        if len(ov):
            ov_row = ov_row[ov]
            o_order = np.argsort(ov_row, kind="stable")
            ov_row, ov = ov_row[o_order], ov[o_order]
            lo = np.searchsorted(ov_row, r, side="left")
            hi = np.searchsorted(ov_row, r, side="right")
            frag, k = expand(lo, hi - lo)
            k = ov[k]
            tm = 0.5 * (t0[frag] + t1[frag])
            on = (state["ov_lo"][k] <= tm) & (tm <= state["ov_hi"][k])
            shared[frag[on]] = True
            keep[frag[on & state["ov_keep"][k]]] = True

        def classify_piece_middles(q):
            e = edge[r[q]]
            return _classify_pieces(E, e, 0.5 * (t0[q] + t1[q]), O, other_geoms[epair[r[q]]])

        if ring_row is None:
            test = np.flatnonzero(~shared)
            keep[test] = classify_piece_middles(test)[0]
            tests = len(test)
        else:
            # Each record comes before the first piece that starts at or after it: records sit in f_t after the
            # row's 0 and before its 1, ties in any order, and a piece starts at the last of equal values.
            ev_before = np.searchsorted(nxt, ev_at, side="left")
            keep, tests = _walk(r, t0, t1, shared, keep, ring_row[by_slot], ev_before, ev_flip,
                                classify_piece_middles)
        k = np.flatnonzero(keep)
        e, pair = edge[r[k]], epair[r[k]]
        # The shoelace's origin: the middle of the overlap of the pair's bboxes, where the kept pieces lie (the
        # middle of a's bbox, 20 km from a 1 m^2 b on a's edge, cost each term ulps of 4e8 m^2: 1e-7 of its area).
        ba, bb = A["bbox"][pa[pair]], state["b"]["bbox"][state["pb"][pair]]
        ox = 0.5 * (np.maximum(ba[:, 0], bb[:, 0]) + np.minimum(ba[:, 2], bb[:, 2]))
        oy = 0.5 * (np.maximum(ba[:, 1], bb[:, 1]) + np.minimum(ba[:, 3], bb[:, 3]))
        px0, py0 = _point_at(E.ax[e], E.ay[e], E.bx[e], E.by[e], t0[k])
        px1, py1 = _point_at(E.ax[e], E.ay[e], E.bx[e], E.by[e], t1[k])
        cross = (px0 - ox) * (py1 - oy) - (px1 - ox) * (py0 - oy)
        return np.bincount(pair, weights=cross, minlength=len(pa)), len(r), len(k), tests


# A piece's test carries its status along the ring only from a piece at least this share of its edge long and
# off the other boundary: the test is exact for the piece's middle point, but a piece a few ulps long may have
# its bounds a few ulps off, and its middle outside the piece it stands for (overlay_v3.cu's TRUST_T).
TRUST_T = 1e-6


def _walk(r, t0, t1, shared, keep, ring_of_row, before, flip, classify_piece_middles):
    """v3's pieces kept or not with the inside/outside status carried along each ring, as overlay_v3.cu's
    area_cut_rings walks it: a proper crossing flips the status; a touch or a mark at a segment's end, a shared
    piece, or a test of a piece's middle point that cannot be trusted makes it unknown, and the next piece is
    tested by its middle point (classify_piece_middles; outside the other polygon's box: outside, and trusted).
    Pieces are (row r, t0, t1), sorted by row then t, rows in walk order; each record comes ``before`` a piece
    (the first that starts at or after its t; for t = 1 the next row's first; len(r): none) and is a proper
    crossing where ``flip``. Returns (keep, point-in-polygon tests run).

    Vectorised: the pieces whose status is unknown are found first (ring starts, after a touch or a shared
    piece), tested, and the piece after each untrusted test joins them, until none is left; every other piece
    takes the status of the last tested piece before it, flipped once for each proper crossing in between."""
    n = len(r)
    if n == 0:
        return keep, 0
    flips = np.bincount(before[flip], minlength=n + 1)[:n]
    reset = np.bincount(before[~flip], minlength=n + 1)[:n] > 0
    ring = ring_of_row[r]
    start = np.r_[True, ring[1:] != ring[:-1]]
    unknown = start | reset | np.r_[False, shared[:-1]]   # a shared piece leaves the status unknown
    tested = np.zeros(n, dtype=bool)
    result = np.zeros(n, dtype=bool)
    tests = 0
    todo = np.flatnonzero(unknown & ~shared)
    while len(todo):
        inside, on_boundary, in_box = classify_piece_middles(todo)
        tested[todo], result[todo] = True, inside
        tests += int(in_box.sum())                          # outside the box no edge is tested
        trusted = ~in_box | (~on_boundary & (t1[todo] - t0[todo] >= TRUST_T))
        nxt = todo[~trusted] + 1                            # an untrusted test leaves the next piece unknown
        nxt = nxt[nxt < n]
        todo = np.unique(nxt[~start[nxt] & ~shared[nxt] & ~tested[nxt]])
    anchor = np.maximum.accumulate(np.where(tested, np.arange(n), -1))
    crossed = np.cumsum(flips)
    carried = ~shared & ~tested & (anchor >= 0)
    a = anchor[carried]
    keep = keep.copy()
    keep[tested] = result[tested]
    keep[carried] = result[a] ^ ((crossed[carried] - crossed[a]) % 2).astype(bool)
    return keep, tests


def _boxes_hit(A, B, owner, i, j):
    """The (owner, i, j) whose edges' bboxes meet: column gathers with np.take (half the time of fancy indexing on
    these sizes), tests in place, pip.CHUNK_EDGE_TESTS at a time (each pass in cache)."""
    Ea, Eb = A["edges"], B["edges"]
    hit = np.empty(len(i), dtype=bool)
    step = pip.CHUNK_EDGE_TESTS
    for s in range(0, len(i), step):
        ic, jc, h = i[s:s + step], j[s:s + step], hit[s:s + step]
        np.less_equal(np.take(A["xlo"], ic), np.take(B["xhi"], jc), out=h)
        h &= np.take(B["xlo"], jc) <= np.take(A["xhi"], ic)
        h &= np.take(Ea.ylo, ic) <= np.take(Eb.yhi, jc)
        h &= np.take(Eb.ylo, jc) <= np.take(Ea.yhi, ic)
    kept = np.flatnonzero(hit)
    return np.take(owner, kept), np.take(i, kept), np.take(j, kept)


def _all_near_edge_pairs(A, B, pair_a, ia, pair_b, jb, n_pairs):
    """v1's brute force within each pair: every near edge of a x every near edge of b, the ones whose bboxes meet
    kept. Returns (pair, i, j, pairs examined). Built and tested a run of pairs at a time (about
    pip.CHUNK_EDGE_TESTS edge pairs), so each pass stays in cache: 3.1M edge pairs at 30k x 30k."""
    na = np.bincount(pair_a, minlength=n_pairs)
    nb = np.bincount(pair_b, minlength=n_pairs)
    a_start = np.cumsum(na) - na
    b_start = np.cumsum(nb) - nb
    per_pair = na * nb
    cum = np.cumsum(per_pair)
    parts, start = [], 0
    while start < n_pairs:
        base = cum[start - 1] if start else 0
        stop = max(start + 1, int(np.searchsorted(cum, base + pip.CHUNK_EDGE_TESTS, side="right")))
        owner, k = expand(np.zeros(stop - start, dtype=np.int64), per_pair[start:stop])
        owner += start
        q, r = np.divmod(k, np.take(nb, owner))
        i = np.take(ia, np.take(a_start, owner) + q)
        j = np.take(jb, np.take(b_start, owner) + r)
        parts.append(_boxes_hit(A, B, owner, i, j))
        start = stop
    if not parts:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty, 0
    return (*(np.concatenate(c) for c in zip(*parts)), int(cum[-1]) if len(cum) else 0)


def _sweep_pairs(pair_a, ia, a_yhi, pair_b, jb, b_ylo, n_pairs):
    """v2's sort-and-sweep: per pair, b's near edges sorted by lowest y; each near edge of a
    gets the prefix whose lowest y is <= its highest y (ties included). Returns (pair, i, j)."""
    # One merged order per pair by y, b before a on ties: an a-edge's prefix length is
    # the number of b-edges of its pair that precede it. The b rows come first and the order is
    # stable, so equal y keeps b ahead of a.
    pair = np.concatenate([pair_b, pair_a])
    y = np.concatenate([b_ylo, a_yhi])
    is_a = np.concatenate([np.zeros(len(pair_b), dtype=bool), np.ones(len(pair_a), dtype=bool)])
    order = lex_order(y, pair)
    pair_s, is_a_s = pair[order], is_a[order]
    b_seen = np.cumsum(~is_a_s)
    nb = np.bincount(pair_b, minlength=n_pairs)
    b_start = np.cumsum(nb) - nb
    before_group = np.concatenate([[0], np.cumsum(nb)])[pair_s]
    a_rows = np.flatnonzero(is_a_s)
    prefix = b_seen[a_rows] - before_group[a_rows]
    a_idx = order[a_rows] - len(pair_b)                      # back to the a-edge arrays
    b_sorted = jb[lex_order(b_ylo, pair_b)]
    owner, k = expand(b_start[pair_a[a_idx]], prefix)
    return pair_a[a_idx][owner], ia[a_idx][owner], b_sorted[k]


def _classify_pieces(E, e, tm, O, geoms):
    """As _classify_vertices for the exact points at tm on edges e of E (each piece's middle): inside, on the
    boundary, in the bbox grown by the rounding bound of the point (the exact point may be in it when the rounded
    one is just outside). overlay_exact.cu's piece_inside does the same."""
    x0, y0, x1, y1 = E.ax[e], E.ay[e], E.bx[e], E.by[e]
    mx, my, dx, dy = segment_points(x0, y0, x1, y1, tm)
    box = O["bbox"][geoms]
    in_box = ((box[:, 0] - dx <= mx) & (mx <= box[:, 2] + dx) & (box[:, 1] - dy <= my) & (my <= box[:, 3] + dy))
    near = np.flatnonzero(in_box)
    inside = np.zeros(len(e), dtype=bool)
    on_boundary = np.zeros(len(e), dtype=bool)
    parity, boundary, _ = classify_segment_points(x0[near], y0[near], x1[near], y1[near], tm[near], O["edges"],
                                                  geoms[near], (mx[near], my[near], dx[near], dy[near]))
    inside[near] = parity & ~boundary
    on_boundary[near] = boundary
    return inside, on_boundary, in_box


def _classify_vertices(points, O, geoms):
    """(strictly inside polygon geoms[i] of layer O, on its boundary, in its bbox) of input points (the first
    vertex of each ring with no record): a point outside the bbox skips the edge loop (outside, not on the
    boundary)."""
    box = O["bbox"][geoms]
    in_box = ((box[:, 0] <= points[:, 0]) & (points[:, 0] <= box[:, 2])
              & (box[:, 1] <= points[:, 1]) & (points[:, 1] <= box[:, 3]))
    near = np.flatnonzero(in_box)
    inside = np.zeros(len(points), dtype=bool)
    on_boundary = np.zeros(len(points), dtype=bool)
    parity, boundary, _, _ = classify(points, O["edges"], near, geoms[near])
    inside[near] = parity & ~boundary
    on_boundary[near] = boundary
    return inside, on_boundary, in_box


def _slot_edges(state, slots):
    """(pair, is_a, global edge) of edge slots."""
    starts = state["slot_base"]
    pair = np.searchsorted(starts, slots, side="right") - 1
    local = slots - starts[pair]
    is_a = local < state["ea"][pair]
    edge = np.where(is_a, state["a"]["edges"].geom_offsets[state["pa"][pair]] + local,
                    state["b"]["edges"].geom_offsets[state["pb"][pair]] + local - state["ea"][pair])
    return pair, is_a, edge


def _member(keys, sorted_unique):
    """np.isin for a sorted, unique table: a binary search each, no hashing of either side."""
    at = np.minimum(np.searchsorted(sorted_unique, keys), max(len(sorted_unique) - 1, 0))
    return sorted_unique[at] == keys if len(sorted_unique) else np.zeros(len(keys), dtype=bool)


def _ring_key(pair, ring, L):
    return pair.astype(np.int64) * (len(L["ring_area2"]) + 1) + ring


def _boxes_meet(p, q):
    return (p[:, 0] <= q[:, 2]) & (q[:, 0] <= p[:, 2]) & (p[:, 1] <= q[:, 3]) & (q[:, 1] <= p[:, 3])


def _mbr_hits(L, e, O, geoms):
    """Which edges e of layer L reach the bbox of layer O's polygon geoms (one each). Columns gathered with
    np.take: gathering whole bbox rows and comparing strided columns took about three times as long."""
    E = L["edges"]
    x0, y0, x1, y1 = (np.take(c, geoms) for c in O["bbox_cols"])
    hit = np.take(L["xlo"], e) <= x1
    hit &= x0 <= np.take(L["xhi"], e)
    hit &= np.take(E.ylo, e) <= y1
    hit &= y0 <= np.take(E.yhi, e)
    return hit


def _point_at(x0, y0, x1, y1, t):
    """The point at parameter t; t = 0 and t = 1 give the endpoints exactly."""
    return (np.where(t == 1.0, x1, x0 + t * (x1 - x0)), np.where(t == 1.0, y1, y0 + t * (y1 - y0)))
