// Overlay kernels (polygon layer A x layer B), part 1: segment extraction and the filters (polygon pairs, then
// edge pairs); overlay_area.cu, compiled after this file, takes the candidates to areas. common.cuh and scan.cu
// are compiled in front.
// An edge is named by the index k of its first coordinate (coords[k] -> coords[k + 1]);
// the last coordinate of a ring starts no edge. An "edge slot" of polygon pair p is
// slot_base[p] + k - first coordinate of a (side A) or slot_base[p] + coords(a) + k -
// first coordinate of b (side B).

__device__ __forceinline__ bool boxes_meet(double ax0, double ay0, double ax1, double ay1, const double* b) {
    return ax0 <= b[2] && b[0] <= ax1 && ay0 <= b[3] && b[1] <= ay1;
}

// ---- segment extraction: both layers' tables in one launch and one pass over their vertices ----
// A thread per polygon, A's then B's: for each of its rings twice its signed area (relative to the ring's first
// vertex, little cancellation) and its box; the polygon's box (over all its vertices, as polygon_bounds takes
// it); and, for the block, the world box and the boxes' summed and largest widths and heights into summary
// (init_summary). Four launches before (polygon_bounds and ring_tables for each layer) read every vertex twice.
struct LayerTables { const double2* c; const int *ro, *gro; double *bbox, *ra2, *rbox; };

extern "C" __global__ void polygon_tables(const double2* ca, const int* ro_a, const int* gro_a, long long GA,
                                          double* bbox_a, double* ra2_a, double* rbox_a, const double2* cb,
                                          const int* ro_b, const int* gro_b, long long GB, double* bbox_b,
                                          double* ra2_b, double* rbox_b, double* summary) {
    long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    bool on_b = t >= GA;
    LayerTables L = on_b ? LayerTables{cb, ro_b, gro_b, bbox_b, ra2_b, rbox_b}
                         : LayerTables{ca, ro_a, gro_a, bbox_a, ra2_a, rbox_a};
    long long g = on_b ? t - GA : t;
    double x0 = 1.0 / 0.0, y0 = 1.0 / 0.0, x1 = -1.0 / 0.0, y1 = -1.0 / 0.0, w = 0.0, h = 0.0;
    if (t < GA + GB) {
        for (int r = L.gro[g]; r < L.gro[g + 1]; ++r) {
            int k0 = L.ro[r], k1 = L.ro[r + 1] - 1;
            double2 o = L.c[k0];
            double s = 0.0, rx0 = o.x, ry0 = o.y, rx1 = o.x, ry1 = o.y;
            for (int k = k0; k < k1; ++k) {
                double2 a = L.c[k], b = L.c[k + 1];
                s += (a.x - o.x) * (b.y - o.y) - (b.x - o.x) * (a.y - o.y);
                rx0 = fmin(rx0, b.x); ry0 = fmin(ry0, b.y); rx1 = fmax(rx1, b.x); ry1 = fmax(ry1, b.y);
            }
            L.ra2[r] = s;
            L.rbox[4 * r] = rx0; L.rbox[4 * r + 1] = ry0; L.rbox[4 * r + 2] = rx1; L.rbox[4 * r + 3] = ry1;
            x0 = fmin(x0, rx0); y0 = fmin(y0, ry0); x1 = fmax(x1, rx1); y1 = fmax(y1, ry1);
        }
        L.bbox[4 * g] = x0; L.bbox[4 * g + 1] = y0; L.bbox[4 * g + 2] = x1; L.bbox[4 * g + 3] = y1;
        w = x1 - x0; h = y1 - y0;
    }
    bounds_summary_add(summary, x0, y0, x1, y1, w, h);
}

