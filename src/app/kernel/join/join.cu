// Join kernels (points x polygons); common.cuh and scan.cu are compiled in front.
// ---- bounds -------------------------------------------------------------------
// The run's ledger zeroed and the summary's identities set (common.cuh's init_summary) in one launch, where a
// memset and a launch cost the host two calls: at the default sizes the plan is launch-bound. v3-v5 launch
// it only when the previous run did not leave the summary at its identities (see restore_for_next_run).
extern "C" __global__ void init_run(unsigned long long* ledger, int words, double* summary) {
    for (int i = threadIdx.x; i < words; i += blockDim.x) ledger[i] = 0;
    summary_identity(summary, threadIdx.x);
}

// The polygons' bboxes (common.cuh's polygon_bounds) and the points' extent in one launch: the first
// poly_blocks blocks take the polygons, ``lanes`` threads a polygon (gpu.py's extent_lanes), the rest stride over
// the points, a fixed grid. Each block takes one branch whole (both end in block_extent's __syncthreads), so
// poly_blocks plus a few hundred blocks do the summary's atomics. ``ledger`` (v3-v5; null for v1, v2, whose
// init_run zeroes it): the run's ledger, zeroed here by the first block; nothing in this launch reads it.
extern "C" __global__ void join_extent(const double* coords, const int* ring_off, const int* geom_ring_off,
                                       long long G, int lanes, double* bbox, const double* pts, long long N,
                                       int poly_blocks, double* summary, unsigned long long* ledger, int words) {
    if (ledger != nullptr && blockIdx.x == 0)
        for (int i = threadIdx.x; i < words; i += blockDim.x) ledger[i] = 0;
    if ((int)blockIdx.x < poly_blocks) {
        const long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x;
        switch (lanes) {       // the same for the whole launch: no divergence
            case 8: polygon_bounds<8>(coords, ring_off, geom_ring_off, G, bbox, summary, t); break;
            case 4: polygon_bounds<4>(coords, ring_off, geom_ring_off, G, bbox, summary, t); break;
            case 2: polygon_bounds<2>(coords, ring_off, geom_ring_off, G, bbox, summary, t); break;
            default: polygon_bounds<1>(coords, ring_off, geom_ring_off, G, bbox, summary, t);
        }
        return;
    }
    double x0 = 1.0 / 0.0, y0 = 1.0 / 0.0, x1 = -1.0 / 0.0, y1 = -1.0 / 0.0;
    long long stride = (long long)(gridDim.x - poly_blocks) * blockDim.x;
    const double2* xy = reinterpret_cast<const double2*>(pts);         // one 16-byte load a point
#pragma unroll 4
    for (long long i = (blockIdx.x - poly_blocks) * (long long)blockDim.x + threadIdx.x; i < N; i += stride) {
        const double2 v = xy[i];
        x0 = fmin(x0, v.x); y0 = fmin(y0, v.y); x1 = fmax(x1, v.x); y1 = fmax(y1, v.y);
    }
    block_extent(summary, x0, y0, x1, y1);
}

// ---- grid parameters, chosen on the device (common.cuh's grid_from_summary) ----------
// v1, v2: the grid alone; the host reads its level to size the cell table.
extern "C" __global__ void grid_params(const double* summary, long long G, int bias, int max_level,
                                       GridParams* gp) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    GridParams p;
    grid_from_summary(summary, G, bias, max_level, p);
    *gp = p;
}

// ---- Morton bucket sort: points grouped by their level-k Morton cell -------------
// counts has cells + 1 entries: counting into cell + 1 makes its inclusive scan the
// exclusive cell starts. The slot from the atomic places the point inside its cell.
extern "C" __global__ void point_cells(const double* pts, long long N, const GridParams* gp, unsigned int* pcell,
                                       int* slot, int* counts) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= N) return;
    unsigned int cell = grid_cell(pts[2 * i], pts[2 * i + 1], *gp);
    pcell[i] = cell;
    slot[i] = atomicAdd(counts + cell + 1, 1);
}

