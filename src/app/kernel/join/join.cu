// Join kernels (points x polygons); common.cuh and scan.cu are compiled in front.
// ---- bounds: init_summary and polygon_bounds live in common.cuh ----------------
// Grid-stride over points with a fixed grid, so only a few hundred blocks do atomics.
extern "C" __global__ void point_extent(const double* pts, long long N, double* summary) {
    double x0 = 1.0 / 0.0, y0 = 1.0 / 0.0, x1 = -1.0 / 0.0, y1 = -1.0 / 0.0;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < N; i += (long long)gridDim.x * blockDim.x) {
        double x = pts[2 * i], y = pts[2 * i + 1];
        x0 = fmin(x0, x); y0 = fmin(y0, y); x1 = fmax(x1, x); y1 = fmax(y1, y);
    }
    block_extent(summary, x0, y0, x1, y1);
}

// ---- grid parameters, chosen on the device -------------------------------------
// The same fp64 operations as grid.py's world_scale and grid_level (frexp, not log2, so
// the level is exact on both sides): the host never has to read the world box to pick
// the grid, and v3 never does. Stored in the run's ledger (gpu.py), read by every
// kernel below through a pointer.
struct GridParams { double ox, oy, sx, sy; long long level, shift, cells, table; };

extern "C" __global__ void grid_params(const double* summary, long long G, int bias, int max_level,
                                       GridParams* gp) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    double minx = summary[0], miny = summary[1], maxx = summary[2], maxy = summary[3];
    double g = G > 1 ? (double)G : 1.0;
    double mean_w = summary[4] / g, mean_h = summary[5] / g;
    double extent = fmax(fmax(maxx - minx, maxy - miny), 1e-300);
    double cell = fmax(fmax(mean_w, mean_h), extent / (double)(1 << max_level));
    int e = 0;
    frexp(extent / cell, &e);                   // extent / cell in [2^(e-1), 2^e)
    int level = min(max(e - 1 + bias, 1), max_level);
    gp->ox = minx; gp->oy = miny;
    gp->sx = 65536.0 / fmax(maxx - minx, 1e-300); gp->sy = 65536.0 / fmax(maxy - miny, 1e-300);
    gp->level = level; gp->shift = 16 - level;
    gp->cells = 1ll << (2 * level); gp->table = gp->cells + 1;
}

// Zero the first gp->table entries of a cell table allocated for the largest level.
extern "C" __global__ void zero_table(const GridParams* gp, int* counts) {
    long long n = gp->table;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        counts[i] = 0;
}

__device__ __forceinline__ unsigned int point_cell(double x, double y, const GridParams* gp) {
    int shift = (int)gp->shift;
    return morton(quantise(x, gp->ox, gp->sx) >> shift, quantise(y, gp->oy, gp->sy) >> shift);
}

__device__ __forceinline__ void box_cells(const double* b, const GridParams* gp, unsigned int& x0, unsigned int& y0,
                                          unsigned int& x1, unsigned int& y1) {
    cell_range(b, gp->ox, gp->oy, gp->sx, gp->sy, (int)gp->shift, x0, y0, x1, y1);
}

// ---- Morton bucket sort: points grouped by their level-k Morton cell -------------
// counts has cells + 1 entries: counting into cell + 1 makes its inclusive scan the
// exclusive cell starts. The slot from the atomic places the point inside its cell.
extern "C" __global__ void point_cells(const double* pts, long long N, const GridParams* gp, unsigned int* pcell,
                                       int* slot, int* counts) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= N) return;
    unsigned int cell = point_cell(pts[2 * i], pts[2 * i + 1], gp);
    pcell[i] = cell;
    slot[i] = atomicAdd(counts + cell + 1, 1);
}

extern "C" __global__ void point_scatter(const unsigned int* pcell, const int* slot, long long N,
                                         const int* cell_start, int* sorted_pt) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= N) return;
    sorted_pt[cell_start[pcell[i]] + slot[i]] = (int)i;
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
// tests, [3] += candidate pairs with the point on the polygon's boundary.
extern "C" __global__ void __launch_bounds__(256, 4)
refine(const double2* pts, const double2* coords, const int* ring_off, const int* geom_ring_off,
       const int* cand_pt, const int* cand_poly, int C, const unsigned long long* n_cand, int within, double errA,
       unsigned long long* hits, unsigned long long* stats) {
    // v3 launches over the buffers' room and reads the real count here (never past the room).
    if (n_cand) C = (int)min(*n_cand, (unsigned long long)C);
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned long long n_exact = 0, n_edges = 0, n_boundary = 0;
    bool keep = false;
    int p = 0, g = 0;
    if (c < C) {
        p = cand_pt[c]; g = cand_poly[c];
        bool boundary = false;
        int crossings = classify_point(coords, ring_off, geom_ring_off, g, pts[p], errA, n_exact, n_edges, boundary);
        keep = within ? (crossings && !boundary) : (crossings || boundary);
        n_boundary = boundary;
    }
    unsigned long long slot = block_append(keep, stats);
    if (keep) hits[slot] = ((unsigned long long)p << 32) | (unsigned int)g;
    unsigned long long v[3] = {n_exact, n_edges, n_boundary};
    block_add<3>(stats + 1, v);
}