// ---- filter, part 1: polygon pairs with overlapping bboxes ------------------------
// B is bucketed by the grid cell of its bbox's lower-left corner (one entry per b, a
// counting sort); a's bbox meets b's only if b's corner lies in a's bbox grown down
// and left by B's largest width/height, so each a scans those cells: no duplicates.
// The grid comes from the device (common.cuh's grid_zero; in v3, corner_cells_grid), so the host reads nothing to
// choose it.
// b's corner into its cell: the cell, and its place in the cell (the table's entry c + 1 counts the cell's b's).
__device__ __forceinline__ void corner_count(int g, const double* bbox, const GridParams& gp, unsigned int* cell,
                                             int* slot, int* counts) {
    unsigned int c = grid_cell(bbox[4 * g], bbox[4 * g + 1], gp);
    cell[g] = c;
    slot[g] = atomicAdd(counts + c + 1, 1);
}

extern "C" __global__ void corner_cells(const double* bbox, int G, const GridParams* gp, unsigned int* cell, int* slot,
                                        int* counts) {
    int g = blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= G) return;
    corner_count(g, bbox, *gp, cell, slot, counts);
}

// v3: the grid chosen and B counted into its cells in one launch, where v1 and v2 launch grid_zero first (common.cuh's
// block_grid_from_summary: the first thread of each block works it out, the first block stores it in the ledger).
// The first block also zeroes the run's ``counters`` (the ledger's words after the grid: nothing before
// polygon_pairs uses them).
// The cell table is not zeroed: it is zero already, as corner_scatter left it in the run before, or as gpu.py
// zeroed it when no run had. Launched with at least one block, so the grid is stored with no b.
extern "C" __global__ void corner_cells_grid(const double* bbox, int G, const double* summary, long long G_all,
                                             int bias, int max_level, GridParams* gp_out, unsigned int* cell,
                                             int* slot, int* counts, unsigned long long* counters, int n_counters) {
    __shared__ GridParams gp;
    block_grid_from_summary(summary, G_all, bias, max_level, gp, gp_out);
    if (blockIdx.x == 0)
        for (int k = threadIdx.x; k < n_counters; k += blockDim.x) counters[k] = 0;
    int g = blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= G) return;
    corner_count(g, bbox, gp, cell, slot, counts);
}

// ``clear`` (v3; null for v1, v2): the cell table, zeroed for the next run once the scan has read it. Each busy
// cell has exactly one b with slot 0, and that b zeroes the cell's entry (as join.cu's restore_for_next_run).
__device__ __forceinline__ void corner_place(int g, const unsigned int* cell, const int* slot, const int* cell_start,
                                             int* sorted, int* clear) {
    unsigned int c = cell[g];
    int s = slot[g];
    sorted[cell_start[c] + s] = g;
    if (clear != nullptr && s == 0) clear[c + 1] = 0;
}

extern "C" __global__ void corner_scatter(const unsigned int* cell, const int* slot, int G, const int* cell_start,
                                          int* sorted, int* clear) {
    int g = blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= G) return;
    corner_place(g, cell, slot, cell_start, sorted, clear);
}