// Point i into its cell (v3-v5): its cell, its slot in the cell, and its hit count zeroed for refine.
__device__ __forceinline__ void count_point(long long i, const double* pts, const GridParams& gp, unsigned int* pcell,
                                            int* slot, int* counts, int* point_counts) {
    point_counts[i] = 0;
    unsigned int cell = grid_cell(pts[2 * i], pts[2 * i + 1], gp);
    pcell[i] = cell;
    slot[i] = atomicAdd(counts + cell + 1, 1);
}

// v3, v4: the grid chosen and the points counted into its cells in one launch, v5's morton_fused's first step
// (common.cuh's block_grid_from_summary: the first thread of each block works it out, the first block stores it in
// the ledger for the kernels after). Refine's per-point hit counts (N + 1) are zeroed here too. The cell table is
// not zeroed: it is zero already, as the scatter of the run before left it (restore_for_next_run), or as gpu.py
// zeroed it when no run had. Launched with at least one block, so the grid is stored with no points.
extern "C" __global__ void point_cells_grid(const double* pts, long long N, const double* summary, long long G,
                                            int bias, int max_level, GridParams* gp_out, unsigned int* pcell,
                                            int* slot, int* counts, int* point_counts) {
    __shared__ GridParams gp;
    block_grid_from_summary(summary, G, bias, max_level, gp, gp_out);
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i == 0) point_counts[N] = 0;
    if (i < N) count_point(i, pts, gp, pcell, slot, counts, point_counts);
}

// ``clear`` and ``summary`` (v3-v5; null for v1, v2): what the next run needs at its start, restored here, after
// the last read of each. Every nonzero entry of the cell table counts some point, and exactly one of its points
// has slot 0, so that point zeroing its cell's entry zeroes the table (the scan read it into cell_start before
// this launch): one store a busy cell, where a store a point made the sort 15 us slower at 1M points on an H200.
// The first thread sets the summary back to its identities (a run with no points launches no scatter: gpu.py
// then restores both itself). That saves the next run a launch and a memset of the table, and grid_zero's
// launch: at the default sizes the plan is bound by the host's launches.
__device__ __forceinline__ void restore_for_next_run(long long i, unsigned int cell, int slot, int* clear,
                                                     double* summary) {
    if (clear != nullptr && slot == 0) clear[cell + 1] = 0;
    if (summary != nullptr && i == 0)
        for (int k = 0; k < 8; ++k) summary_identity(summary, k);
}

extern "C" __global__ void point_scatter(const unsigned int* pcell, const int* slot, long long N,
                                         const int* cell_start, int* sorted_pt, int* clear, double* summary) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= N) return;
    unsigned int cell = pcell[i];
    int s = slot[i];
    sorted_pt[cell_start[cell] + s] = (int)i;
    restore_for_next_run(i, cell, s, clear, summary);
}

// ---- candidate filter: each polygon scans the point buckets its bbox covers -------
// Two passes over the same loops: count (and sum into stats), then emit at offsets.
// stats[0] += point-bbox tests (pairs examined), stats[1] += candidates.

// A warp per polygon: its lanes stride over the points of each covered cell, so
// 32x more threads are in flight than with a thread per polygon.
extern "C" __global__ void candidate_count(const double2* pts, const double* bbox, long long G,
                                           const GridParams* gp, const int* cell_start, const int* sorted_pt,
                                           long long* counts, unsigned long long* stats) {
    long long g = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;   // warp-uniform
    int lane = threadIdx.x & 31;
    unsigned long long examined = 0, found = 0;
    if (g < G) {
        const double* b = bbox + 4 * g;
        double bx0 = b[0], by0 = b[1], bx1 = b[2], by1 = b[3];
        unsigned int x0, y0, x1, y1;
        box_cells(b, gp, x0, y0, x1, y1);
        for (unsigned int y = y0; y <= y1; ++y)
            for (unsigned int x = x0; x <= x1; ++x) {
                unsigned int cell = morton(x, y);
                int j0 = cell_start[cell], j1 = cell_start[cell + 1];
                for (int j = j0 + lane; j < j1; j += 32) {
                    const double2 q = pts[sorted_pt[j]];
                    ++examined;
                    found += (bx0 <= q.x) & (q.x <= bx1) & (by0 <= q.y) & (q.y <= by1);
                }
            }
        unsigned long long total = found;
        for (int off = 16; off > 0; off >>= 1) total += __shfl_down_sync(FULL_MASK, total, off);
        if (lane == 0) counts[g] = (long long)total;
    }
    unsigned long long v[2] = {examined, found};
    block_add<2>(stats, v);
}