// ---- output sort: counting sort by point, then each point's polygons in order ----
// Launched before the hit count is known on the host (grids sized by the candidate
// count): the kernels read the count from device memory, so the host can queue
// this stage while refine still runs, and one read at the end sizes the result.
extern "C" __global__ void pair_count(const unsigned long long* hits, const unsigned long long* n_hits, int* slot,
                                      int* counts) {
    long long h = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (h >= (long long)*n_hits) return;
    slot[h] = atomicAdd(counts + (hits[h] >> 32) + 1, 1);
}

extern "C" __global__ void pair_scatter(const unsigned long long* hits, const unsigned long long* n_hits,
                                        const int* slot, const long long* start, long long* out_pt,
                                        long long* out_poly) {
    long long h = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (h >= (long long)*n_hits) return;
    long long p = (long long)(hits[h] >> 32);
    long long pos = start[p] + slot[h];
    out_pt[pos] = p;
    out_poly[pos] = (long long)(hits[h] & 0xffffffffull);
}

// A point lies in few polygons: insertion sort of its short segment is cheapest.
extern "C" __global__ void segment_sort(const long long* start, long long N, long long* out_poly) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= N) return;
    long long s = start[i], e = start[i + 1];
    for (long long a = s + 1; a < e; ++a) {
        long long v = out_poly[a], b = a - 1;
        while (b >= s && out_poly[b] > v) { out_poly[b + 1] = out_poly[b]; --b; }
        out_poly[b + 1] = v;
    }
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
        unsigned int c = point_cell(q.x, q.y, gp);
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
extern "C" __global__ void point_scatter_xy(const double2* pts, const unsigned int* pcell, const int* slot,
                                            long long N, const int* cell_start, int* sorted_pt, double2* sorted_xy) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= N) return;
    int j = cell_start[pcell[i]] + slot[i];
    sorted_pt[j] = (int)i;
    sorted_xy[j] = pts[i];
}

// A warp per polygon, as candidate_count and candidate_emit, in one launch: the warp counts
// its polygon's candidates, reserves room for them with one atomic add on stats[1], and
// scans its cells again (now in L1/L2) to write them, those below ``cap``. Pairs land in no
// particular order across warps: refine appends hits in no order either, and output_sort
// orders them. stats[0] += pairs examined, stats[1] += candidates.
extern "C" __global__ void candidate_fill(const double2* sorted_xy, const int* sorted_pt, const double* bbox,
                                          long long G, const GridParams* gp, const int* cell_start, int* cand_pt,
                                          int* cand_poly, long long cap, unsigned long long* stats) {
    long long g = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;   // warp-uniform
    int lane = threadIdx.x & 31;
    unsigned long long examined = 0, found = 0;
    double bx0 = 0, by0 = 0, bx1 = 0, by1 = 0;
    unsigned int x0 = 1, y0 = 1, x1 = 0, y1 = 0;     // no cells past the last polygon
    if (g < G) {
        const double* b = bbox + 4 * g;
        bx0 = b[0]; by0 = b[1]; bx1 = b[2]; by1 = b[3];
        box_cells(b, gp, x0, y0, x1, y1);
    }
    for (unsigned int y = y0; y <= y1; ++y)
        for (unsigned int x = x0; x <= x1; ++x) {
            unsigned int cell = morton(x, y);
            for (int j = cell_start[cell] + lane, j1 = cell_start[cell + 1]; j < j1; j += 32) {
                const double2 q = sorted_xy[j];
                ++examined;
                found += (bx0 <= q.x) & (q.x <= bx1) & (by0 <= q.y) & (q.y <= by1);
            }
        }
    unsigned long long total = found;
    for (int off = 16; off > 0; off >>= 1) total += __shfl_xor_sync(FULL_MASK, total, off);
    unsigned long long base = 0;
    if (lane == 0 && total) base = atomicAdd(stats + 1, total);
    long long out = (long long)__shfl_sync(FULL_MASK, base, 0);
    for (unsigned int y = y0; y <= y1 && total; ++y)
        for (unsigned int x = x0; x <= x1; ++x) {
            unsigned int cell = morton(x, y);
            int j0 = cell_start[cell], j1 = cell_start[cell + 1];
            for (int base = j0; base < j1; base += 32) {     // same trip count on every lane
                int j = base + lane;
                bool hit = false;
                if (j < j1) {
                    const double2 q = sorted_xy[j];
                    hit = (bx0 <= q.x) & (q.x <= bx1) & (by0 <= q.y) & (q.y <= by1);
                }
                unsigned int ballot = __ballot_sync(FULL_MASK, hit);
                long long pos = out + __popc(ballot & ((1u << lane) - 1));
                if (hit && pos < cap) { cand_pt[pos] = sorted_pt[j]; cand_poly[pos] = (int)g; }
                out += __popc(ballot);
            }
        }
    unsigned long long v[1] = {examined};
    block_add<1>(stats, v);
}