// A warp per polygon a. stats[0] += bbox tests, stats[1] += pairs, stats[2] += polygons a with more than
// PAIR_STASH pairs.
// Count pass (offsets == 0): counts[a], and a's first PAIR_STASH b's kept in its row of ``stash`` (global
// memory), so that sort_pairs copies them to their place instead of this kernel testing every bbox again.
// Emit pass (offsets != 0): those a's write each b at its a-major position, those that fit in ``room``. v1 and v2
// launch it only when their read of stats[2] says some a had more; v3 reads no sizes, so it always launches it,
// and every warp returns at once when stats[2] is zero. At 100k x 100k an a meets about 2.2 b's; a second pass
// over all of them took as long as the first (143 us on an H200).
// The launch bounds cap it at 42 registers (it takes 40, no spills): 48 of an SM's 64 warps. Its cell runs keep a
// warp's lanes busy, so the warps it gives up cost little: on an H200 the count pass took 73.3 us against 75.0 us
// held to 32 registers (with spills), one nsys capture each.
#define PAIR_STASH 16
// Polygon a's pairs, by a whole warp (a warp-uniform); tests, found and overflow add its lane's share.
__device__ __forceinline__ void warp_polygon_pairs(int a, int lane, const double* box_a, const double* box_b,
                                                   const double* summary, const GridParams* gp, const int* cell_start,
                                                   const int* sorted_b, long long* counts,
                                                   const long long* incl_offsets, int* pair_b, long long room,
                                                   int* stash, unsigned long long& tests, unsigned long long& found,
                                                   unsigned long long& overflow) {
    const double* A = box_a + 4 * (long long)a;
    // Grown by the widest and tallest bbox of both layers (summary[6], [7]): at least B's.
    double grown[4] = {A[0] - summary[6], A[1] - summary[7], A[2], A[3]};
    unsigned int x0, y0, x1, y1;
    box_cells(grown, gp, x0, y0, x1, y1);
    unsigned int nx = x1 - x0 + 1, ncell = x1 >= x0 && y1 >= y0 ? nx * (y1 - y0 + 1) : 0;   // an empty box: none
    long long out = incl_offsets ? (a == 0 ? 0 : incl_offsets[a - 1]) : 0;
    int* row = stash + (long long)a * PAIR_STASH;
    // The cells' runs of b laid end to end across the lanes (common.cuh's warp_cell_runs): a cell holds one
    // or two b's, so a warp that took one cell at a time had one or two of its 32 lanes busy.
    for (unsigned int c0 = 0; c0 < ncell; c0 += 32) {          // warp-uniform bounds
        int first, incl, excl;
        int total = warp_cell_runs(cell_start, x0, y0, nx, ncell, c0, lane, first, incl, excl);
        for (int base = 0; base < total; base += 32) {          // the same trip count on every lane
            int f = base + lane;
            int j = run_item(f, first, incl, excl);
            int b = 0;
            bool hit = false;
            if (f < total) {
                b = sorted_b[j];
                hit = boxes_meet(A[0], A[1], A[2], A[3], box_b + 4 * (long long)b);
                ++tests;
            }
            unsigned int ballot = __ballot_sync(FULL_MASK, hit);
            long long pos = out + __popc(ballot & ((1u << lane) - 1));
            if (hit) {
                if (incl_offsets) { if (pos < room) pair_b[pos] = b; }
                else if (pos < PAIR_STASH) row[pos] = b;
            }
            out += __popc(ballot);
            found += hit;
        }
    }
    if (!incl_offsets && lane == 0) { counts[a] = out; overflow += out > PAIR_STASH; }   // out: a's pairs
}