// Pairs past ``cap`` (the buffers' room) are not written: v3 sizes the buffers before the
// total is known, and checks the total against cap once, at the end of the run.
extern "C" __global__ void candidate_emit(const double2* pts, const double* bbox, long long G,
                                          const GridParams* gp, const int* cell_start, const int* sorted_pt,
                                          const long long* incl_offsets, int* cand_pt, int* cand_poly,
                                          long long cap) {
    long long g = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;   // warp-uniform
    int lane = threadIdx.x & 31;
    if (g >= G) return;
    const double* b = bbox + 4 * g;
    double bx0 = b[0], by0 = b[1], bx1 = b[2], by1 = b[3];
    unsigned int x0, y0, x1, y1;
    box_cells(b, gp, x0, y0, x1, y1);
    long long out = g == 0 ? 0 : incl_offsets[g - 1];
    for (unsigned int y = y0; y <= y1; ++y)
        for (unsigned int x = x0; x <= x1; ++x) {
            unsigned int cell = morton(x, y);
            int j0 = cell_start[cell], j1 = cell_start[cell + 1];
            for (int base = j0; base < j1; base += 32) {     // same trip count on every lane
                int j = base + lane, p = 0;
                bool hit = false;
                if (j < j1) {
                    p = sorted_pt[j];
                    const double2 q = pts[p];
                    hit = (bx0 <= q.x) & (q.x <= bx1) & (by0 <= q.y) & (q.y <= by1);
                }
                unsigned int ballot = __ballot_sync(FULL_MASK, hit);
                long long pos = out + __popc(ballot & ((1u << lane) - 1));
                if (hit && pos < cap) { cand_pt[pos] = p; cand_poly[pos] = (int)g; }
                out += __popc(ballot);
            }
        }
}

// ---- predicate refine: crossing number over every ring edge, exact orientation ---
// Hits are appended as (point << 32 | polygon) keys, one atomic per block.
// stats[0] += hits, [1] += orientations that needed the exact path, [2] += edge
// tests, [3] += candidate pairs with the point on the polygon's boundary, [4] += orientation tests (the
// edges that straddle the point's height or touch it).
// Each hit also takes its rank among its point's hits (point_counts[p + 1], zeroed before): the first step of
// output_sort's counting sort, done here where the hit is written instead of by a launch that reads it back.
// 64 registers, so 4 blocks of 256 an SM; it spills a few words (32 bytes of local memory a thread), which stay
// in L1. Unbounded it takes 73 and spills none, but fits 3 blocks: interleaved in one process on an H200, refine
// took 90.5 against 80.0 us at 1M x 100k (1.13x slower) and tied at 100k x 10k (27.1 against 27.8 us).
extern "C" __global__ void __launch_bounds__(256, 4)
refine(const double2* pts, const double2* coords, const int* ring_off, const int* geom_ring_off,
       const int* cand_pt, const int* cand_poly, int C, const unsigned long long* n_cand, int within, double errA,
       unsigned long long* hits, unsigned long long* stats, int* point_counts, int* hit_slot) {
    // v3 launches over the buffers' room and reads the real count here (never past the room).
    if (n_cand) C = (int)min(*n_cand, (unsigned long long)C);
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned long long n_exact = 0, n_edges = 0, n_boundary = 0, n_orient = 0;
    bool keep = false;
    int p = 0, g = 0;
    if (c < C) {
        p = cand_pt[c]; g = cand_poly[c];
        bool boundary = false;
        int crossings = classify_point(coords, ring_off, geom_ring_off, g, pts[p], errA, n_exact, n_edges, n_orient,
                                       boundary);
        keep = within ? (crossings && !boundary) : (crossings || boundary);
        n_boundary = boundary;
    }
    unsigned long long slot = block_append(keep, stats);
    if (keep) {
        hits[slot] = ((unsigned long long)p << 32) | (unsigned int)g;
        hit_slot[slot] = atomicAdd(point_counts + p + 1, 1);
    }
    unsigned long long v[4] = {n_exact, n_edges, n_boundary, n_orient};
    block_add<4>(stats + 1, v);
}

