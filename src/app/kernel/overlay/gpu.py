"""The overlay's stages on the GPU: CuPy plus the RawKernels of overlay.cu and overlay_v3.cu.

Device->host reads inside the pipeline are allocation-size reads only, both in the
filter: the polygon-pair total (the grid it buckets by is chosen on the device, and
its level comes back with this read), then the candidate-pair total (v1, v2) or the
check of the candidates' room (v3). The output's length is read after the last launch
(the output is written into columns as long as the polygon pairs), and the refine's
counters come back with it.

v3 keeps v1's stages with two kernels changed. The edge-pair filter gives each polygon
pair a warp whose lanes hold a's edges, and broadcasts b's near edges to them by
shuffles (v1's tests and candidates, with no lane looping over b on its own); it writes
the candidates in one pass into buffers with a room kept from run to run, so v1's count
pass goes, and its read comes after the pass to check the room (a pass that overflowed
runs again in a grown room, and the filter's metadata says so). Area
reconstruction walks each cut ring carrying its inside/outside status: refine records
which splits are proper crossings (the status flips there) and marks touches at a
segment's own ends (the status is unknown past them), so a point-in-polygon test is
needed only where the status is unknown -- about one a cut ring instead of one a piece.
On the CPU, v3 finds v1's candidates and carries the status along each ring the same way
(cpu.py's _walk: the same pieces, kept pieces and point-in-polygon tests, tested).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from app.kernel import grid
from app.kernel.gpu_build import GpuBackend
from app.kernel.robust import CCW_ERRBOUND_A

SOURCE = (Path(__file__).with_name("overlay.cu"), Path(__file__).with_name("overlay_v3.cu"))
# overlay.cu's PAIR_STASH: b's each a keeps from polygon_pairs' count pass (an a with more is tested again).
PAIR_STASH = 16
# The filter's ledger, 64-bit words the host reads once: common.cuh's GridParams (ox, oy, sx, sy as fp64 bits, level,
# shift, cells, table length), then polygon_pairs' counters (bbox tests, pairs, a's tested twice).
GRID = slice(0, 8)
TABLE = slice(7, 8)
PAIR_STATS = slice(8, 11)
LEDGER_WORDS = 11
# v3's first candidate room: 8 edge pairs a polygon pair (random layers find about 4.5).
MIN_ROOM_PER_PAIR = 8
MIN_ROOM = 4096
# v3's walk of the cut rings: a fixed grid of this many blocks a multiprocessor (each holds one or two at 128
# registers a thread), striding over the list.
WALK_BLOCKS_PER_SM = 4
# refine_pairs' counters: proper, touch, collinear overlap, ambiguous pairs, split events, v3's end marks.
REFINE_STATS = 6
OVERLAPS = slice(2, 3)
STAGE_KERNELS = {
    "segment_extraction": ("init_summary", "polygon_bounds", "ring_tables"),
    "segment_mbr_filter": ("grid_zero", "corner_cells", "corner_scatter", "polygon_pairs", "sort_pairs",
                           "edge_pairs", "edge_pairs_sweep", "edge_pairs_warp", "pair_slots"),
    "exact_intersection_refine": ("refine_pairs",),
    "reconstruction_event_sort": ("slot_count", "overlap_table", "slot_scatter", "slot_sort"),
    "area_reconstruction": ("area_rings", "area_rings_flip", "area_cut_rings", "pair_area", "emit_areas"),
}
LIBRARY_CALLS = {
    "owned_buffer_build": "cudaMemcpyAsync (H2D copies: pinned staging from 16 MiB, else cupy.asarray)",
    "segment_mbr_filter": "cupy.zeros (candidate stats)",
    "exact_intersection_refine": "cupy.zeros (stats)",
    "reconstruction_event_sort": "cupy.zeros (slot counts)",
    "area_reconstruction": "cupy.zeros (stats), cupy.concatenate (one read)",
}


class OverlayGPU(GpuBackend):
    SOURCE, STAGE_KERNELS, LIBRARY_CALLS = SOURCE, STAGE_KERNELS, LIBRARY_CALLS
    SCAN_STAGES = ("segment_mbr_filter", "reconstruction_event_sort", "area_reconstruction")

    def __init__(self, tiling: dict, version: str = "v1"):
        super().__init__(tiling, version)
        self._room: int | None = None     # v3: candidate edge pairs the buffers hold, kept from run to run
        self.sm_count = self.cp.cuda.Device().attributes["MultiProcessorCount"]

    def owned_buffer_build(self, state, st, tiling):
        inp = state["inputs"]
        layers = (("a", inp.left), ("b", inp.right))
        if max(layer.n_coords for _, layer in layers) >= 2**31:
            raise ValueError("more than 2^31 vertices in a layer: the int32 offsets would overflow")
        dev = self.stage_in(st, **{f"{what}_{side}": (getattr(layer, what), dtype) for side, layer in layers
                                   for what, dtype in (("coords", np.float64), ("ring_offsets", np.int32),
                                                       ("geom_ring_offsets", np.int32))})
        for side, layer in layers:
            ro, gro = dev[f"ring_offsets_{side}"], dev[f"geom_ring_offsets_{side}"]
            state[side] = {"coords": dev[f"coords_{side}"],
                           "ring_offsets": ro, "geom_ring_offsets": gro,
                           "n_geoms": layer.n_geoms, "n_rings": layer.n_rings,
                           "max_rings": int(np.diff(layer.geom_ring_offsets).max())}
        st.rows_in = st.rows_out = inp.left.n_geoms + inp.right.n_geoms
        st.meta.update(left=inp.left.n_geoms, right=inp.right.n_geoms,
                       vertices=inp.left.n_coords + inp.right.n_coords,
                       owned_bytes=int(inp.left.nbytes() + inp.right.nbytes()))

    def segment_extraction(self, state, st, tiling):
        cp, ws, block = self.cp, self.mod.ws, tiling["block"]
        summary = ws.empty("summary", 8, cp.float64)
        self.mod.fn["init_summary"]((1,), (32,), (summary,))
        for side in ("a", "b"):
            L = state[side]
            g, r = L["n_geoms"], L["n_rings"]
            L["bbox"] = ws.empty(f"bbox_{side}", (g, 4), cp.float64)
            self._launch("polygon_bounds", g, block, (L["coords"], L["ring_offsets"], L["geom_ring_offsets"],
                                                      np.int64(g), L["bbox"], summary))
            L["ring_area2"] = ws.empty(f"ring_area2_{side}", r, cp.float64)
            L["ring_box"] = ws.empty(f"ring_box_{side}", (r, 4), cp.float64)
            self._launch("ring_tables", r, block, (L["coords"], L["ring_offsets"], np.int32(r), L["ring_area2"],
                                                   L["ring_box"]))
        state["summary"] = summary      # the filter chooses its grid from it on the device
        g_all = state["a"]["n_geoms"] + state["b"]["n_geoms"]
        n_edges = sum(int(state[s]["coords"].shape[0] - state[s]["n_rings"]) for s in ("a", "b"))
        st.rows_in, st.rows_out = g_all, n_edges
        st.meta.update(segments_left=int(state["a"]["coords"].shape[0] - state["a"]["n_rings"]),
                       segments_right=int(state["b"]["coords"].shape[0] - state["b"]["n_rings"]))

    def segment_mbr_filter(self, state, st, tiling):
        cp, ws, block = self.cp, self.mod.ws, tiling["block"]
        A, B = state["a"], state["b"]
        ga, gb = A["n_geoms"], B["n_geoms"]
        # The grid (as grid.grid_level and grid.world_scale would choose it from the world box) is chosen on the
        # device, its cell table zeroed and the pair counters with it, in one launch: a table for the largest
        # level, of which the kernels use the real length. Reading the world box to choose it on the host
        # stopped the GPU for about 145 us at 100k x 100k on an H200 (the read, then the launches after it).
        ledger = ws.empty("ledger", LEDGER_WORDS, cp.uint64)
        gp, pstats = ledger[GRID], ledger[PAIR_STATS]
        counts = ws.empty("corner_counts_max", (1 << 2 * grid.MAX_LEVEL) + 1, cp.int32)
        self.mod.fn["grid_zero"]((4 * self.sm_count,), (256,), (
            state["summary"], np.int64(ga + gb), np.int32(tiling["level_bias"]), np.int32(grid.MAX_LEVEL), gp, counts,
            pstats, np.int64(2 * pstats.size)))
        # B bucketed by the cell of its bbox's lower-left corner.
        cell = ws.empty("corner_cell", gb, cp.uint32)
        slot = ws.empty("corner_slot", gb, cp.int32)
        self._launch("corner_cells", gb, block, (B["bbox"], np.int32(gb), gp, cell, slot, counts))
        cell_start = self.mod.inclusive_scan(counts, cp.int32, "corner_start", n_dev=ledger[TABLE])
        sorted_b = ws.empty("sorted_b", gb, cp.int32)
        self._launch("corner_scatter", gb, block, (cell, slot, np.int32(gb), cell_start, sorted_b))
        # Polygon pairs: count (keeping each a's first PAIR_STASH b's), scan, read, place them in a-major order,
        # order each a's b's. Only a's with more pairs than that are tested again, in an emit pass.
        pcounts = ws.empty("pair_counts", ga, cp.int64)
        stash = ws.empty("pair_stash", ga * PAIR_STASH, cp.int32)
        common = (A["bbox"], np.int32(ga), B["bbox"], state["summary"], gp, cell_start, sorted_b)
        null = np.intp(0)
        self._launch("polygon_pairs", 32 * ga, block, common + (pcounts, null, null, stash, pstats))
        poffsets = self.mod.inclusive_scan(pcounts, cp.int64, "pair_offsets")
        words = st.read_size(ledger, "grid and polygon pairs -> buffer size")
        level = int(words[GRID][4])
        bbox_tests, npairs, crowded = (int(v) for v in words[PAIR_STATS])
        pair_a = ws.empty("pair_a", npairs, cp.int32)
        pair_b = ws.empty("pair_b", npairs, cp.int32)
        if crowded:
            self._launch("polygon_pairs", 32 * ga, block, common + (pcounts, poffsets, pair_b, stash, pstats))
        self._launch("sort_pairs", ga, block, (poffsets, np.int32(ga), stash, pair_a, pair_b))
        geo = (A["coords"], A["ring_offsets"], A["geom_ring_offsets"], A["bbox"],
               B["coords"], B["ring_offsets"], B["geom_ring_offsets"], B["bbox"], pair_a, pair_b, np.int32(npairs))
        if self.version == "v3":
            tests, c, n_slots, slot_incl, cand = self._edge_pairs_in_room(st, geo, npairs, block)
        else:
            tests, c, n_slots, slot_incl, cand = self._edge_pairs_counted(st, geo, npairs, block)
        state.update(level=level, pair_a=pair_a, pair_b=pair_b, slot_incl=slot_incl, n_slots=n_slots, cand=cand)
        st.rows_in, st.rows_out = ga + gb, c
        st.meta.update(polygon_pairs=npairs, pairs_examined=tests, candidates=c, grid_level=level,
                       bbox_tests=bbox_tests, polygons_tested_twice=crowded)

    def _edge_pairs_counted(self, st, geo, npairs, block):
        """v1, v2: edge pairs of each polygon pair counted (with the pair's slots), scanned, read, then emitted."""
        cp, ws, null = self.cp, self.mod.ws, np.intp(0)
        ecounts = ws.empty("edge_counts", npairs, cp.int64)
        slots = ws.empty("pair_slots", npairs, cp.int64)
        estats = ws.zeros("edge_stats", 2, cp.uint64)
        # v2's sweep keeps 8 warps' edge lists in shared memory: its block is fixed at 256.
        kernel, eblock = ("edge_pairs_sweep", 256) if self.version == "v2" else ("edge_pairs", block)
        self._launch(kernel, 32 * npairs, eblock, geo + (ecounts, slots, null, null, null, null, estats))
        eoffsets = self.mod.inclusive_scan(ecounts, cp.int64, "edge_offsets")
        slot_incl = self.mod.inclusive_scan(slots, cp.int64, "slot_incl")
        tail = slot_incl[-1:] if npairs else cp.zeros(1, dtype=cp.int64)
        tests, c, n_slots = (int(v) for v in st.read_size(cp.concatenate([estats.view(cp.int64), tail]),
                                                           "candidate edge pairs -> buffer size"))
        _check_int32(c, n_slots)
        cand = [ws.empty(f"cand_{k}", c, cp.int32) for k in ("p", "ka", "kb")]
        self._launch(kernel, 32 * npairs, eblock, geo + (ecounts, slots, eoffsets, *cand, estats))
        return tests, c, n_slots, slot_incl, cand

    def _edge_pairs_in_room(self, st, geo, npairs, block):
        """v3: edge pairs found and written in one pass into buffers with a room kept from run to run; the
        read after it checks the room. Candidates past it grow the room and the pass runs again, in this same
        run (the stage's metadata says so): v1's count pass and its scan are gone."""
        cp, ws = self.cp, self.mod.ws
        pair_a, pair_b = geo[8], geo[9]
        slots = ws.empty("pair_slots", npairs, cp.int64)
        self._launch("pair_slots", npairs, block, (geo[1], geo[2], geo[5], geo[6], pair_a, pair_b, np.int32(npairs),
                                                   slots))
        slot_incl = self.mod.inclusive_scan(slots, cp.int64, "slot_incl")
        tail = slot_incl[-1:] if npairs else cp.zeros(1, dtype=cp.int64)
        room = self._room or max(MIN_ROOM_PER_PAIR * npairs, MIN_ROOM)
        while True:
            cand = [ws.empty(f"cand_{k}", room, cp.int32) for k in ("p", "ka", "kb")]
            estats = ws.zeros("edge_stats", 2, cp.uint64)
            self._launch("edge_pairs_warp", 32 * npairs, block, geo + (np.int64(room), *cand, estats))
            tests, c, n_slots = (int(v) for v in st.read_size(cp.concatenate([estats.view(cp.int64), tail]),
                                                               "candidate edge pairs -> room check"))
            _check_int32(c, n_slots)
            if c <= room:
                break
            room = c + c // 4 + MIN_ROOM
            st.meta["candidate_room_grown"] = room
        self._room = room
        st.meta["candidate_room"] = room
        return tests, c, n_slots, slot_incl, [x[:c] for x in cand]

    def exact_intersection_refine(self, state, st, tiling):
        cp, ws = self.cp, self.mod.ws
        A, B = state["a"], state["b"]
        c = len(state["cand"][0])
        ev_slot, ev_t = ws.empty("ev_slot", 4 * c, cp.int32), ws.empty("ev_t", 4 * c, cp.float64)
        ov_slot, ov_lo = ws.empty("ov_slot", 2 * c, cp.int32), ws.empty("ov_lo", 2 * c, cp.float64)
        ov_hi, ov_keep = ws.empty("ov_hi", 2 * c, cp.float64), ws.empty("ov_keep", 2 * c, cp.int32)
        # v3 also records whether each split is a proper crossing, and marks touches at segment ends.
        ev_kind = ws.empty("ev_kind", 4 * c, cp.int8) if self.version == "v3" else None
        stats = ws.zeros("refine_stats", REFINE_STATS, cp.uint64)
        self._launch("refine_pairs", c, tiling["block"], (
            A["coords"], A["geom_ring_offsets"], A["ring_offsets"], B["coords"], B["geom_ring_offsets"],
            B["ring_offsets"], state["pair_a"], state["pair_b"], state["slot_incl"], *state["cand"], np.int32(c),
            CCW_ERRBOUND_A, ev_slot, ev_t, ov_slot, ov_lo, ov_hi, ov_keep,
            np.intp(0) if ev_kind is None else ev_kind, stats))
        # Counters come back with the final read (area_reconstruction fills rows_out and meta).
        state.update(ev=(ev_slot, ev_t), ev_kind=ev_kind, ov=(ov_slot, ov_lo, ov_hi, ov_keep), refine_stats=stats,
                     refine_st=st)
        st.rows_in = c

    def reconstruction_event_sort(self, state, st, tiling):
        n_slots, block = state["n_slots"], tiling["block"]
        ev_slot, ev_t = state["ev"]
        ov_slot, ov_lo = state["ov"][0], state["ov"][1]
        state["ev_start"], state["ev_order"] = self._by_slot("ev", ev_slot, ev_t, n_slots, block)
        overlaps = state["refine_stats"][OVERLAPS]      # refine's count of collinear overlaps, on the device
        state["ov_start"], state["ov_order"] = self._by_slot("ov", ov_slot, ov_lo, n_slots, block, overlaps)
        state["sort_st"] = st   # rows (split events) arrive with the final read, like refine's counters

    def _by_slot(self, tag, slot, key, n_slots, block, sources=None):
        """Counting sort of records by slot, then each slot's records by key. ``sources``, a device word
        counting what writes the records: where it is zero, overlap_table zeroes the slot table and the scan
        covers nothing (the host never reads it)."""
        cp, ws = self.cp, self.mod.ws
        n = len(slot)
        rank = ws.empty(f"{tag}_rank", n, cp.int32)
        counts = ws.zeros(f"{tag}_counts", n_slots + 1, cp.int32)
        self._launch("slot_count", n, block, (slot, np.int64(n), rank, counts))
        scan_len = None
        if sources is not None:       # the table the scan below writes: the workspace array under its tag
            scan_len = ws.empty(f"{tag}_scan_len", 1, cp.int64)
            self._launch("overlap_table", (n_slots + 4) // 4, block, (sources, np.int64(n_slots), scan_len,
                                                                      ws.empty(f"{tag}_start", n_slots + 1, cp.int32)))
        start = self.mod.inclusive_scan(counts, cp.int32, f"{tag}_start", n_dev=scan_len)
        order = ws.empty(f"{tag}_order", n, cp.int32)
        self._launch("slot_scatter", n, block, (slot, rank, np.int64(n), start, order))
        self._launch("slot_sort", n, block, (slot, rank, np.int64(n), start, key, order))
        return start, order

    def area_reconstruction(self, state, st, tiling):
        cp, ws, block = self.cp, self.mod.ws, tiling["block"]
        A, B = state["a"], state["b"]
        npairs = len(state["pair_a"])
        max_rings = max(A["max_rings"], B["max_rings"])
        contrib = ws.empty("contrib", npairs * 2 * max_rings, cp.float64)
        stats = ws.zeros("area_stats", 4, cp.uint64)
        side_a = (A["coords"], A["ring_offsets"], A["geom_ring_offsets"], A["bbox"])
        side_b = (B["coords"], B["ring_offsets"], B["geom_ring_offsets"], B["bbox"])
        pairs = (state["pair_a"], state["pair_b"])
        overlaps = (state["ov_start"], state["ov_order"], state["ov"][1], state["ov"][2], state["ov"][3])
        if state["ev_kind"] is None:
            self._launch("area_rings", npairs * 2 * max_rings, block, (
                *side_a, A["ring_area2"], A["ring_box"], *side_b, B["ring_area2"], B["ring_box"], *pairs,
                np.int32(npairs), np.int32(max_rings), state["slot_incl"], state["ev_start"], state["ev_order"],
                state["ev"][1], *overlaps, CCW_ERRBOUND_A, contrib, stats))
        else:
            # v3: uncut rings settled by one midpoint test each, cut rings listed, then walked 32 to a warp
            # carrying their inside/outside status (flipped at proper crossings). The walk's grid is fixed:
            # its threads stride over the list, whose length only the device knows.
            cut_list = ws.empty("cut_list", npairs * 2 * max_rings, cp.int64)
            self._launch("area_rings_flip", npairs * 2 * max_rings, block, (
                *side_a, A["ring_area2"], A["ring_box"], *side_b, B["ring_area2"], B["ring_box"], *pairs,
                np.int32(npairs), np.int32(max_rings), state["slot_incl"], state["ev_start"], state["ov_start"],
                CCW_ERRBOUND_A, contrib, cut_list, stats))
            if npairs:
                self.mod.fn["area_cut_rings"]((WALK_BLOCKS_PER_SM * self.sm_count,), (block,), (
                    *side_a, *side_b, *pairs, np.int32(max_rings), state["slot_incl"], state["ev_start"],
                    state["ev_order"], state["ev"][1], state["ev_kind"], *overlaps, CCW_ERRBOUND_A, cut_list, contrib,
                    stats))
        area = ws.empty("pair_area", npairs, cp.float64)
        keep = ws.empty("pair_keep", npairs, cp.int32)
        self._launch("pair_area", npairs, block, (contrib, np.int32(npairs), np.int32(max_rings), area, keep))
        incl = self.mod.inclusive_scan(keep, cp.int64, "keep_incl")
        tail = incl[-1:] if npairs else cp.zeros(1, dtype=cp.int64)
        # The output is written before its length is read, into columns as long as the polygon pairs (the
        # most it can be) and cut to length after: the read comes after the last launch, so the GPU does not
        # wait for the host to read the length and launch once more (about 45 us at 100k x 100k on an H200).
        out = tuple(cp.empty(npairs, dtype=t) for t in (cp.int64, cp.int64, cp.float64))   # the caller's: fresh
        self._launch("emit_areas", npairs, block, (keep, incl, np.int32(npairs), state["pair_a"], state["pair_b"],
                                                   area, *out))
        vals = st.read_result_size(cp.concatenate([tail, state["refine_stats"].view(cp.int64), stats.view(cp.int64)]),
                                   "output pairs -> output size")
        h = int(vals[0])
        state["output"] = tuple(col[:h] for col in out)
        st.later(lambda: self._count_rows(state, st, vals, npairs))

    def _count_rows(self, state, st, vals, npairs):
        """The refine's and this stage's counters, read with the output size, into the stages' rows and
        metadata (after the clock: see StageContext.later)."""
        h = int(vals[0])
        proper, touch, overlap, amb, events, marks = (int(v) for v in vals[1:1 + REFINE_STATS])
        refine = state["refine_st"]
        refine.rows_out = events + marks
        state["sort_st"].rows_in = state["sort_st"].rows_out = events + marks
        refine.meta.update(proper=proper, touch=touch, collinear_overlap=overlap, ambiguous_pairs=amb,
                           split_events=events)
        if state["ev_kind"] is not None:
            refine.meta["end_marks"] = marks
        pip, pieces, kept, cut = (int(v) for v in vals[1 + REFINE_STATS:5 + REFINE_STATS])
        st.rows_in, st.rows_out = npairs, h
        st.meta.update(cut_rings=cut, fragments=pieces, fragments_kept=kept, pip_tests=pip)


def _check_int32(candidates: int, slots: int) -> None:
    if candidates >= 2**31 or slots >= 2**31:
        raise ValueError(f"{candidates} candidate edge pairs / {slots} edge slots exceed int32 indexing")
