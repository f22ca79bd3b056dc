"""The overlay's stages on the GPU: CuPy plus the RawKernels of overlay.cu, overlay_exact.cu, overlay_area.cu,
overlay_v3.cu and overlay_v4.cu.

Every counter of a run lands in one device array, the run's ledger (the grid the filter
buckets by, chosen on the device, then the filter's, refine's and area's counters), which
the filter's first launch zeroes (grid_zero; in v3, corner_cells_grid); the host reads it
once, after the last launch, with the output's length (the output is written into
columns as long as the polygon pairs and cut to length after).

v1 and v2 also read two allocation sizes mid-run, both in the filter: the polygon-pair
total, then the candidate-pair total. Each read stops the host until the GPU has caught
up, and then the GPU waits for the host's next launches.

v3 reads no size before the end. Its polygon pairs, candidate edge pairs and edge slots
live in buffers with rooms the backend keeps from run to run, and its kernels read the
live counts from the ledger (common.cuh's live_count). The read at the end checks the
rooms; where a count did not fit, the room grows and the filter, refine, sort and area
stages run again within that same run (the area stage's metadata says so). The plan can
therefore be captured as one CUDA graph that replays new data with the same numbers of polygons, rings and
vertices, written into the buffers it was captured with, while the counts the device finds fit the rooms.
A v3 run also leaves the filter's cell table zeroed and the bounds' summary at its
identities for the next run, which therefore launches neither init_summary nor a memset
of the table (a first run, or one after a run that stopped midway, does).

v4 is v3 with the filter's launches before the edge-pair filter -- B counted into the grid's cells, the table's
scan, B's scatter, the polygon pairs' count pass, its scan, its emit pass, the pairs' sort and the edge slots'
scan -- in one cooperative launch (overlay_v4.cu's filter_fused), its grid waiting at a barrier between steps:
the same device code on every item, two launches for the filter where v3 issues nine. Everything said of v3
here holds for v4.

v3 changes two of v1's kernels too. The edge-pair filter gives each polygon pair a warp
whose lanes hold a's edges, and broadcasts b's near edges to them by shuffles (v1's tests
and candidates, with no lane looping over b on its own), writing the candidates in one
pass. Area reconstruction walks each cut ring carrying its inside/outside status: refine
records which splits are proper crossings (the status flips there) and marks touches at a
segment's own ends, or at parameters that round to them (the status is unknown past
them), so a point-in-polygon test is needed only where the status is unknown -- about
one a cut ring instead of one a piece.
On the CPU, v3 finds v1's candidates and carries the status along each ring the same way
(cpu.py's _walk: the same pieces, kept pieces and point-in-polygon tests, tested). v3 also
sorts refine's records with a table entry for every 32 edge slots instead of every slot
(_sort_events), and hands the walk each split record's t and kind in sorted order.

Exactness where the layers' boundaries nearly coincide (overlay_exact.cu): a piece is
kept by the exact classification of its middle point on its edge, which the area kernels
decide from the rounded point wherever its error bounds allow. A ring with a piece they
cannot decide is listed, and area_rings_exact (v1, v2) or area_cut_rings_exact (v3) does
that ring again from the input doubles: one more launch a run, on a fixed grid striding
over the list (empty on layers whose boundaries are not within rounding of each other),
which keeps the exact code's registers out of the hot kernels. The area stage's metadata
counts those rings (exact_rings).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from app.kernel import grid
from app.kernel.gpu_build import GpuBackend
from app.kernel.robust import CCW_ERRBOUND_A

# Compiled as one program, in this order (each file uses what the ones before it define).
SOURCE = tuple(Path(__file__).with_name(f) for f in ("overlay.cu", "overlay_exact.cu", "overlay_area.cu",
                                                      "overlay_v3.cu", "overlay_v4.cu"))
# overlay.cu's PAIR_STASH: b's each a keeps from polygon_pairs' count pass (an a with more is tested again).
PAIR_STASH = 16
# The run's ledger, 64-bit words: common.cuh's GridParams (ox, oy, sx, sy as fp64 bits, level, shift, cells, table
# length), then the counters the filter's first launch zeroes: polygon_pairs' (bbox tests, pairs, a's tested
# twice), the edge-pair filter's (MBR tests, candidates), v3's edge slots, refine_pairs' (proper, touch, collinear
# overlap, ambiguous pairs, split events, v3's end marks), the area stage's (point-in-polygon tests, pieces, kept
# pieces, cut rings, kept pairs: the output's length), the split and overlap records refine appends (the
# sort's lengths), and the rings the area kernels listed for their exact re-do kernel.
GRID = slice(0, 8)
TABLE = slice(7, 8)
COUNTERS = slice(8, 28)
PAIR_STATS = slice(8, 11)
N_PAIRS = slice(9, 10)
EDGE_STATS = slice(11, 13)
N_CANDIDATES = slice(12, 13)
SLOTS = slice(13, 14)
REFINE = slice(14, 20)
AREA = slice(20, 25)
KEPT_PAIRS = slice(24, 25)
RECORDS = slice(25, 27)
REDO = slice(27, 28)
LEDGER_WORDS = 28
# v3's first rooms, before a run has counted: 4 polygon pairs a polygon of the larger layer (random layers find
# about 2.2), 8 candidate edge pairs a polygon pair (they find about 4.5), and each pair's mean edge slots.
# A run that counts more grows them and runs again; after every run they fit its counts with a quarter to spare.
FIRST_PAIRS_PER_POLYGON = 4
FIRST_CANDIDATES_PER_PAIR = 8
MIN_ROOM = 4096
# overlay_v4.cu's FILTER_SCAN_ITEMS: the scans inside v4's filter_fused take tiles of block x this.
FILTER_SCAN_ITEMS = 4
# overlay_v3.cu's EDGE_GROUP: lanes of v3's edge-pair filter a polygon pair (two pairs a warp).
EDGE_GROUP = 16
# v3's walk of the cut rings: a fixed grid of this many blocks a multiprocessor (each holds one or two at 128
# registers a thread), striding over the list.
WALK_BLOCKS_PER_SM = 4
# The exact re-do kernels (area_rings_exact, area_cut_rings_exact): a fixed grid of this many blocks a
# multiprocessor, striding over the rings the area kernels listed (none on most layers).
REDO_BLOCKS_PER_SM = 1
# The event sort's kernels: a fixed grid of this many blocks a multiprocessor, striding over the records, whose
# number only the device knows.
SORT_BLOCKS_PER_SM = 4
# overlay_v3.cu's SLOT_BUCKET_SHIFT: v3's record tables have an entry for every 32 edge slots, not every slot.
# At 100k x 100k a table of every slot (11.6M in the room, for 773k split records) took about 120 of the sort's
# 165 us on an H200, zeroing and scanning it; bucket_sort then orders each bucket's few records.
SLOT_BUCKET_SHIFT = 5
STAGE_KERNELS = {
    "segment_extraction": ("init_summary", "polygon_tables"),
    "segment_mbr_filter": ("grid_zero", "corner_cells", "corner_cells_grid", "corner_scatter", "polygon_pairs",
                           "sort_pairs", "filter_fused", "edge_pairs", "edge_pairs_sweep", "edge_pairs_warp"),
    "exact_intersection_refine": ("refine_pairs",),
    "reconstruction_event_sort": ("slot_count", "slot_scatter", "slot_sort", "bucket_sort"),
    "area_reconstruction": ("area_rings", "area_rings_exact", "area_rings_flip", "area_cut_rings",
                            "area_cut_rings_exact", "pair_area", "emit_areas"),
}
LIBRARY_CALLS = {
    "owned_buffer_build": "cudaMemcpyAsync (H2D copies: pinned staging from 16 MiB, else cupy.asarray)",
    "reconstruction_event_sort": "cudaMemsetAsync (slot counts; v3 only when no run has left them zeroed)",
}


class OverlayGPU(GpuBackend):
    SOURCE, STAGE_KERNELS, LIBRARY_CALLS = SOURCE, STAGE_KERNELS, LIBRARY_CALLS
    SCAN_STAGES = ("segment_mbr_filter", "reconstruction_event_sort", "area_reconstruction")

    def __init__(self, tiling: dict, version: str = "v1"):
        super().__init__(tiling, version)
        self.rooms_kept = version in ("v3", "v4")   # no size read before the result: rooms kept from run to run
        self.fused_filter = version == "v4"         # the filter's first eight launches one cooperative launch
        self.rooms: dict | None = None    # v3: polygon pairs, candidates and edge slots its buffers hold
        self._views: dict | None = None
        self._sort_scratch: tuple | None = None
        # v3: (summary, cell table) as the last run left them, the summary at its identities (sort_pairs) and the
        # table zeroed (corner_scatter), ready for the next run; None until a run has done so.
        self._ready: tuple | None = None
        self._sort_ready = None   # v3: the event sort's count tables, when the last run's slot_scatter zeroed them

    def _ledger(self) -> dict:
        """The run's ledger and its parts by name: views made once, since slicing a CuPy array costs
        microseconds of host time and the launches are host-bound at the default sizes."""
        arr = self.mod.ws.empty("ledger", LEDGER_WORDS, self.cp.uint64)
        if self._views is None or self._views["all"] is not arr:
            parts = {"grid": GRID, "table": TABLE, "counters": COUNTERS, "pairs": PAIR_STATS, "n_pairs": N_PAIRS,
                     "edges": EDGE_STATS, "n_candidates": N_CANDIDATES, "slots": SLOTS, "refine": REFINE,
                     "area": AREA, "kept": KEPT_PAIRS, "records": RECORDS, "redo": REDO}
            self._views = {"all": arr} | {name: arr[part] for name, part in parts.items()}
        return self._views

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
        if self.rooms_kept:
            # The run before left the summary at its identities and the cell table zeroed: no init_summary, no
            # memset. Not so on a first run, or when a run stopped before its sort_pairs: then both are queued here.
            counts = ws.empty("corner_counts_max", grid.MAX_TABLE, cp.int32)
            ready, self._ready = self._ready, None
            if ready is None or ready[0] is not summary or ready[1] is not counts:
                self.mod.fn["init_summary"]((1,), (32,), (summary,))
                counts = ws.zeros("corner_counts_max", grid.MAX_TABLE, cp.int32)
            state["corner_counts"] = counts
        else:
            self.mod.fn["init_summary"]((1,), (32,), (summary,))
        tables = []
        for side in ("a", "b"):
            L = state[side]
            g, r = L["n_geoms"], L["n_rings"]
            L["bbox"] = ws.empty(f"bbox_{side}", (g, 4), cp.float64)
            L["ring_area2"] = ws.empty(f"ring_area2_{side}", r, cp.float64)
            L["ring_box"] = ws.empty(f"ring_box_{side}", (r, 4), cp.float64)
            tables += [L["coords"], L["ring_offsets"], L["geom_ring_offsets"], np.int64(g), L["bbox"],
                       L["ring_area2"], L["ring_box"]]
        # Both layers' rings and boxes in one launch, a thread a polygon.
        state["tables"] = (state["a"]["n_geoms"] + state["b"]["n_geoms"], block, (*tables, summary))
        self._launch("polygon_tables", *state["tables"])
        state["summary"] = summary      # the filter chooses its grid from it on the device
        g_all = state["a"]["n_geoms"] + state["b"]["n_geoms"]
        n_edges = sum(int(state[s]["coords"].shape[0] - state[s]["n_rings"]) for s in ("a", "b"))
        st.rows_in, st.rows_out = g_all, n_edges
        st.meta.update(segments_left=int(state["a"]["coords"].shape[0] - state["a"]["n_rings"]),
                       segments_right=int(state["b"]["coords"].shape[0] - state["b"]["n_rings"]))

    def segment_mbr_filter(self, state, st, tiling):
        A, B = state["a"], state["b"]
        state.update(filter_block=tiling["block"], level_bias=tiling["level_bias"], filter_st=st,
                     ledger=self._ledger())
        st.rows_in = A["n_geoms"] + B["n_geoms"]
        if self.rooms_kept:        # the counts and the grid's level come back with the final read
            self._filter_in_rooms(state)
            return
        cp, ws, block = self.cp, self.mod.ws, tiling["block"]
        led, (pcounts, poffsets, common) = state["ledger"], self._polygon_pair_counts(state)
        words = st.read_size(led["all"], "grid and polygon pairs -> buffer size")
        level = int(words[GRID][4])
        bbox_tests, npairs, crowded = (int(v) for v in words[PAIR_STATS])
        pair_a = ws.empty("pair_a", npairs, cp.int32)
        pair_b = ws.empty("pair_b", npairs, cp.int32)
        if crowded:
            self._launch("polygon_pairs", 32 * A["n_geoms"], block, common[:-2] + (
                pcounts, poffsets, pair_b, np.int64(npairs)) + common[-2:])
        null = np.intp(0)
        self._launch("sort_pairs", A["n_geoms"], block, (poffsets, np.int32(A["n_geoms"]), np.int64(npairs),
                                                         common[-2], pair_a, pair_b, null, null, null, null, null,
                                                         null, null))
        geo = self._pair_geometry(state, pair_a, pair_b)
        tests, c, n_slots, slot_incl, cand = self._edge_pairs_counted(st, led, geo, npairs, block)
        state.update(pair_a=pair_a, pair_b=pair_b, slot_incl=slot_incl, n_slots=n_slots, cand=cand)
        st.rows_out = c
        st.meta.update(polygon_pairs=npairs, pairs_examined=tests, candidates=c, grid_level=level,
                       bbox_tests=bbox_tests, polygons_tested_twice=crowded)

    def _polygon_pair_counts(self, state):
        """The grid, B bucketed by it, and each a's polygon pairs counted (its first PAIR_STASH b's kept), then
        scanned: no read. Returns the counts, their inclusive offsets and polygon_pairs' leading arguments, with
        the stash and the counters last."""
        cp, ws, block = self.cp, self.mod.ws, state["filter_block"]
        A, B, led = state["a"], state["b"], state["ledger"]
        ga, gb = A["n_geoms"], B["n_geoms"]
        # The grid (as grid.grid_level and grid.world_scale would choose it from the world box) is chosen on the
        # device, and the run's counters zeroed: by grid_zero, with the cell table (v1, v2), or as B is counted
        # into the table (v3). The table is sized for the largest level; the kernels use the real length. Reading
        # the world box to choose the grid on the host stopped the GPU for about 145 us at 100k x 100k on an H200
        # (the read, then the launches after it).
        grid_args = (state["summary"], np.int64(ga + gb), np.int32(state["level_bias"]), np.int32(grid.MAX_LEVEL),
                     led["grid"])
        # B bucketed by the cell of its bbox's lower-left corner.
        cell = ws.empty("corner_cell", gb, cp.uint32)
        slot = ws.empty("corner_slot", gb, cp.int32)
        if self.rooms_kept:    # the grid chosen as B is counted, in a table already zero (segment_extraction)
            counts = clear = state["corner_counts"]
            self.mod.fn["corner_cells_grid"](((max(gb, 1) + block - 1) // block,), (block,), (
                B["bbox"], np.int32(gb)) + grid_args + (cell, slot, counts, led["counters"],
                                                        np.int32(led["counters"].size)))
        else:
            counts, clear = ws.empty("corner_counts_max", grid.MAX_TABLE, cp.int32), np.intp(0)
            self.mod.fn["grid_zero"]((4 * self.sm_count,), (256,), grid_args + (
                counts, led["counters"], np.int64(2 * led["counters"].size)))
            self._launch("corner_cells", gb, block, (B["bbox"], np.int32(gb), led["grid"], cell, slot, counts))
        cell_start = self.mod.inclusive_scan(counts, cp.int32, "corner_start", n_dev=led["table"])
        sorted_b = ws.empty("sorted_b", gb, cp.int32)
        self._launch("corner_scatter", gb, block, (cell, slot, np.int32(gb), cell_start, sorted_b, clear))
        # Polygon pairs counted, each a's first PAIR_STASH b's kept; then (in the callers) placed in a-major
        # order and each a's b's ordered. Only a's with more pairs than that are tested again, in an emit pass.
        pcounts = ws.empty("pair_counts", ga, cp.int64)
        stash = ws.empty("pair_stash", ga * PAIR_STASH, cp.int32)
        common = (A["bbox"], np.int32(ga), B["bbox"], state["summary"], led["grid"], cell_start, sorted_b, stash,
                  led["pairs"])
        null = np.intp(0)
        self._launch("polygon_pairs", 32 * ga, block, common[:-2] + (pcounts, null, null, np.int64(0)) + common[-2:])
        return pcounts, self.mod.inclusive_scan(pcounts, cp.int64, "pair_offsets"), common

    def _pair_geometry(self, state, pair_a, pair_b) -> tuple:
        A, B = state["a"], state["b"]
        return (A["coords"], A["ring_offsets"], A["geom_ring_offsets"], A["bbox"],
                B["coords"], B["ring_offsets"], B["geom_ring_offsets"], B["bbox"], pair_a, pair_b,
                np.int32(len(pair_a)))

    def _first_rooms(self, state) -> dict:
        A, B = state["a"], state["b"]
        pairs = FIRST_PAIRS_PER_POLYGON * max(A["n_geoms"], B["n_geoms"]) + MIN_ROOM
        mean_slots = len(A["coords"]) / max(A["n_geoms"], 1) + len(B["coords"]) / max(B["n_geoms"], 1)
        return {"pairs": pairs, "candidates": FIRST_CANDIDATES_PER_PAIR * pairs,
                "slots": int(pairs * mean_slots) + MIN_ROOM}

    def _filter_in_rooms(self, state):
        """v3: polygon pairs and candidate edge pairs into buffers with the kept rooms, no read. The kernels
        read the live counts from the ledger; the final read checks them against the rooms."""
        cp, ws, block, led = self.cp, self.mod.ws, state["filter_block"], state["ledger"]
        A, B = state["a"], state["b"]
        if self.rooms is None:
            self.rooms = self._first_rooms(state)
        room = self.rooms
        pair_a = ws.empty("pair_a", room["pairs"], cp.int32)
        pair_b = ws.empty("pair_b", room["pairs"], cp.int32)
        ga, P = A["n_geoms"], np.int64(room["pairs"])
        slots = ws.empty("pair_slots", room["pairs"], cp.int64)       # sort_pairs writes each pair's edge slots
        tables = (A["ring_offsets"], A["geom_ring_offsets"], B["ring_offsets"], B["geom_ring_offsets"], slots,
                  led["slots"])
        if self.fused_filter:
            slot_incl = self._filter_fused(state, pair_a, pair_b, P, tables)
        else:
            pcounts, poffsets, common = self._polygon_pair_counts(state)
            # The emit pass: every warp returns at once unless some a had more pairs than its stash.
            self._launch("polygon_pairs", 32 * ga, block, common[:-2] + (pcounts, poffsets, pair_b, P) + common[-2:])
            self._launch("sort_pairs", ga, block, (poffsets, np.int32(ga), P, common[-2], pair_a, pair_b, *tables,
                                                   state["summary"]))
            slot_incl = self.mod.inclusive_scan(slots, cp.int64, "slot_incl", n_dev=led["n_pairs"])
        if ga or self.fused_filter:     # the summary set back to its identities, the cell table zeroed
            self._ready = (state["summary"], state["corner_counts"])
        cand = [ws.empty(f"cand_{k}", room["candidates"], cp.int32) for k in ("p", "ka", "kb")]
        self._launch("edge_pairs_warp", EDGE_GROUP * room["pairs"], block,
                     self._pair_geometry(state, pair_a, pair_b) + (led["n_pairs"], slot_incl, np.int64(room["slots"]),
                                                                   np.int64(room["candidates"]), *cand, led["edges"]))
        state.update(pair_a=pair_a, pair_b=pair_b, slot_incl=slot_incl, n_slots=room["slots"], cand=cand)

    def _filter_fused(self, state, pair_a, pair_b, P, tables):
        """v4: v3's launches from corner_cells_grid to the slots' scan, in one cooperative launch (overlay_v4.cu's
        filter_fused) with v3's arguments. Returns the slots' inclusive scan."""
        cp, ws, block, led = self.cp, self.mod.ws, state["filter_block"], state["ledger"]
        A, B, counts = state["a"], state["b"], state["corner_counts"]
        ga, gb, tile = A["n_geoms"], B["n_geoms"], block * FILTER_SCAN_ITEMS
        grid_args = (state["summary"], np.int64(ga + gb), np.int32(state["level_bias"]), np.int32(grid.MAX_LEVEL),
                     led["grid"], led["counters"], np.int32(led["counters"].size))
        cell_start = ws.empty("corner_start", len(counts), cp.int32)
        pcounts, poffsets = ws.empty("pair_counts", ga, cp.int64), ws.empty("pair_offsets", ga, cp.int64)
        slot_incl = ws.empty("slot_incl", int(P), cp.int64)
        self._launch_cooperative("filter_fused", 32 * max(ga, gb), block, (
            A["bbox"], np.int32(ga), B["bbox"], np.int32(gb)) + grid_args + (
            ws.empty("corner_cell", gb, cp.uint32), ws.empty("corner_slot", gb, cp.int32), counts,
            np.int64(len(counts)), led["table"], cell_start, self.mod.scan_state("corner_start.fused", len(counts), tile),
            ws.empty("sorted_b", gb, cp.int32), pcounts, poffsets, self.mod.scan_state("pair_offsets.fused", ga, tile),
            ws.empty("pair_stash", ga * PAIR_STASH, cp.int32), led["pairs"], pair_a, pair_b, P, *tables, slot_incl,
            self.mod.scan_state("slot_incl.fused", int(P), tile), self.barrier_word("filter_fused")))
        return slot_incl

    def _edge_pairs_counted(self, st, led, geo, npairs, block):
        """v1, v2: edge pairs of each polygon pair counted (with the pair's slots), scanned, read, then emitted."""
        cp, ws, null = self.cp, self.mod.ws, np.intp(0)
        ecounts = ws.empty("edge_counts", npairs, cp.int64)
        slots = ws.empty("pair_slots", npairs, cp.int64)
        # v2's sweep keeps 8 warps' edge lists in shared memory: its block is fixed at 256.
        kernel, eblock = ("edge_pairs_sweep", 256) if self.version == "v2" else ("edge_pairs", block)
        self._launch(kernel, 32 * npairs, eblock, geo + (ecounts, slots, null, null, null, null, led["edges"]))
        eoffsets = self.mod.inclusive_scan(ecounts, cp.int64, "edge_offsets")
        slot_incl = self.mod.inclusive_scan(slots, cp.int64, "slot_incl")
        tail = slot_incl[-1:] if npairs else cp.zeros(1, dtype=cp.int64)
        tests, c, n_slots = (int(v) for v in st.read_size(cp.concatenate([led["edges"].view(cp.int64), tail]),
                                                           "candidate edge pairs -> buffer size"))
        _check_int32(c, n_slots)
        cand = [ws.empty(f"cand_{k}", c, cp.int32) for k in ("p", "ka", "kb")]
        self._launch(kernel, 32 * npairs, eblock, geo + (ecounts, slots, eoffsets, *cand, led["edges"]))
        return tests, c, n_slots, slot_incl, cand

    def exact_intersection_refine(self, state, st, tiling):
        state.update(refine_block=tiling["block"], refine_st=st)
        self._refine(state)
        # Counters come back with the final read (area_reconstruction fills rows_out and meta).
        st.rows_in = len(state["cand"][0])

    def _refine(self, state):
        cp, ws, led = self.cp, self.mod.ws, state["ledger"]
        A, B = state["a"], state["b"]
        c = len(state["cand"][0])                  # v3: the room; the kernel reads the live count
        # Records are appended, at most four split and two overlap records a candidate: their counts are
        # ledger words.
        ev_slot, ev_t = ws.empty("ev_slot", 4 * c, cp.int32), ws.empty("ev_t", 4 * c, cp.float64)
        ov_slot, ov_lo = ws.empty("ov_slot", 2 * c, cp.int32), ws.empty("ov_lo", 2 * c, cp.float64)
        ov_hi, ov_keep = ws.empty("ov_hi", 2 * c, cp.float64), ws.empty("ov_keep", 2 * c, cp.int32)
        # v3 also records whether each split is a proper crossing, and marks touches at segment ends.
        v3 = self.rooms_kept
        ev_kind = ws.empty("ev_kind", 4 * c, cp.int8) if v3 else None
        self._launch("refine_pairs", c, state["refine_block"], (
            A["coords"], A["geom_ring_offsets"], A["ring_offsets"], B["coords"], B["geom_ring_offsets"],
            B["ring_offsets"], state["pair_a"], state["pair_b"], state["slot_incl"], *state["cand"], np.int32(c),
            led["n_candidates"] if v3 else np.intp(0), CCW_ERRBOUND_A, ev_slot, ev_t,
            np.intp(0) if ev_kind is None else ev_kind, ov_slot, ov_lo, ov_hi, ov_keep, led["refine"],
            led["records"]))
        state.update(ev=(ev_slot, ev_t), ev_kind=ev_kind, ov=(ov_slot, ov_lo, ov_hi, ov_keep))

    def reconstruction_event_sort(self, state, st, tiling):
        state.update(sort_block=tiling["block"], sort_st=st)   # rows (split events) arrive with the final read
        self._sort_events(state)

    def _sort_events(self, state):
        """Split records by slot, then by t; overlap records by slot, then by lo: counting sorts of both sets
        in the same launches (their lengths are ledger words), each with its own table. v1 and v2 key the
        tables by slot; v3 by buckets of 32 slots, whose records bucket_sort orders, noting each one's slot
        (``ev_sslot``, ``ov_sslot``) for the area kernels to find a slot's records by, and each split record's t
        and kind in sorted order (``ev_ts``, ``ev_ks``) for the ring walk."""
        cp, block, led = self.cp, state["sort_block"], state["ledger"]
        v3 = self.rooms_kept
        shift = SLOT_BUCKET_SHIFT if v3 else 0
        n_keys = (state["n_slots"] >> shift) + 1 if v3 else state["n_slots"]   # v3: a bucket past the last slot
        (ev_slot, ev_t), (ov_slot, ov_lo) = state["ev"], state["ov"][:2]
        buf = self._sort_buffers(n_keys, len(ev_slot), len(ov_slot), v3)
        counts = buf["counts"]
        # Both tables, one memset. v3 only when the last run did not leave these zeroed (a first run, new sizes, or
        # a run stopped between counting and scattering): its slot_scatter zeroes them for the next run.
        ready, self._sort_ready = self._sort_ready, None
        if not v3 or ready is not counts:
            cp.cuda.runtime.memsetAsync(counts.data.ptr, 0, counts.nbytes, cp.cuda.get_current_stream().ptr)
        grid = (SORT_BLOCKS_PER_SM * self.sm_count,)
        self.mod.fn["slot_count"](grid, (block,), (ev_slot, buf["ev_rank"], buf["ev_counts"], ov_slot, buf["ov_rank"],
                                                   buf["ov_counts"], led["records"], np.int64(n_keys), np.int32(shift),
                                                   buf["scan_len"], buf["ov_start"]))
        ev_start = self.mod.inclusive_scan(buf["ev_counts"], cp.int32, "ev_start")
        ov_start = self.mod.inclusive_scan(buf["ov_counts"], cp.int32, "ov_start", n_dev=buf["scan_len"])
        # v3 scatters into the buckets (ev_grouped), and bucket_sort orders them into ev_order.
        ev_placed, ov_placed = (buf["ev_grouped"], buf["ov_grouped"]) if v3 else (buf["ev_order"], buf["ov_order"])
        clear = (buf["ev_counts"], buf["ov_counts"]) if v3 else (np.intp(0), np.intp(0))
        self.mod.fn["slot_scatter"](grid, (block,), (ev_slot, buf["ev_rank"], ev_start, ev_placed, ov_slot,
                                                     buf["ov_rank"], ov_start, ov_placed, led["records"],
                                                     np.int32(shift), *clear))
        if v3:
            self._sort_ready = counts
        state.update(ev_start=ev_start, ov_start=ov_start, ev_order=buf["ev_order"], ov_order=buf["ov_order"])
        if not v3:
            self.mod.fn["slot_sort"](grid, (block,), (ev_slot, buf["ev_rank"], ev_start, ev_t, ev_placed, ov_slot,
                                                      buf["ov_rank"], ov_start, ov_lo, ov_placed, led["records"]))
            return
        self.mod.fn["bucket_sort"](grid, (block,), (
            ev_slot, buf["ev_rank"], ev_start, ev_t, state["ev_kind"], ev_placed, buf["ev_order"], buf["ev_sslot"],
            buf["ev_ts"], buf["ev_ks"], ov_slot, buf["ov_rank"], ov_start, ov_lo, ov_placed, buf["ov_order"],
            buf["ov_sslot"], led["records"]))
        state.update(ev_sslot=buf["ev_sslot"], ev_ts=buf["ev_ts"], ev_ks=buf["ev_ks"], ov_sslot=buf["ov_sslot"])

    def _sort_buffers(self, n_keys: int, n_ev: int, n_ov: int, v3: bool) -> dict:
        """The sort's scratch for tables of ``n_keys`` and rooms of ``n_ev`` split and ``n_ov`` overlap records
        (and v3's bucket_sort outputs), looked up once for those sizes: a dozen workspace lookups and two slices
        every run would add microseconds of host time to a plan that is host-bound at the default sizes."""
        sizes = (n_keys, n_ev, n_ov, v3)
        if self._sort_scratch is None or self._sort_scratch[0] != sizes:
            cp, ws = self.cp, self.mod.ws
            i32 = cp.int32
            counts = ws.empty("slot_counts", 2 * (n_keys + 1), i32)
            buf = {"counts": counts, "ev_counts": counts[:n_keys + 1], "ov_counts": counts[n_keys + 1:],
                   "scan_len": ws.empty("ov_scan_len", 1, cp.int64),
                   "ov_start": ws.empty("ov_start", n_keys + 1, i32)}   # the scan's output, under its tag
            for side, n in (("ev", n_ev), ("ov", n_ov)):
                for what in ("rank", "order") + (("grouped", "sslot") if v3 else ()):
                    buf[f"{side}_{what}"] = ws.empty(f"{side}_{what}", n, i32)
            if v3:
                buf.update(ev_ts=ws.empty("ev_ts", n_ev, cp.float64), ev_ks=ws.empty("ev_ks", n_ev, cp.int8))
            self._sort_scratch = (sizes, buf)
        return self._sort_scratch[1]

    def area_reconstruction(self, state, st, tiling):
        state["area_block"] = tiling["block"]
        out = self._areas(state)
        led = state["ledger"]
        why = "output pairs -> output size" + (", room check" if self.rooms_kept else "")
        words = st.read_result_size(led["all"], why)
        while self.rooms_kept and not self._fit_rooms(words, st):
            # A count past its room: the buffers were too small for these inputs. The rooms fit the counts now
            # (those of the pairs that fitted, where the pairs did not: a third pass may still grow the others).
            # sort_pairs set the summary back to its identities for the next run: it is summed again first.
            self._ready = None
            self.mod.fn["init_summary"]((1,), (32,), (state["summary"],))
            self._launch("polygon_tables", *state["tables"])
            self._filter_in_rooms(state)
            self._refine(state)
            self._sort_events(state)
            out = self._areas(state)
            words = st.read_result_size(led["all"], "output pairs -> output size, after the rooms grew")
        h = int(words[KEPT_PAIRS][0])
        state["output"] = tuple(col[:h] for col in out)
        st.later(lambda: self._count_rows(state, st, words))

    def _fit_rooms(self, words, st) -> bool:
        """v3: whether the run's counts fit its rooms. A run that fits sets them to fit its counts with a
        quarter to spare (a warm run of the same inputs fits; a smaller input does not keep buffers, and
        launches, sized for a larger one). One that does not grows those it overflowed and shrinks none:
        where the pairs overflowed, the other counts cover only the pairs that fitted."""
        counts = {"pairs": int(words[N_PAIRS][0]), "candidates": int(words[N_CANDIDATES][0]),
                  "slots": int(words[SLOTS][0])}
        _check_int32(counts["candidates"], counts["slots"])
        over = {k: f"{v:,} {k} did not fit the room for {self.rooms[k]:,}" for k, v in counts.items()
                if v > self.rooms[k]}
        fit = {k: min(v + v // 4 + MIN_ROOM, 2**31 - 1) for k, v in counts.items()}
        self.rooms = {k: max(fit[k], self.rooms[k]) for k in fit} if over else fit
        if over:
            grown = "; ".join(over.values()) + ": grown; filter, refine, sort and areas ran again"
            prev = st.meta.get("room_grown")
            st.meta["room_grown"] = f"{prev}; then {grown}" if prev else grown
        return not over

    def _areas(self, state) -> tuple:
        """Each pair's area from its rings' pieces, and the output columns (as long as the polygon pairs' room:
        the read of their real length comes after this stage's last launch)."""
        cp, ws, block, led = self.cp, self.mod.ws, state["area_block"], state["ledger"]
        A, B = state["a"], state["b"]
        npairs = len(state["pair_a"])       # v3: the room; the kernels read the live count
        n_pairs = led["n_pairs"] if self.rooms_kept else np.intp(0)
        max_rings = max(A["max_rings"], B["max_rings"])
        contrib = ws.empty("contrib", npairs * 2 * max_rings, cp.float64)
        redo = ws.empty("redo_list", max(npairs * 2 * max_rings, 1), cp.int64)     # rings for the exact re-do
        redo_grid = (REDO_BLOCKS_PER_SM * self.sm_count,)
        side_a = (A["coords"], A["ring_offsets"], A["geom_ring_offsets"], A["bbox"])
        side_b = (B["coords"], B["ring_offsets"], B["geom_ring_offsets"], B["bbox"])
        pairs = (state["pair_a"], state["pair_b"])
        overlaps = (state["ov_start"], state["ov_order"], state["ov"][1], state["ov"][2], state["ov"][3])
        if state["ev_kind"] is None:
            records = (state["slot_incl"], state["ev_start"], state["ev_order"], state["ev"][1], *overlaps,
                       CCW_ERRBOUND_A)
            self._launch("area_rings", npairs * 2 * max_rings, block, (
                *side_a, A["ring_area2"], A["ring_box"], *side_b, B["ring_area2"], B["ring_box"], *pairs,
                np.int32(npairs), np.int32(max_rings), *records, contrib, led["area"], redo, led["redo"]))
            if npairs:
                self.mod.fn["area_rings_exact"](redo_grid, (block,), (
                    *side_a, *side_b, *pairs, np.int32(max_rings), *records, redo, led["redo"], contrib, led["area"]))
        else:
            # v3: uncut rings settled by a test of their first vertex each, cut rings listed, then walked 32 to a warp
            # carrying their inside/outside status (flipped at proper crossings). The walk's grid is fixed:
            # its threads stride over the list, whose length only the device knows.
            cut_list = ws.empty("cut_list", npairs * 2 * max_rings, cp.int64)
            self._launch("area_rings_flip", npairs * 2 * max_rings, block, (
                *side_a, A["ring_area2"], A["ring_box"], *side_b, B["ring_area2"], B["ring_box"], *pairs,
                np.int32(npairs), n_pairs, np.int32(max_rings), state["slot_incl"], np.int64(state["n_slots"]),
                state["ev_start"], state["ev_sslot"], state["ov_start"], state["ov_sslot"], CCW_ERRBOUND_A, contrib,
                cut_list, led["area"]))
            if npairs:
                walk = (*side_a, *side_b, *pairs, np.int32(max_rings), state["slot_incl"], state["ev_start"],
                        state["ev_sslot"], state["ev_ts"], state["ev_ks"], state["ov_start"], state["ov_sslot"],
                        *overlaps[1:], led["records"], CCW_ERRBOUND_A)
                self.mod.fn["area_cut_rings"]((WALK_BLOCKS_PER_SM * self.sm_count,), (block,), (
                    *walk, cut_list, contrib, led["area"], redo, led["redo"]))
                self.mod.fn["area_cut_rings_exact"](redo_grid, (block,), (*walk, redo, led["redo"], contrib,
                                                                          led["area"]))
        area = ws.empty("pair_area", npairs, cp.float64)
        keep = ws.empty("pair_keep", npairs, cp.int32)
        self._launch("pair_area", npairs, block, (contrib, np.int32(npairs), n_pairs, np.int32(max_rings), area, keep,
                                                  led["kept"]))
        incl = self.mod.inclusive_scan(keep, cp.int64, "keep_incl", n_dev=n_pairs if self.rooms_kept else None)
        # The output is written before its length is read, into columns as long as the polygon pairs (the
        # most it can be) and cut to length after: the read comes after the last launch, so the GPU does not
        # wait for the host to read the length and launch once more (about 45 us at 100k x 100k on an H200).
        # The caller's: fresh. The indices in int32, as the join's (the plan refuses 2^31 vertices): 16 bytes a row
        # to write and copy back, not 24.
        out = tuple(cp.empty(npairs, dtype=t) for t in (cp.int32, cp.int32, cp.float64))
        self._launch("emit_areas", npairs, block, (keep, incl, np.int32(npairs), n_pairs, state["pair_a"],
                                                   state["pair_b"], area, *out))
        return out

    def _count_rows(self, state, st, words):
        """The run's counters, read with the output size, into the stages' rows and metadata (after the clock:
        see StageContext.later)."""
        proper, touch, overlap, amb, events, marks = (int(v) for v in words[REFINE])
        refine = state["refine_st"]
        refine.rows_out = events + marks
        state["sort_st"].rows_in = state["sort_st"].rows_out = events + marks
        refine.meta.update(proper=proper, touch=touch, collinear_overlap=overlap, ambiguous_pairs=amb,
                           split_events=events)
        npairs = len(state["pair_a"])
        if self.rooms_kept:        # the filter's counts and the grid came back in this read
            refine.meta["end_marks"] = marks
            bbox_tests, npairs, crowded = (int(v) for v in words[PAIR_STATS])
            tests, c = (int(v) for v in words[EDGE_STATS])
            refine.rows_in = c
            f = state["filter_st"]
            f.rows_out = c
            f.meta.update(polygon_pairs=npairs, pairs_examined=tests, candidates=c, grid_level=int(words[GRID][4]),
                          bbox_tests=bbox_tests, polygons_tested_twice=crowded, candidate_room=len(state["cand"][0]),
                          pair_room=len(state["pair_a"]), slot_room=state["n_slots"])
        pip, pieces, kept, cut, h = (int(v) for v in words[AREA])
        st.rows_in, st.rows_out = npairs, h
        st.meta.update(cut_rings=cut, fragments=pieces, fragments_kept=kept, pip_tests=pip,
                       exact_rings=int(words[REDO][0]))


def _check_int32(candidates: int, slots: int) -> None:
    if candidates >= 2**31 or slots >= 2**31:
        raise ValueError(f"{candidates} candidate edge pairs / {slots} edge slots exceed int32 indexing")