// ---- output sort: counting sort by point, then each point's polygons in order ----
// Launched before the hit count is known on the host (grids sized by the candidate
// count): the kernels read the count from device memory, so the host can queue
// this stage while refine still runs, and one read at the end sizes the result.
// refine counted each point's hits and ranked them; the scan of those counts gives each point's start.
__device__ __forceinline__ void scatter_pair(long long h, const unsigned long long* hits, const int* slot,
                                             const long long* start, int* out_pt, int* out_poly) {
    int p = (int)(hits[h] >> 32);
    long long pos = start[p] + slot[h];
    out_pt[pos] = p;
    out_poly[pos] = (int)(hits[h] & 0xffffffffull);
}

extern "C" __global__ void pair_scatter(const unsigned long long* hits, const unsigned long long* n_hits,
                                        const int* slot, const long long* start, int* out_pt, int* out_poly) {
    long long h = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (h < (long long)*n_hits) scatter_pair(h, hits, slot, start, out_pt, out_poly);
}

// A point lies in few polygons: insertion sort of its short segment is cheapest.
__device__ __forceinline__ void sort_segment(long long i, const long long* start, int* out_poly) {
    long long s = start[i], e = start[i + 1];
    for (long long a = s + 1; a < e; ++a) {
        int v = out_poly[a];
        long long b = a - 1;
        while (b >= s && out_poly[b] > v) { out_poly[b + 1] = out_poly[b]; --b; }
        out_poly[b + 1] = v;
    }
}

extern "C" __global__ void segment_sort(const long long* start, long long N, int* out_poly) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < N) sort_segment(i, start, out_poly);
}

// ---- v2 candidate filter: polygons listed per grid cell, each point probes its cell ---
// Counting sort of (cell, polygon) entries: count per cell, scan, fill with an atomic
// cursor per cell. Then a thread per point (Morton-bucketed order) tests the bboxes
// of its own cell's list: point-major, one short loop per thread.
extern "C" __global__ void poly_cell_count(const double* bbox, long long G, const GridParams* gp, int* cell_counts) {
    long long g = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (g >= G) return;
    unsigned int x0, y0, x1, y1;
    box_cells(bbox + 4 * g, gp, x0, y0, x1, y1);
    for (unsigned int y = y0; y <= y1; ++y)
        for (unsigned int x = x0; x <= x1; ++x) atomicAdd(cell_counts + morton(x, y) + 1, 1);
}

extern "C" __global__ void poly_cell_fill(const double* bbox, long long G, const GridParams* gp,
                                          const int* cell_start, int* cell_fill, int* entries) {
    long long g = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (g >= G) return;
    unsigned int x0, y0, x1, y1;
    box_cells(bbox + 4 * g, gp, x0, y0, x1, y1);
    for (unsigned int y = y0; y <= y1; ++y)
        for (unsigned int x = x0; x <= x1; ++x) {
            unsigned int c = morton(x, y);
            entries[cell_start[c] + atomicAdd(cell_fill + c, 1)] = (int)g;
        }
}