extern "C" __global__ void __launch_bounds__(512, 3)
polygon_pairs(const double* box_a, int GA, const double* box_b, const double* summary, const GridParams* gp,
              const int* cell_start, const int* sorted_b, long long* counts, const long long* incl_offsets,
              int* pair_b, long long room, int* stash, unsigned long long* stats) {
    if (incl_offsets && stats[2] == 0) return;     // the emit pass, with no a past its stash (no barrier below)
    int a = (int)((blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5);   // warp-uniform
    int lane = threadIdx.x & 31;
    unsigned long long tests = 0, found = 0, overflow = 0;
    if (a < GA && !(incl_offsets && counts[a] <= PAIR_STASH))
        warp_polygon_pairs(a, lane, box_a, box_b, summary, gp, cell_start, sorted_b, counts, incl_offsets, pair_b,
                           room, stash, tests, found, overflow);
    unsigned long long v[3] = {tests, found, overflow};
    if (!incl_offsets) block_add<3>(stats, v);
}

// Pairs of one a in ascending b (insertion sort of a short segment), and each pair's a. An a with at most
// PAIR_STASH pairs has them in its stash row (polygon_pairs' count pass); the emit pass wrote the others'.
// Pairs past ``room`` are not written (v3: the run found more pairs than its buffers hold, and runs again).
// With ``slots`` (v3), each pair's edge slots too, coords(a) + coords(b), and their total into slot_total[0]
// (the host checks it against the slot tables' room when the run is done); v1 and v2 count them in edge_pairs.
// With ``summary`` (v3), the first thread sets it back to its identities for the next run: polygon_pairs, the
// last to read it, is done. That saves the next run init_summary's launch (gpu.py launches it when no run left
// the summary so, and relaunches the bounds when a run goes again after a room grew).
// Polygon a's pairs in place and their slots (with ``slots``): returns their slots' total.
__device__ __forceinline__ unsigned long long sort_pairs_of(int a, const long long* incl_offsets, long long room,
                                                            const int* stash, int* pair_a, int* pair_b, const int* ro_a,
                                                            const int* gro_a, const int* ro_b, const int* gro_b,
                                                            long long* slots) {
    unsigned long long total = 0;
    long long s = a == 0 ? 0 : incl_offsets[a - 1], found = incl_offsets[a] - s, e = min(incl_offsets[a], room);
    if (found <= PAIR_STASH)
        for (long long i = s; i < e; ++i) pair_b[i] = stash[(long long)a * PAIR_STASH + (i - s)];
    for (long long i = s; i < e; ++i) pair_a[i] = a;
    for (long long i = s + 1; i < e; ++i) {
        int v = pair_b[i];
        long long j = i - 1;
        while (j >= s && pair_b[j] > v) { pair_b[j + 1] = pair_b[j]; --j; }
        pair_b[j + 1] = v;
    }
    if (slots) {
        int coords_a = ro_a[gro_a[a + 1]] - ro_a[gro_a[a]];
        for (long long i = s; i < e; ++i) {
            int b = pair_b[i];
            long long n = (long long)coords_a + (ro_b[gro_b[b + 1]] - ro_b[gro_b[b]]);
            slots[i] = n;
            total += n;
        }
    }
    return total;
}

extern "C" __global__ void sort_pairs(const long long* incl_offsets, int GA, long long room, const int* stash,
                                      int* pair_a, int* pair_b, const int* ro_a, const int* gro_a, const int* ro_b,
                                      const int* gro_b, long long* slots, unsigned long long* slot_total,
                                      double* summary) {
    int a = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned long long total = 0;
    if (summary != nullptr && a == 0)
        for (int k = 0; k < 8; ++k) summary_identity(summary, k);
    if (a < GA) total = sort_pairs_of(a, incl_offsets, room, stash, pair_a, pair_b, ro_a, gro_a, ro_b, gro_b, slots);
    if (slots) {             // block-uniform: the whole block reaches the barrier
        unsigned long long v[1] = {total};
        block_add<1>(slot_total, v);
    }
}

// ---- filter, part 2: edge pairs of each polygon pair, brute force -----------------
// A warp per pair; lanes take a's edges that reach b's bbox, and test each against
// every edge of b that reaches a's bbox. Count pass: counts[p] and per-pair slots
// (coords(a) + coords(b)); emit pass: (pair, ka, kb) at the pair's offset.
// stats[0] += MBR tests, stats[1] += candidates.
extern "C" __global__ void edge_pairs(const double2* ca, const int* ro_a, const int* gro_a, const double* box_a,
                                      const double2* cb, const int* ro_b, const int* gro_b, const double* box_b,
                                      const int* pair_a, const int* pair_b, int P, long long* counts,
                                      long long* slots, const long long* incl_offsets, int* out_p, int* out_ka,
                                      int* out_kb, unsigned long long* stats) {
    int p = (int)((blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5);   // warp-uniform
    int lane = threadIdx.x & 31;
    unsigned long long tests = 0, found = 0;
    if (p < P) {
        int a = pair_a[p], b = pair_b[p];
        const double* BA = box_a + 4 * (long long)a;
        const double* BB = box_b + 4 * (long long)b;
        int a0 = ro_a[gro_a[a]], a1 = ro_a[gro_a[a + 1]];
        int b0 = ro_b[gro_b[b]], b1 = ro_b[gro_b[b + 1]];
        long long out = incl_offsets ? (p == 0 ? 0 : incl_offsets[p - 1]) : 0;
        int ring = gro_a[a], ring_end = ro_a[ring + 1] - 1;
        // Lanes walk a's coordinates in strides of 32; ring ends start no edge.
        for (int base = a0; base < a1; base += 32) {
            int k = base + lane;
            int mine = 0;
            double2 e0, e1;
            bool live = false;
            if (k < a1) {
                while (k >= ring_end + 1) { ++ring; ring_end = ro_a[ring + 1] - 1; }
                if (k < ring_end) {
                    e0 = ca[k]; e1 = ca[k + 1];
                    live = boxes_meet(fmin(e0.x, e1.x), fmin(e0.y, e1.y), fmax(e0.x, e1.x), fmax(e0.y, e1.y), BB);
                }
            }
            if (live) {
                double ex0 = fmin(e0.x, e1.x), ey0 = fmin(e0.y, e1.y), ex1 = fmax(e0.x, e1.x), ey1 = fmax(e0.y, e1.y);
                int rb = gro_b[b], rb_end = ro_b[rb + 1] - 1;
                for (int kb = b0; kb < b1; ++kb) {
                    if (kb == rb_end) { ++rb; rb_end = ro_b[rb + 1] - 1; continue; }
                    double2 f0 = cb[kb], f1 = cb[kb + 1];
                    double fx0 = fmin(f0.x, f1.x), fy0 = fmin(f0.y, f1.y), fx1 = fmax(f0.x, f1.x), fy1 = fmax(f0.y, f1.y);
                    if (!boxes_meet(fx0, fy0, fx1, fy1, BA)) continue;     // b's edge misses a's bbox
                    ++tests;
                    if (ex0 <= fx1 && fx0 <= ex1 && ey0 <= fy1 && fy0 <= ey1) {
                        if (incl_offsets) {
                            // Position: pairs before this lane's, in lane order, then in kb order.
                            mine++;
                        }
                        ++found;
                    }
                }
            }
            if (incl_offsets) {
                // Exclusive scan of this round's per-lane counts gives each lane's start.
                int incl = mine;
                for (int off = 1; off < 32; off <<= 1) {
                    int up = __shfl_up_sync(FULL_MASK, incl, off);
                    if (lane >= off) incl += up;
                }
                long long pos = out + incl - mine;
                if (mine) {
                    int rb = gro_b[b], rb_end = ro_b[rb + 1] - 1;
                    double ex0 = fmin(e0.x, e1.x), ey0 = fmin(e0.y, e1.y), ex1 = fmax(e0.x, e1.x), ey1 = fmax(e0.y, e1.y);
                    for (int kb = b0; kb < b1; ++kb) {
                        if (kb == rb_end) { ++rb; rb_end = ro_b[rb + 1] - 1; continue; }
                        double2 f0 = cb[kb], f1 = cb[kb + 1];
                        double fx0 = fmin(f0.x, f1.x), fy0 = fmin(f0.y, f1.y), fx1 = fmax(f0.x, f1.x), fy1 = fmax(f0.y, f1.y);
                        if (!boxes_meet(fx0, fy0, fx1, fy1, BA)) continue;
                        if (ex0 <= fx1 && fx0 <= ex1 && ey0 <= fy1 && fy0 <= ey1) {
                            out_p[pos] = p; out_ka[pos] = k; out_kb[pos] = kb; ++pos;
                        }
                    }
                }
                out += __shfl_sync(FULL_MASK, incl, 31);
            }
        }
        if (!incl_offsets) {
            unsigned long long t = found;
            for (int off = 16; off > 0; off >>= 1) t += __shfl_down_sync(FULL_MASK, t, off);
            if (lane == 0) { counts[p] = (long long)t; slots[p] = (long long)(a1 - a0) + (b1 - b0); }
        }
    }
    unsigned long long v[2] = {tests, found};
    if (!incl_offsets) block_add<2>(stats, v);
}

// ---- v2 filter, part 2: sort-and-sweep within each polygon pair -------------------
// The warp gathers b's edges that reach a's bbox into shared memory, sorts them by
// lowest y, and each lane (one of a's edges) tests only the prefix whose lowest y is
// <= its highest y. Pairs whose b has more than SWEEP_MAX near edges fall back to
// scanning b in order (same tests counted). stats as edge_pairs.
#define SWEEP_MAX 64
#define SWEEP_WARPS 8   // blockDim.x must be 256

extern "C" __global__ void __launch_bounds__(256)
edge_pairs_sweep(const double2* ca, const int* ro_a, const int* gro_a, const double* box_a,
                 const double2* cb, const int* ro_b, const int* gro_b, const double* box_b,
                 const int* pair_a, const int* pair_b, int P, long long* counts, long long* slots,
                 const long long* incl_offsets, int* out_p, int* out_ka, int* out_kb, unsigned long long* stats) {
    __shared__ double s_box[SWEEP_WARPS][SWEEP_MAX][4];   // xlo, ylo, xhi, yhi
    __shared__ int s_k[SWEEP_WARPS][SWEEP_MAX];
    int p = (int)((blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5);   // warp-uniform
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    unsigned long long tests = 0, found = 0;
    if (p < P) {
        int a = pair_a[p], b = pair_b[p];
        const double* BA = box_a + 4 * (long long)a;
        const double* BB = box_b + 4 * (long long)b;
        int a0 = ro_a[gro_a[a]], a1 = ro_a[gro_a[a + 1]];
        int b0 = ro_b[gro_b[b]], b1 = ro_b[gro_b[b + 1]];
        // Gather b's near edges (ballot compaction), in coordinate order.
        int n = 0;
        for (int base = b0; base < b1; base += 32) {
            int kb = base + lane;
            bool near = false;
            double2 f0, f1;
            if (kb < b1 - 1) {
                // kb starts an edge unless it is the last coordinate of its ring: a ring's
                // last coordinate repeats its first, so the next coordinate starts a new ring.
                int r = gro_b[b];
                while (ro_b[r + 1] <= kb) ++r;
                if (kb != ro_b[r + 1] - 1) {
                    f0 = cb[kb]; f1 = cb[kb + 1];
                    near = fmin(f0.x, f1.x) <= BA[2] && BA[0] <= fmax(f0.x, f1.x) &&
                           fmin(f0.y, f1.y) <= BA[3] && BA[1] <= fmax(f0.y, f1.y);
                }
            }
            unsigned int ballot = __ballot_sync(FULL_MASK, near);
            int pos = n + __popc(ballot & ((1u << lane) - 1));
            if (near && pos < SWEEP_MAX) {
                s_box[w][pos][0] = fmin(f0.x, f1.x); s_box[w][pos][1] = fmin(f0.y, f1.y);
                s_box[w][pos][2] = fmax(f0.x, f1.x); s_box[w][pos][3] = fmax(f0.y, f1.y);
                s_k[w][pos] = kb;
            }
            n += __popc(ballot);
        }
        __syncwarp();
        bool fits = n <= SWEEP_MAX;
        if (fits && lane == 0) {   // insertion sort by lowest y: a few dozen entries
            for (int i = 1; i < n; ++i) {
                double v[4] = {s_box[w][i][0], s_box[w][i][1], s_box[w][i][2], s_box[w][i][3]};
                int kv = s_k[w][i], j = i - 1;
                while (j >= 0 && s_box[w][j][1] > v[1]) {
                    for (int c = 0; c < 4; ++c) s_box[w][j + 1][c] = s_box[w][j][c];
                    s_k[w][j + 1] = s_k[w][j];
                    --j;
                }
                for (int c = 0; c < 4; ++c) s_box[w][j + 1][c] = v[c];
                s_k[w][j + 1] = kv;
            }
        }
        __syncwarp();
        long long out = incl_offsets ? (p == 0 ? 0 : incl_offsets[p - 1]) : 0;
        int ring = gro_a[a], ring_end = ro_a[ring + 1] - 1;
        for (int base = a0; base < a1; base += 32) {
            int k = base + lane, mine = 0;
            double ex0 = 0, ey0 = 0, ex1 = 0, ey1 = 0;
            bool live = false;
            if (k < a1) {
                while (k >= ring_end + 1) { ++ring; ring_end = ro_a[ring + 1] - 1; }
                if (k < ring_end) {
                    double2 e0 = ca[k], e1 = ca[k + 1];
                    ex0 = fmin(e0.x, e1.x); ey0 = fmin(e0.y, e1.y); ex1 = fmax(e0.x, e1.x); ey1 = fmax(e0.y, e1.y);
                    live = ex0 <= BB[2] && BB[0] <= ex1 && ey0 <= BB[3] && BB[1] <= ey1;
                }
            }
            for (int pass = 0; pass < (incl_offsets ? 2 : 1); ++pass) {
                long long pos = 0;
                if (pass == 1) {   // emit: this lane's start from an exclusive scan of the counts
                    int incl = mine;
                    for (int off = 1; off < 32; off <<= 1) {
                        int up = __shfl_up_sync(FULL_MASK, incl, off);
                        if (lane >= off) incl += up;
                    }
                    pos = out + incl - mine;
                    out += __shfl_sync(FULL_MASK, incl, 31);
                }
                if (live) {
                    if (fits) {
                        for (int j = 0; j < n && s_box[w][j][1] <= ey1; ++j) {
                            const double* f = s_box[w][j];
                            bool hit = ex0 <= f[2] && f[0] <= ex1 && f[3] >= ey0;
                            if (pass == 0) { ++tests; if (hit) { ++found; ++mine; } }
                            else if (hit) { out_p[pos] = p; out_ka[pos] = k; out_kb[pos] = s_k[w][j]; ++pos; }
                        }
                    } else {
                        int r = gro_b[b], r_end = ro_b[r + 1] - 1;
                        for (int kb = b0; kb < b1; ++kb) {
                            if (kb == r_end) { ++r; r_end = ro_b[r + 1] - 1; continue; }
                            double2 f0 = cb[kb], f1 = cb[kb + 1];
                            double fx0 = fmin(f0.x, f1.x), fy0 = fmin(f0.y, f1.y);
                            double fx1 = fmax(f0.x, f1.x), fy1 = fmax(f0.y, f1.y);
                            if (!(fx0 <= BA[2] && BA[0] <= fx1 && fy0 <= BA[3] && BA[1] <= fy1)) continue;
                            if (fy0 > ey1) continue;
                            bool hit = ex0 <= fx1 && fx0 <= ex1 && fy1 >= ey0;
                            if (pass == 0) { ++tests; if (hit) { ++found; ++mine; } }
                            else if (hit) { out_p[pos] = p; out_ka[pos] = k; out_kb[pos] = kb; ++pos; }
                        }
                    }
                }
            }
        }
        if (!incl_offsets) {
            unsigned long long t = found;
            for (int off = 16; off > 0; off >>= 1) t += __shfl_down_sync(FULL_MASK, t, off);
            if (lane == 0) { counts[p] = (long long)t; slots[p] = (long long)(a1 - a0) + (b1 - b0); }
        }
    }
    unsigned long long v[2] = {tests, found};
    if (!incl_offsets) block_add<2>(stats, v);
}
