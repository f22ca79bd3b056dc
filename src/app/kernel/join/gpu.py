"""The join's stages on the GPU: CuPy plus the RawKernels of join.cu.

v1 and v2 read allocation sizes from the device mid-run, each through ``st.read_size``
so it is counted in the stage's metadata: the grid level (the cell table's size) in
morton_sort, the candidate total in the filter (v2 also its cell-list length), and the
hit total at the end of output_sort. Each read stops the host until the GPU has caught
up, and then the GPU waits for the host's next launches.

v3 is v1 with no read before the end: the grid is chosen on the device (in the
launch that counts the points into its cells) and its cell table allocated for the
largest level, and the candidate buffers have a room the backend keeps from run to
run. The kernels read the real lengths from device memory. One read at the end sizes
the result and checks the room; if the candidates did not fit, the room grows and the
filter, refine and sort run again within that same run, which the output stage's
metadata says (``candidate_room_grown``). The plan can therefore be captured as one
CUDA graph (see app.runtime.graph). The scatter leaves the cell table zeroed and the
world box's summary at its identities for the next run, so a run launches no init_run
or memset for them (a first run, or one after a run that stopped midway, does).

v4 is v3 with the points' coordinates copied into their bucketed order by the Morton
sort, so the filter reads each cell's points as one contiguous run instead of
gathering them through the order, and the filter in one launch: a warp lays its
polygons' cell runs end to end across its lanes, counts their candidates while keeping
them in shared memory, reserves room for them with one atomic add, and writes them from
there (v3's count pass and its scan are gone; a warp whose candidates overflow its
shared memory scans its cells again to write them).
A warp takes 1 to 16 polygons (``polygons_per_warp``): with one each, 100k polygons
contended for the room counter.

v5 is v4 with morton_sort and output_sort each one cooperative launch (join_fused.cu): the steps of each,
three launches in v4, wait for the whole grid at barriers instead, running the same per-item code. At the
default sizes the plan is bound by its host's launches; this takes four of its nine away.

CuPy's sorts (Thrust) are not used, so no library call can synchronise where the
counters cannot see it; the two sorts here are counting sorts (points by grid cell,
hits by point) built from our kernels and scan.cu.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from app.kernel import grid
from app.kernel.gpu_build import GpuBackend
from app.kernel.robust import CCW_ERRBOUND_A

SOURCE = (Path(__file__).with_name("join.cu"), Path(__file__).with_name("join_fused.cu"))
CANDIDATE_FILLS = tuple(f"candidate_fill_{k}" for k in (1, 2, 4, 8, 16))   # v4's filter: 1-16 polygons a warp
STAGE_KERNELS = {
    "bounds": ("init_run", "join_extent"),
    "morton_sort": ("grid_params", "point_cells", "point_cells_grid", "point_scatter", "point_scatter_xy",
                    "point_gather_xy", "morton_fused"),
    "candidate_filter": ("candidate_count", "candidate_emit", "poly_cell_count", "poly_cell_fill",
                         "point_candidates", *CANDIDATE_FILLS),
    "predicate_refine": ("refine",),
    "output_sort": ("pair_scatter", "segment_sort", "output_fused"),
}
# CuPy library calls each stage also makes (kernels with no source of ours to show).
LIBRARY_CALLS = {
    "owned_buffer_build": "cudaMemcpyAsync (H2D copies: pinned staging from 16 MiB, else cupy.asarray)",
    "morton_sort": "cudaMemsetAsync (bucket counts; v3-v5 leave them zeroed for the next run, in the scatter)",
    "predicate_refine": "cudaMemsetAsync (per-point hit counts; v3-v5 zero them as they count the points into cells, "
                        "unless the room grew)",
}
# The run's ledger, one device array of 64-bit words: every kernel reads the grid from it, every counter
# lands in it, and v3 reads it once, at the end.
LEDGER_WORDS = 15
GRID = slice(0, 8)        # join.cu's GridParams: ox, oy, sx, sy (fp64 bits), level, shift, cells, table length
TABLE = slice(7, 8)
FILTER = slice(8, 10)     # pairs examined, candidates
CANDIDATES = slice(9, 10)
REFINE = slice(10, 15)    # hits, exact orientations, edge tests, boundary pairs, orientation tests
MIN_ROOM = 4096
# v4 from this many points: the indices scattered, then the coordinates gathered in bucketed order (two launches),
# instead of scattered with them (one). On an H200 the kernels took 46 against 69 us at 1M points and 27 against
# 17 us at 100k; the whole plan after the build, interleaved in one process: 451 against 472 us at 1M x 100k,
# 291 against 297 us at 500k x 50k, 402 against 386 us at 250k x 25k (the one launch faster there).
GATHER_XY_FROM = 1 << 19
# v4's filter: a warp takes 2, 4, 8 or 16 polygons where that leaves this many warps an SM. On an H200 at
# 1M x 100k, 8 a warp ran candidate_fill in 132 us against 170 us at 1 a warp (100k atomic adds on one counter);
# at 100k x 10k one a warp is the choice (10k adds, and fewer warps would leave SMs idle).
POLYGONS_PER_WARP_FROM = 64
MAX_POLYGONS_PER_WARP = 16
# join.cu's STASH_PAIRS: candidates (int2) a warp of candidate_fill keeps in shared memory while it counts,
# then writes to their room in one pass; a warp that finds more scans its cells again to write them.
STASH_PAIRS = 256
# join_extent: up to this many threads a polygon, loading its vertices side by side (common.cuh's polygon_bounds).
MAX_EXTENT_LANES = 8
# join_fused.cu's FUSED_SCAN_ITEMS: v5's scans inside its cooperative launches take tiles of block x this.
FUSED_SCAN_ITEMS = 4


class JoinGPU(GpuBackend):
    SOURCE, STAGE_KERNELS, LIBRARY_CALLS = SOURCE, STAGE_KERNELS, LIBRARY_CALLS
    SCAN_STAGES = ("morton_sort", "candidate_filter", "output_sort")
    SHARED_PER_WARP = dict.fromkeys(CANDIDATE_FILLS, STASH_PAIRS * 8)     # the stash: int2 pairs

    def __init__(self, tiling: dict, version: str = "v1"):
        super().__init__(tiling, version)
        self.no_reads = version in ("v3", "v4", "v5")   # grid on the device, candidate room: one read, at the end
        self.bucketed_xy = version in ("v4", "v5")       # coordinates in bucketed order, the filter in one launch
        self.fused = version == "v5"                     # morton_sort and output_sort one cooperative launch each
        self._room: int | None = None     # v3-v5: candidate pairs the buffers hold, kept from run to run
        self._views: dict | None = None
        # v3-v5: (summary, cell table) as the last run's scatter left them, the summary at its identities and the
        # table zeroed, ready for the next run; None until a run has done so (see bounds).
        self._ready: tuple | None = None

    def _ledger(self) -> dict:
        """The run's ledger (init_run zeroes it) and its parts by name: views made once, since slicing a CuPy
        array costs microseconds of host time and v3's launches are host-bound."""
        arr = self.mod.ws.empty("ledger", LEDGER_WORDS, self.cp.uint64)
        if self._views is None or self._views["all"] is not arr:
            self._views = {"all": arr, "grid": arr[GRID], "table": arr[TABLE], "filter": arr[FILTER],
                           "candidates": arr[CANDIDATES], "refine": arr[REFINE]}
        return self._views

    # --- stages ----------------------------------------------------------------------
    def owned_buffer_build(self, state, st, tiling):
        inp = state["inputs"]
        polys = inp.polygons
        if polys.n_coords >= 2**31 or len(inp.points) >= 2**31:
            raise ValueError("more than 2^31 points or vertices: the int32 offsets would overflow")
        # Polygons first: bounds reads them before the points.
        state.update(self.stage_in(st, coords=(polys.coords, np.float64), ring_offsets=(polys.ring_offsets, np.int32),
                                   geom_ring_offsets=(polys.geom_ring_offsets, np.int32),
                                   points=(inp.points, np.float64)))
        st.rows_in = st.rows_out = len(inp.points) + polys.n_geoms
        st.meta.update(points=len(inp.points), polygons=polys.n_geoms, rings=polys.n_rings,
                       vertices=polys.n_coords, owned_bytes=int(inp.points.nbytes + polys.nbytes()))

    def bounds(self, state, st, tiling):
        cp, ws = self.cp, self.mod.ws
        g, pts = state["inputs"].polygons.n_geoms, state["points"]
        bbox = ws.empty("bbox", (g, 4), cp.float64)
        summary = ws.empty("summary", 8, cp.float64)
        state["ledger"] = led = self._ledger()
        ledger = np.intp(0)         # v1, v2: init_run zeroes the ledger
        if self.no_reads:
            # The previous run's scatter left the summary at its identities and the cell table zeroed, so this run
            # needs neither init_run nor a memset: join_extent zeroes the ledger. Not so on a first run, or when a
            # run stopped between here and its scatter (an error, Ctrl-C): then both are queued here.
            counts = ws.empty("cell_counts_max", grid.MAX_TABLE, cp.int32)
            ready, self._ready = self._ready, None
            if ready is None or ready[0] is not summary or ready[1] is not counts:
                self.mod.fn["init_run"]((1,), (32,), (led["all"], np.int32(LEDGER_WORDS), summary))
                counts = ws.zeros("cell_counts_max", grid.MAX_TABLE, cp.int32)
            state["cell_counts"], ledger = counts, led["all"]
        else:
            self.mod.fn["init_run"]((1,), (32,), (led["all"], np.int32(LEDGER_WORDS), summary))
        # One launch: the polygons, `lanes` threads a polygon, then a fixed grid striding over the points (few atomics).
        block = tiling["block"]
        lanes = self.extent_lanes(g, block)
        poly_blocks = (g * lanes + block - 1) // block
        point_blocks = min((len(pts) + block - 1) // block, 4 * self.sm_count)
        if poly_blocks + point_blocks:
            self.mod.fn["join_extent"]((poly_blocks + point_blocks,), (block,),
                                       (state["coords"], state["ring_offsets"], state["geom_ring_offsets"],
                                        np.int64(g), np.int32(lanes), bbox, pts, np.int64(len(pts)),
                                        np.int32(poly_blocks), summary, ledger, np.int32(LEDGER_WORDS)))
        state["bbox"], state["summary"] = bbox, summary
        st.rows_in, st.rows_out = g + len(pts), g

    def morton_sort(self, state, st, tiling):
        cp, ws, pts, led = self.cp, self.mod.ws, state["points"], state["ledger"]
        ledger = led["all"]
        n, block = len(pts), tiling["block"]
        # World box and mean bbox size choose the level, on the device (same arithmetic as grid.grid_level).
        grid_args = (state["summary"], np.int64(len(state["bbox"])), np.int32(tiling["level_bias"]),
                     np.int32(grid.MAX_LEVEL), ledger)
        pcell = ws.empty("pcell", n, cp.uint32)
        slot = ws.empty("point_slot", n, cp.int32)
        if self.no_reads:
            # A table for the largest level, zero as bounds found it; the kernels read the real length. The grid is
            # chosen in the counting launch, and refine's per-point hit counts zeroed there (see _refine).
            counts, table = state["cell_counts"], led["table"]
            restore = (counts, state["summary"])      # the scatter leaves them ready for the next run
            if not self.fused:                        # v5 counts in its one launch
                point_counts = state["point_counts"] = ws.empty("point_counts", n + 1, cp.int32)
                self.mod.fn["point_cells_grid"](((max(n, 1) + block - 1) // block,), (block,),
                                                (pts, np.int64(n)) + grid_args + (pcell, slot, counts, point_counts))
        else:
            self.mod.fn["grid_params"]((1,), (32,), grid_args)
            level = int(st.read_size(led["grid"], "grid level -> cell table size")[4])
            counts, table = ws.zeros("cell_counts", (1 << 2 * level) + 1, cp.int32), None
            state["level"] = level
            st.meta.update(grid_level=level, grid_cells=1 << 2 * level)
            self._launch("point_cells", n, block, (pts, np.int64(n), ledger, pcell, slot, counts))
            restore = (np.intp(0), np.intp(0))
        if self.fused:
            cell_start, sorted_pt = self._morton_fused(state, grid_args, pcell, slot, counts, table, block, restore)
        else:
            cell_start, sorted_pt = self._morton_steps(state, pts, pcell, slot, counts, table, block, restore)
        if self.no_reads and n:      # with no points no scatter ran: the next run's bounds restores them itself
            self._ready = (state["summary"], counts)
        state.update(cell_start=cell_start, sorted_pt=sorted_pt, morton_st=st)
        st.rows_in = st.rows_out = n
        if self.bucketed_xy:        # the points' coordinates written again, in bucketed order (the cost model's)
            st.meta["bucketed_coordinates"] = n

    def _morton_steps(self, state, pts, pcell, slot, counts, table, block, restore):
        """v1-v4: the cell table's scan, then the scatter, a launch each (v4 also lays the coordinates out)."""
        cp, ws, n = self.cp, self.mod.ws, len(pts)
        cell_start = self.mod.inclusive_scan(counts, cp.int32, "cell_start", n_dev=table)
        sorted_pt = ws.empty("sorted_pt", n, cp.int32)
        if self.bucketed_xy:     # the coordinates too, in bucketed order: the filter reads them in runs
            xy = state["sorted_xy"] = ws.empty("sorted_xy", (n, 2), cp.float64)
            if n >= GATHER_XY_FROM:
                self._launch("point_scatter", n, block, (pcell, slot, np.int64(n), cell_start, sorted_pt, *restore))
                self._launch("point_gather_xy", n, block, (pts, sorted_pt, np.int64(n), xy))
            else:
                self._launch("point_scatter_xy", n, block,
                             (pts, pcell, slot, np.int64(n), cell_start, sorted_pt, xy, *restore))
        else:
            self._launch("point_scatter", n, block, (pcell, slot, np.int64(n), cell_start, sorted_pt, *restore))
        return cell_start, sorted_pt

    def _morton_fused(self, state, grid_args, pcell, slot, counts, table, block, restore):
        """v5: the count into cells, the table's scan and the scatter in one cooperative launch; v4's
        scatter-then-gather from GATHER_XY_FROM points, its single scatter below."""
        cp, ws, pts = self.cp, self.mod.ws, state["points"]
        n = len(pts)
        point_counts = state["point_counts"] = ws.empty("point_counts", n + 1, cp.int32)
        cell_start = ws.empty("cell_start", len(counts), cp.int32)
        sorted_pt = ws.empty("sorted_pt", n, cp.int32)
        xy = state["sorted_xy"] = ws.empty("sorted_xy", (n, 2), cp.float64)
        scan = self.mod.scan_state("cell_start.fused", len(counts), block * FUSED_SCAN_ITEMS)
        self._launch_cooperative("morton_fused", n, block,
                                 (pts, np.int64(n)) + grid_args + (pcell, slot, counts, point_counts,
                                                                   np.int64(len(counts)), table, cell_start, scan,
                                                                   sorted_pt, xy, np.int32(n >= GATHER_XY_FROM),
                                                                   restore[1], self.barrier_word("morton_fused")))
        return cell_start, sorted_pt

    def candidate_filter(self, state, st, tiling):
        if self.version == "v2":
            return self._candidate_filter_cells(state, st, tiling)
        cp, ws, bbox, led = self.cp, self.mod.ws, state["bbox"], state["ledger"]
        ledger = led["all"]
        g, block = len(bbox), tiling["block"]
        state.update(filter_block=block, filter_st=st)
        if self.bucketed_xy:         # one launch: count, reserve room for the polygon's pairs, write them
            self._emit(state, self._kept_room(state))
            st.rows_in = g
            return
        counts = ws.empty("poly_counts", g, cp.int64)
        args = (state["points"], bbox, np.int64(g), ledger, state["cell_start"], state["sorted_pt"])
        self._launch("candidate_count", 32 * g, block, args + (counts, led["filter"]))   # a warp per polygon
        state["poly_offsets"] = self.mod.inclusive_scan(counts, cp.int64, "poly_offsets")
        state["filter_args"] = args
        if self.version == "v3":
            room = self._kept_room(state)
        else:
            examined, room = (int(v) for v in st.read_size(led["filter"], "candidate pairs -> buffer size"))
            _check_pairs(room)
            st.rows_out = room
            st.meta.update(pairs_examined=examined, candidates=room)
        self._emit(state, room)
        st.rows_in = g

    def _kept_room(self, state) -> int:
        """v3-v5: the candidate room of the previous run, or 2 pairs a point at first."""
        return self._room if self._room is not None else max(2 * len(state["points"]), MIN_ROOM)

    def _emit(self, state, room: int):
        """Candidate pairs into buffers with room for ``room``; the kernel writes none past it."""
        cp, ws = self.cp, self.mod.ws
        cand_pt = ws.empty("cand_pt", room, cp.int32)
        cand_poly = ws.empty("cand_poly", room, cp.int32)
        g = len(state["bbox"])
        if self.bucketed_xy:
            led = state["ledger"]
            per_warp, block = self.polygons_per_warp(g), state["filter_block"]
            warps = (g + per_warp - 1) // per_warp
            name = f"candidate_fill_{per_warp}"
            if warps:        # each warp keeps its candidates in shared memory while it counts them
                self.mod.fn[name](((32 * warps + block - 1) // block,), (block,),
                                  (state["sorted_xy"], state["sorted_pt"], state["bbox"], np.int64(g), led["all"],
                                   state["cell_start"], cand_pt, cand_poly, np.int64(room), led["filter"]),
                                  shared_mem=self.mod.shared_bytes(name, block))
        else:
            self._launch("candidate_emit", 32 * g, state["filter_block"],
                         state["filter_args"] + (state["poly_offsets"], cand_pt, cand_poly, np.int64(room)))
        state["cand_pt"], state["cand_poly"] = cand_pt, cand_poly

    def extent_lanes(self, g: int, block: int) -> int:
        """join_extent's threads a polygon (1, 2, 4 or 8): the most that keep its polygon blocks within the points'
        fixed grid (4 blocks an SM), else 1. A thread a polygon left most SMs idle at 10k polygons (40 blocks of
        256) and each lane's loads a sector of its own; more blocks than that do more of the summary's atomics.
        On an H200, 8 lanes took join_extent from 19.2 to 12.1 us at 100k x 10k (L2 flushed, interleaved), while 8
        lanes a polygon over a fixed grid of 4 blocks an SM (a group looping over polygons, 62 registers against
        36) ran 1.04x slower at 1M x 100k, where a thread a polygon fills 391 blocks already."""
        lanes = MAX_EXTENT_LANES
        while lanes > 1 and g * lanes > 4 * self.sm_count * block:
            lanes //= 2
        return lanes

    def polygons_per_warp(self, g: int) -> int:
        """v4's candidate_fill: polygons a warp takes (1, 2, 4, 8 or 16, a kernel each), the most that still
        leaves POLYGONS_PER_WARP_FROM warps an SM: fewer atomic adds on the room counter, every SM still full."""
        k = 1
        while 2 * k <= MAX_POLYGONS_PER_WARP and 2 * k * POLYGONS_PER_WARP_FROM * self.sm_count <= g:
            k *= 2
        return k

    def _candidate_filter_cells(self, state, st, tiling):
        """v2: polygons listed per grid cell (counting sort), each point tests its own cell's list."""
        cp, ws, bbox, led = self.cp, self.mod.ws, state["bbox"], state["ledger"]
        ledger = led["all"]
        g, n, block = len(bbox), len(state["points"]), tiling["block"]
        cells = 1 << 2 * state["level"]
        geo = (np.int64(g), ledger)
        counts = ws.zeros("poly_cell_counts", cells + 1, cp.int32)
        self._launch("poly_cell_count", g, block, (bbox, *geo, counts))
        cell_start = self.mod.inclusive_scan(counts, cp.int32, "poly_cell_start")
        e = int(st.read_size(cell_start[-1:], "grid entries -> entry buffer size")[0])
        entries = ws.empty("poly_entries", e, cp.int32)
        fill = ws.zeros("poly_cell_fill", cells, cp.int32)
        self._launch("poly_cell_fill", g, block, (bbox, *geo, cell_start, fill, entries))
        pcounts = ws.empty("point_counts_v2", n, cp.int64)
        stats = led["filter"]
        null = np.intp(0)
        args = (state["points"], state["sorted_pt"], np.int64(n), ledger, cell_start, entries, bbox)
        self._launch("point_candidates", n, block, args + (pcounts, null, null, null, stats))
        offsets = self.mod.inclusive_scan(pcounts, cp.int64, "point_offsets_v2")
        examined, c = (int(v) for v in st.read_size(stats, "candidate pairs -> buffer size"))
        _check_pairs(c)
        cand_pt = ws.empty("cand_pt", c, cp.int32)
        cand_poly = ws.empty("cand_poly", c, cp.int32)
        self._launch("point_candidates", n, block, args + (pcounts, offsets, cand_pt, cand_poly, stats))
        state["cand_pt"], state["cand_poly"] = cand_pt, cand_poly
        st.rows_in, st.rows_out = n, c
        st.meta.update(pairs_examined=examined, candidates=c, grid_entries=e)

    def predicate_refine(self, state, st, tiling):
        state.update(refine_block=tiling["block"], refine_st=st)
        self._refine(state)
        # The hit count stays on the device: output_sort reads it once, after queueing its own
        # kernels, and fills in this stage's rows_out and counters then.
        st.rows_in = len(state["cand_pt"])

    def _refine(self, state):
        cp, ws, led = self.cp, self.mod.ws, state["ledger"]
        c = len(state["cand_pt"])                   # v3: the room; the kernel reads the real count
        hits = ws.empty("hits", c, cp.uint64)      # hits <= candidates: no size read needed up front
        slot = ws.empty("hit_slot", c, cp.int32)   # each hit's rank among its point's hits
        counts = state.pop("point_counts", None)   # v3-v5: zeroed as the points were counted (a rerun zeroes its own)
        if counts is None:
            counts = ws.zeros("point_counts", len(state["points"]) + 1, cp.int32)
        within = np.int32(state["inputs"].predicate == "within")
        n_cand = led["candidates"] if self.no_reads else np.intp(0)
        self._launch("refine", c, state["refine_block"],
                     (state["points"], state["coords"], state["ring_offsets"], state["geom_ring_offsets"],
                      state["cand_pt"], state["cand_poly"], np.int32(c), n_cand, within, CCW_ERRBOUND_A, hits,
                      led["refine"], counts, slot))
        state.update(hits=hits, hit_slot=slot, hit_counts=counts)

    def output_sort(self, state, st, tiling):
        state["sort_block"] = tiling["block"]
        self._sort_hits(state)
        if not self.no_reads:
            words = st.read_result_size(state["ledger"]["refine"], "hits -> output size")
            hit_words = words
        else:
            words = st.read_result_size(state["ledger"]["all"], "grid, candidates and hits -> result size, room check")
            c, room = int(words[CANDIDATES][0]), len(state["cand_pt"])
            if c > room:           # the candidates did not fit: grow the room, run filter to sort again
                _check_pairs(c)
                self._room = min(c + c // 4 + MIN_ROOM, 2**31 - 1)
                st.meta["candidate_room_grown"] = f"{c} candidate pairs did not fit the room for {room}: grown " \
                                                  f"to {self._room}; filter, refine and sort ran again"
                state["ledger"]["refine"].fill(0)      # refine counts again from zero
                if self.bucketed_xy:
                    state["ledger"]["filter"].fill(0)  # v4's filter counts as it writes: from zero too
                self._emit(state, self._room)
                self._refine(state)
                self._sort_hits(state)
                words = st.read_result_size(state["ledger"]["all"], "hits -> result size, after the room grew")
            else:
                self._room = room     # kept for the next run (a warm run of the same inputs fits)
            hit_words = words[REFINE]
        h = int(hit_words[0])
        pt, poly = state["sorted_pairs"]
        state["output"] = (pt[:h], poly[:h])
        st.later(lambda: self._count_rows(state, st, words, hit_words))

    def _count_rows(self, state, st, words, hit_words):
        """The counters read with the result's length into the stages' rows and metadata (after the clock)."""
        h, n_exact, n_edges, n_boundary, n_orient = (int(v) for v in hit_words)
        if self.no_reads:       # v3-v5: the grid and the filter's counts came back in the same read
            c, level = int(words[CANDIDATES][0]), int(words[4])
            state["morton_st"].meta.update(grid_level=level, grid_cells=1 << 2 * level)
            f = state["filter_st"]
            f.rows_out = c
            f.meta.update(pairs_examined=int(words[8]), candidates=c, candidate_room=len(state["cand_pt"]))
            state["refine_st"].rows_in = c
        st.rows_in = st.rows_out = h
        refine = state["refine_st"]
        refine.rows_out = h
        refine.meta.update(exact_orientations=n_exact, boundary_pairs=n_boundary, edge_tests=n_edges,
                           orientation_tests=n_orient)

    def _sort_hits(self, state):
        """Counting sort of the hits by point (refine counted and ranked them), then each point's polygons:
        launched before the hit count is known on the host, the kernels read it from the ledger."""
        cp, hits, stats = self.cp, state["hits"], state["ledger"]["refine"]
        c, n, block = len(hits), len(state["points"]), state["sort_block"]
        # Handed to the caller: never workspace. int32, as every index here is (points and polygons stay under
        # 2^31): half the bytes of int64 to write and to copy back. At 1M x 100k the copy of the 320k pairs
        # to host arrays took 77 against 135 us on an H200 node.
        pt = cp.empty(c, dtype=cp.int32)
        poly = cp.empty(c, dtype=cp.int32)
        if self.fused:       # v5: the scan, the scatter and the segments' sort in one cooperative launch
            counts = state["hit_counts"]
            start = self.mod.ws.empty("point_start", len(counts), cp.int64)
            scan = self.mod.scan_state("point_start.fused", len(counts), block * FUSED_SCAN_ITEMS)
            self._launch_cooperative("output_fused", max(len(counts), c), block,
                                     (counts, np.int64(n), start, scan, hits, stats, state["hit_slot"], pt, poly,
                                      self.barrier_word("output_fused")))
        else:
            start = self.mod.inclusive_scan(state["hit_counts"], cp.int64, "point_start")
            self._launch("pair_scatter", c, block, (hits, stats, state["hit_slot"], start, pt, poly))
            self._launch("segment_sort", n, block, (start, np.int64(n), poly))
        state["sorted_pairs"] = (pt, poly)


def _check_pairs(c: int) -> None:
    if c >= 2**31:
        raise ValueError(f"{c} candidate pairs: more than refine's int32 indexing allows; split the points")