// Count pass (incl_offsets == 0): counts[i] and stats [examined, candidates];
// emit pass: (point, polygon) at the point's offset.
extern "C" __global__ void point_candidates(const double2* pts, const int* sorted_pt, long long N,
                                            const GridParams* gp, const int* cell_start,
                                            const int* entries, const double* bbox, long long* counts,
                                            const long long* incl_offsets, int* cand_pt, int* cand_poly,
                                            unsigned long long* stats) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    unsigned long long examined = 0, found = 0;
    if (i < N) {
        int p = sorted_pt[i];
        double2 q = pts[p];
        unsigned int c = grid_cell(q.x, q.y, *gp);
        long long out = incl_offsets ? (i == 0 ? 0 : incl_offsets[i - 1]) : 0;
        for (int j = cell_start[c], j1 = cell_start[c + 1]; j < j1; ++j) {
            int g = entries[j];
            const double* b = bbox + 4 * (long long)g;
            ++examined;
            if ((b[0] <= q.x) & (q.x <= b[2]) & (b[1] <= q.y) & (q.y <= b[3])) {
                if (incl_offsets) { cand_pt[out] = p; cand_poly[out] = g; ++out; }
                ++found;
            }
        }
        if (!incl_offsets) counts[i] = (long long)found;
    }
    unsigned long long v[2] = {examined, found};
    if (!incl_offsets) block_add<2>(stats, v);
}

// ---- v4: points laid out by cell, the filter in one launch ---------------------------
// point_scatter, and the points' coordinates copied into their bucketed order: the filter
// then reads each cell's points as one contiguous run (coalesced) instead of gathering
// them through sorted_pt.
// Point i to its place in bucketed order (its index, and its coordinates unless sorted_xy is null).
__device__ __forceinline__ void scatter_point(long long i, const double2* pts, const unsigned int* pcell,
                                              const int* slot, const int* cell_start, int* sorted_pt,
                                              double2* sorted_xy, int* clear, double* summary) {
    unsigned int cell = pcell[i];
    int s = slot[i];
    int j = cell_start[cell] + s;
    sorted_pt[j] = (int)i;
    if (sorted_xy != nullptr) sorted_xy[j] = pts[i];
    restore_for_next_run(i, cell, s, clear, summary);
}

extern "C" __global__ void point_scatter_xy(const double2* pts, const unsigned int* pcell, const int* slot,
                                            long long N, const int* cell_start, int* sorted_pt, double2* sorted_xy,
                                            int* clear, double* summary) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < N) scatter_point(i, pts, pcell, slot, cell_start, sorted_pt, sorted_xy, clear, summary);
}

// From GATHER_XY_FROM points (gpu.py) v4 scatters the indices alone (point_scatter) and then gathers the
// coordinates in bucketed order here: coalesced 16-byte writes and scattered reads, where point_scatter_xy
// makes scattered 16-byte writes. On an H200 at 1M points: 29 + 17 us against 69 us; at 100k points the
// one launch is the faster (17 against 27 us).
extern "C" __global__ void point_gather_xy(const double2* pts, const int* sorted_pt, long long N, double2* sorted_xy) {
    long long j = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (j < N) sorted_xy[j] = pts[sorted_pt[j]];
}

// As candidate_count and candidate_emit, in one launch: a warp counts its polygons'
// candidates, keeping them in shared memory, reserves room for them with one atomic add on
// stats[1], and copies them from shared memory into that room, those below ``cap``. Pairs land in no
// particular order across warps: refine appends hits in no order either, and output_sort
// orders them. stats[0] += pairs examined, stats[1] += candidates.
//
// The cells' point runs are laid end to end across the warp: lane k holds the run of the warp's
// k-th cell (32 cells at a time) and the runs' inclusive offsets, and each lane takes every 32nd
// point of the joined runs, finding its cell by a binary search over the lanes' offsets (five
// shuffles; common.cuh's warp_cell_runs and run_item, which overlay's polygon_pairs shares). A polygon over
// 4 cells of ~10 points then takes 2 iterations of full lanes, not 4 iterations a third full: the loop is
// latency-bound, so the trip count is the time.
//
// Modes: RUNS_STASH counts the pairs examined and the candidates and keeps the candidates in the warp's
// stash in shared memory (those past STASH_PAIRS are only counted); RUNS_WRITE scans again and writes
// them from ``out`` on, for a warp whose stash overflowed.
#define RUNS_STASH 0
#define RUNS_WRITE 1
// Candidates a warp keeps in shared memory (8 bytes each) while it counts. At 1M x 100k a warp of 8
// polygons finds about 45 (567,285 candidates, 12,500 warps): nearly every warp writes from its stash, and
// only the rare one past it scans its cells a second time.
#define STASH_PAIRS 256
template <int MODE>
__device__ __forceinline__ void cell_runs(const double2* sorted_xy, const int* sorted_pt, const int* cell_start,
                                          unsigned int x0, unsigned int y0, unsigned int nx, unsigned int ncell,
                                          double bx0, double by0, double bx1, double by1, int lane,
                                          unsigned long long& examined, long long& out, long long cap, int g,
                                          int* cand_pt, int* cand_poly, int2* stash, int& n_stash) {
    for (unsigned int c0 = 0; c0 < ncell; c0 += 32) {          // warp-uniform bounds
        int start, incl, excl;
        int total = warp_cell_runs(cell_start, x0, y0, nx, ncell, c0, lane, start, incl, excl);
        for (int base = 0; base < total; base += 32) {          // same trip count on every lane
            int f = base + lane;
            int j = run_item(f, start, incl, excl);
            bool hit = false;
            int pt = 0;
            if (f < total) {
                // The point's index is loaded beside its coordinates, not after the test: one wait, not two.
                const double2 q = sorted_xy[j];
                pt = sorted_pt[j];
                hit = (bx0 <= q.x) & (q.x <= bx1) & (by0 <= q.y) & (q.y <= by1);
                if (MODE == RUNS_STASH) ++examined;
            }
            unsigned int ballot = __ballot_sync(FULL_MASK, hit);
            int before = __popc(ballot & ((1u << lane) - 1));
            if (MODE == RUNS_WRITE) {
                long long pos = out + before;
                if (hit && pos < cap) { cand_pt[pos] = pt; cand_poly[pos] = g; }
                out += __popc(ballot);
            } else {
                int pos = n_stash + before;
                if (hit && pos < STASH_PAIRS) stash[pos] = make_int2(pt, g);
                n_stash += __popc(ballot);        // warp-uniform: every candidate counts, the stash full or not
            }
        }
    }
}

// A warp takes ``per_warp`` consecutive polygons (gpu.py picks it from the polygon count): it counts
// them all, reserves room for their candidates with one atomic add, and writes them. With a warp
// per polygon, 100k polygons made 100k atomic adds on the one room counter, and on an H200 that
// contention cost about 45 of candidate_fill's 170 us at 1M x 100k.
// The cells of box b (a polygon's; ``real`` false past the last polygon: no cells), laid out for cell_runs.
__device__ __forceinline__ void box_cell_runs(const double* b, bool real, const GridParams* gp, double& bx0,
                                              double& by0, double& bx1, double& by1, unsigned int& x0,
                                              unsigned int& y0, unsigned int& nx, unsigned int& ncell) {
    ncell = 0;
    if (!real) return;
    bx0 = b[0]; by0 = b[1]; bx1 = b[2]; by1 = b[3];
    unsigned int x1, y1;
    box_cells(b, gp, x0, y0, x1, y1);
    if (x1 >= x0 && y1 >= y0) {                      // an empty polygon's box (+inf, -inf) covers no cell
        nx = x1 - x0 + 1;
        ncell = nx * (y1 - y0 + 1);
    }
}

__device__ __forceinline__ void polygon_cells(const double* bbox, long long g, long long G, const GridParams* gp,
                                              double& bx0, double& by0, double& bx1, double& by1, unsigned int& x0,
                                              unsigned int& y0, unsigned int& nx, unsigned int& ncell) {
    box_cell_runs(bbox + 4 * g, g < G, gp, bx0, by0, bx1, by1, x0, y0, nx, ncell);
}

// polygon_cells for polygon g0 + i of a warp whose lane i holds that polygon's box (b, loaded for the warp's
// polygons at once): the box comes by shuffles, so the warp waits for memory once for all its boxes instead of
// once a polygon. Every lane must call it.
__device__ __forceinline__ void warp_polygon_cells(const double (&b)[4], int i, long long g, long long G,
                                                   const GridParams* gp, double& bx0, double& by0, double& bx1,
                                                   double& by1, unsigned int& x0, unsigned int& y0,
                                                   unsigned int& nx, unsigned int& ncell) {
    double box[4];
    for (int k = 0; k < 4; ++k) box[k] = __shfl_sync(FULL_MASK, b[k], i);
    box_cell_runs(box, g < G, gp, bx0, by0, bx1, by1, x0, y0, nx, ncell);
}

// The warp's room: one atomic add on stats[1] for its ``total`` candidates, from ``base`` on. A warp whose
// stash held them all writes them from there in one coalesced pass and returns true; a warp whose stash
// overflowed returns false, and the caller scans its polygons' cells again to write them (the same pairs,
// in the same order).
__device__ __forceinline__ bool reserve_and_write(unsigned long long* stats, unsigned long long total,
                                                  const int2* stash, int n_stash, long long cap, int lane,
                                                  int* cand_pt, int* cand_poly, unsigned long long& base) {
    base = 0;
    if (lane == 0 && total) base = atomicAdd(stats + 1, total);
    base = __shfl_sync(FULL_MASK, base, 0);
    if (n_stash > STASH_PAIRS) return false;
    __syncwarp();                                     // every lane's stash stores seen by the others
    for (int i = lane; i < n_stash; i += 32) {
        long long pos = (long long)base + i;
        if (pos < cap) { int2 e = stash[i]; cand_pt[pos] = e.x; cand_poly[pos] = e.y; }
    }
    return true;
}

// The launch's dynamic shared memory: STASH_PAIRS int2 a warp (gpu.py sizes it from the block). One declaration
// for every kernel below (a declaration in each function gives its own linkage and nvcc warns).
extern __shared__ int2 stashes[];

// PER_WARP is a template argument: with a run-time count the loops and the per-lane bookkeeping
// stayed in the code, and a warp per polygon ran a third slower at 100k x 10k on an H200.
// A polygon's candidate count is what it added to n_stash, which counts every candidate (the warp's total
// too), so no lane needs a count of its own and no reduction over the lanes is needed.
template <int PER_WARP>
__device__ __forceinline__ void candidate_fill_warp(const double2* sorted_xy, const int* sorted_pt, const double* bbox,
                                                    long long G, const GridParams* gp, const int* cell_start,
                                                    int* cand_pt, int* cand_poly, long long cap,
                                                    unsigned long long* stats) {
    int2* stash = stashes + (threadIdx.x >> 5) * STASH_PAIRS;
    const int per_warp = PER_WARP;
    long long g0 = ((blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5) * per_warp;   // warp-uniform
    int lane = threadIdx.x & 31, n_stash = 0;
    unsigned long long examined = 0, mine = 0;   // mine: lane i's polygon's candidates
    double bx0 = 0, by0 = 0, bx1 = 0, by1 = 0;
    unsigned int x0 = 0, y0 = 0, nx = 0, ncell = 0;
    long long out = 0;
    double mine_box[4] = {0.0, 0.0, 0.0, 0.0};      // lane i: polygon g0 + i's box
    if (lane < per_warp && g0 + lane < G)
        for (int k = 0; k < 4; ++k) mine_box[k] = bbox[4 * (g0 + lane) + k];
#pragma unroll
    for (int i = 0; i < per_warp; ++i) {
        warp_polygon_cells(mine_box, i, g0 + i, G, gp, bx0, by0, bx1, by1, x0, y0, nx, ncell);
        int had = n_stash;
        cell_runs<RUNS_STASH>(sorted_xy, sorted_pt, cell_start, x0, y0, nx, ncell, bx0, by0, bx1, by1, lane,
                              examined, out, cap, (int)(g0 + i), cand_pt, cand_poly, stash, n_stash);
        if (lane == i) mine = n_stash - had;
    }
    unsigned long long base;
    if (!reserve_and_write(stats, n_stash, stash, n_stash, cap, lane, cand_pt, cand_poly, base)) {
        unsigned long long before = mine;             // exclusive prefix of the polygons' counts over the lanes
#pragma unroll
        for (int off = 1; off < per_warp; off <<= 1) {
            unsigned long long v = __shfl_up_sync(FULL_MASK, before, off);
            if (lane >= off) before += v;
        }
        before -= mine;
        for (int i = 0; i < per_warp; ++i) {
            if (__shfl_sync(FULL_MASK, mine, i) == 0) continue;          // warp-uniform
            out = (long long)(base + __shfl_sync(FULL_MASK, before, i));
            polygon_cells(bbox, g0 + i, G, gp, bx0, by0, bx1, by1, x0, y0, nx, ncell);
            cell_runs<RUNS_WRITE>(sorted_xy, sorted_pt, cell_start, x0, y0, nx, ncell, bx0, by0, bx1, by1, lane,
                                  examined, out, cap, (int)(g0 + i), cand_pt, cand_poly, stash, n_stash);
        }
    }
    unsigned long long v[1] = {examined};
    block_add<1>(stats, v);
}

#define CANDIDATE_FILL(K)                                                                                        \
    extern "C" __global__ void candidate_fill_##K(const double2* sorted_xy, const int* sorted_pt,                \
                                                   const double* bbox, long long G, const GridParams* gp,        \
                                                   const int* cell_start, int* cand_pt, int* cand_poly,          \
                                                   long long cap, unsigned long long* stats) {                   \
        candidate_fill_warp<K>(sorted_xy, sorted_pt, bbox, G, gp, cell_start, cand_pt, cand_poly, cap, stats);   \
    }
CANDIDATE_FILL(2)
CANDIDATE_FILL(4)
CANDIDATE_FILL(8)
CANDIDATE_FILL(16)

// One polygon a warp, its bookkeeping kept out: candidate_fill_warp<1> ran 25-35% slower than this on an
// H200 (30 against 25 us at 100k x 10k), though it does the same work.
extern "C" __global__ void candidate_fill_1(const double2* sorted_xy, const int* sorted_pt, const double* bbox,
                                            long long G, const GridParams* gp, const int* cell_start, int* cand_pt,
                                            int* cand_poly, long long cap, unsigned long long* stats) {
    int2* stash = stashes + (threadIdx.x >> 5) * STASH_PAIRS;
    long long g = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;   // warp-uniform
    int lane = threadIdx.x & 31, n_stash = 0;
    unsigned long long examined = 0;
    double bx0 = 0, by0 = 0, bx1 = 0, by1 = 0;
    unsigned int x0 = 0, y0 = 0, nx = 0, ncell = 0;
    polygon_cells(bbox, g, G, gp, bx0, by0, bx1, by1, x0, y0, nx, ncell);
    long long out = 0;
    cell_runs<RUNS_STASH>(sorted_xy, sorted_pt, cell_start, x0, y0, nx, ncell, bx0, by0, bx1, by1, lane, examined,
                          out, cap, (int)g, cand_pt, cand_poly, stash, n_stash);
    unsigned long long base;
    if (!reserve_and_write(stats, n_stash, stash, n_stash, cap, lane, cand_pt, cand_poly, base)) {
        out = (long long)base;
        cell_runs<RUNS_WRITE>(sorted_xy, sorted_pt, cell_start, x0, y0, nx, ncell, bx0, by0, bx1, by1, lane,
                              examined, out, cap, (int)g, cand_pt, cand_poly, stash, n_stash);
    }
    unsigned long long v[1] = {examined};
    block_add<1>(stats, v);
}
