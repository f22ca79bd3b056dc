// Device code shared by join.cu and the overlay's kernels (gpu_build.py puts it in front of each).
// Compiled with NVRTC, --fmad=false: the orientation filter's error bound assumes
// separately rounded multiply and subtract, and CPU/GPU must compute identical
// Morton codes. Coordinates are interleaved fp64 (x, y); offsets are int32, CSR style.

#define FULL_MASK 0xffffffffu

__device__ __forceinline__ unsigned int quantise(double x, double origin, double scale) {
    double q = floor((x - origin) * scale);
    q = fmin(fmax(q, 0.0), 65535.0);
    return (unsigned int)q;
}

__device__ __forceinline__ unsigned int spread_bits(unsigned int v) {
    v &= 0x0000FFFFu;
    v = (v | (v << 8)) & 0x00FF00FFu;
    v = (v | (v << 4)) & 0x0F0F0F0Fu;
    v = (v | (v << 2)) & 0x33333333u;
    v = (v | (v << 1)) & 0x55555555u;
    return v;
}

__device__ __forceinline__ unsigned int morton(unsigned int qx, unsigned int qy) {
    return spread_bits(qx) | (spread_bits(qy) << 1);
}

__device__ __forceinline__ void atomic_min_double(double* addr, double v) {
    unsigned long long* a = (unsigned long long*)addr;
    unsigned long long old = *a;
    while (v < __longlong_as_double(old)) {
        unsigned long long prev = atomicCAS(a, old, __double_as_longlong(v));
        if (prev == old) break;
        old = prev;
    }
}

__device__ __forceinline__ void atomic_max_double(double* addr, double v) {
    unsigned long long* a = (unsigned long long*)addr;
    unsigned long long old = *a;
    while (v > __longlong_as_double(old)) {
        unsigned long long prev = atomicCAS(a, old, __double_as_longlong(v));
        if (prev == old) break;
        old = prev;
    }
}

// How many of a buffer's ``n`` entries are live: ``n`` itself, or where the count is a device word (``n_dev``,
// written by an earlier kernel: a buffer sized by a room kept from run to run, whose real length the host has not
// read), that count, at most ``n`` (a count past the room means the run overflowed it and runs again).
__device__ __forceinline__ long long live_count(long long n, const unsigned long long* n_dev) {
    return n_dev ? (long long)min((unsigned long long)n, *n_dev) : n;
}

// For kernels launched cooperatively (join_fused.cu's, overlay_v4.cu's): steps that each need the one before
// done on the whole grid wait here instead of ending a kernel.
// Every block of the grid waits here until all have arrived, their writes before it visible to all after it
// (cooperative groups' scheme: each block adds 1 to ``arrived``, block 0 adds 2^31 - (blocks - 1), so the word's top
// bit flips once every block is in and the word needs no reset; it starts at any value, zero when allocated).
__device__ __forceinline__ void grid_barrier(unsigned int* arrived) {
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned int add = blockIdx.x == 0 ? 0x80000000u - (gridDim.x - 1) : 1u;
        __threadfence();                                     // this block's writes before its arrival
        const unsigned int before = atomicAdd(arrived, add);
        while (((before ^ *(volatile unsigned int*)arrived) & 0x80000000u) == 0) {
        }
        __threadfence();
    }
    __syncthreads();
}

// Block-wide aggregation: one atomic per block and counter instead of one per thread
// (same-address atomics serialise in L2). Every thread of the block must call these.
template <int K>
__device__ __forceinline__ void block_add(unsigned long long* target, const unsigned long long (&v)[K]) {
    __shared__ unsigned long long part[K][32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    for (int k = 0; k < K; ++k) {
        unsigned long long x = v[k];
        for (int off = 16; off > 0; off >>= 1) x += __shfl_down_sync(FULL_MASK, x, off);
        if (lane == 0) part[k][warp] = x;
    }
    __syncthreads();
    if (warp == 0) {
        for (int k = 0; k < K; ++k) {
            unsigned long long x = lane < warps ? part[k][lane] : 0ull;
            for (int off = 16; off > 0; off >>= 1) x += __shfl_down_sync(FULL_MASK, x, off);
            if (lane == 0 && x) atomicAdd(target + k, x);
        }
    }
}

// Block-wide sums as block_add, with no barrier at the end: each warp adds its sums into the block's shared
// words when it is done, and the last warp of the block to get there adds them to ``target``. block_add's
// closing __syncthreads held every warp of a block until its slowest was done: where a warp's work depends
// on its item (a polygon pair's edges, a ring's point-in-polygon test), ncu on an H200 showed edge_pairs_warp's
// warps stalled on that barrier for 36% of their cycles and area_rings_flip's for 45%; without it overlay v3
// took 1,862.7 against 1,936.7 us after the build at 100k x 100k (16 interleaved rounds). join's
// candidate_fill gained nothing measurable from it (383.8 against 385.6 us at 1M x 100k). The words are zeroed
// at the kernel's start (warp_sums_init), behind one barrier that a block's warps reach together. Every warp
// of the block calls warp_sums_add once, with all its lanes.
template <int K>
struct WarpSums {
    unsigned long long v[K];
    unsigned int done;
};

template <int K>
__device__ __forceinline__ void warp_sums_init(WarpSums<K>& s) {
    if (threadIdx.x < K) s.v[threadIdx.x] = 0ull;
    if (threadIdx.x == 0) s.done = 0u;
    __syncthreads();
}

template <int K>
__device__ __forceinline__ void warp_sums_add(WarpSums<K>& s, unsigned long long* target,
                                              const unsigned long long (&v)[K]) {
    int lane = threadIdx.x & 31;
    for (int k = 0; k < K; ++k) {
        unsigned long long x = v[k];
        for (int off = 16; off > 0; off >>= 1) x += __shfl_down_sync(FULL_MASK, x, off);
        if (lane == 0 && x) atomicAdd(&s.v[k], x);
    }
    if (lane == 0) {
        __threadfence_block();                    // this warp's sums before its count of warps done
        if (atomicAdd(&s.done, 1u) == ((blockDim.x + 31) >> 5) - 1) {
            __threadfence_block();
            for (int k = 0; k < K; ++k) {
                unsigned long long x = atomicAdd(&s.v[k], 0ull);
                if (x) atomicAdd(target + k, x);
            }
        }
    }
}

// Slot of this thread's item in an append-only buffer: one atomic a warp, and no barrier (block_append's two
// hold a block's warps until the slowest has its item). Order inside a warp is deterministic, across warps not.
// For items that are few (area_rings_flip's cut rings): join's refine, whose hits are many, ran 12 us slower at
// 1M x 100k with a warp's atomic on its hit counter than with block_append's one a block (H200).
__device__ __forceinline__ unsigned long long warp_append(bool keep, unsigned long long* counter) {
    int lane = threadIdx.x & 31;
    unsigned int ballot = __ballot_sync(FULL_MASK, keep);
    unsigned long long base = 0;
    if (lane == 0 && ballot) base = atomicAdd(counter, (unsigned long long)__popc(ballot));
    return __shfl_sync(FULL_MASK, base, 0) + __popc(ballot & ((1u << lane) - 1));
}

// Room for ``count`` items of this thread in an append-only buffer: the index of its first. One atomic a warp (its
// lanes' counts summed by shuffles) and no barrier; every lane of the warp must call it. refine_pairs appends up to
// four records a thread this way.
__device__ __forceinline__ unsigned long long warp_reserve(unsigned int count, unsigned long long* counter) {
    int lane = threadIdx.x & 31;
    unsigned int incl = count;
    for (int off = 1; off < 32; off <<= 1) {
        unsigned int up = __shfl_up_sync(FULL_MASK, incl, off);
        if (lane >= off) incl += up;
    }
    unsigned long long base = 0;
    if (lane == 31 && incl) base = atomicAdd(counter, (unsigned long long)incl);     // lane 31 holds the total
    return __shfl_sync(FULL_MASK, base, 31) + (incl - count);
}

// Slot of this thread's item in an append-only buffer: one atomic per block; order
// inside the block is deterministic, across blocks it is not (output_sort orders).
__device__ __forceinline__ unsigned long long block_append(bool keep, unsigned long long* counter) {
    __shared__ unsigned int warp_base[32];
    __shared__ unsigned long long block_base;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    unsigned int ballot = __ballot_sync(FULL_MASK, keep);
    if (lane == 0) warp_base[warp] = __popc(ballot);
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned int total = 0;
        for (int w = 0; w < warps; ++w) { unsigned int c = warp_base[w]; warp_base[w] = total; total += c; }
        block_base = total ? atomicAdd(counter, (unsigned long long)total) : 0ull;
    }
    __syncthreads();
    return block_base + warp_base[warp] + __popc(ballot & ((1u << lane) - 1));
}

__device__ __forceinline__ void block_extent(double* summary, double x0, double y0, double x1, double y1) {
    __shared__ double part[4][32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    for (int off = 16; off > 0; off >>= 1) {
        x0 = fmin(x0, __shfl_down_sync(FULL_MASK, x0, off));
        y0 = fmin(y0, __shfl_down_sync(FULL_MASK, y0, off));
        x1 = fmax(x1, __shfl_down_sync(FULL_MASK, x1, off));
        y1 = fmax(y1, __shfl_down_sync(FULL_MASK, y1, off));
    }
    if (lane == 0) { part[0][warp] = x0; part[1][warp] = y0; part[2][warp] = x1; part[3][warp] = y1; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < warps; ++w) {
            x0 = fmin(x0, part[0][w]); y0 = fmin(y0, part[1][w]);
            x1 = fmax(x1, part[2][w]); y1 = fmax(y1, part[3][w]);
        }
        atomic_min_double(summary, x0); atomic_min_double(summary + 1, y0);
        atomic_max_double(summary + 2, x1); atomic_max_double(summary + 3, y1);
    }
}

// ---- robust orientation: Shewchuk's filter, exact expansion fallback ----------
__device__ __forceinline__ void two_sum(double a, double b, double& s, double& e) {
    s = a + b; double bv = s - a; double av = s - bv; e = (a - av) + (b - bv);
}
__device__ __forceinline__ void two_diff(double a, double b, double& d, double& e) {
    d = a - b; double bv = a - d; double av = d + bv; e = (a - av) + (bv - b);
}
__device__ __forceinline__ void two_prod(double a, double b, double& p, double& e) {
    p = a * b; e = fma(a, b, -p);
}

// The 16 doubles whose exact sum is (a - c) x (b - c), grown into a nonoverlapping expansion e (components by
// increasing magnitude, zeros kept): robust.py's _orient_terms and _grow, the same operations.
__device__ __forceinline__ void orient2d_expansion(double ax, double ay, double bx, double by, double cx, double cy,
                                                   double (&e)[16]) {
    double acx, acxt, bcy, bcyt, acy, acyt, bcx, bcxt;
    two_diff(ax, cx, acx, acxt); two_diff(by, cy, bcy, bcyt);
    two_diff(ay, cy, acy, acyt); two_diff(bx, cx, bcx, bcxt);
    double t[16];
    two_prod(acx, bcy, t[0], t[1]);    two_prod(acx, bcyt, t[2], t[3]);
    two_prod(acxt, bcy, t[4], t[5]);   two_prod(acxt, bcyt, t[6], t[7]);
    two_prod(-acy, bcx, t[8], t[9]);   two_prod(-acy, bcxt, t[10], t[11]);
    two_prod(-acyt, bcx, t[12], t[13]); two_prod(-acyt, bcxt, t[14], t[15]);
    int n = 1;
    e[0] = t[0];
    for (int i = 1; i < 16; ++i) {          // grow_expansion: nonoverlapping, increasing
        double q = t[i];
        for (int j = 0; j < n; ++j) { double s, h; two_sum(q, e[j], s, h); e[j] = h; q = s; }
        e[n++] = q;
    }
}

// Exact sign of (a - c) x (b - c); rare, so kept out of line to spare registers.
__device__ __noinline__ int orient2d_exact(double ax, double ay, double bx, double by, double cx, double cy) {
    double e[16];
    orient2d_expansion(ax, ay, bx, by, cx, cy, e);
    for (int j = 15; j >= 0; --j)
        if (e[j] != 0.0) return e[j] > 0.0 ? 1 : -1;
    return 0;
}

// Shewchuk's filter. detleft and detright of opposite (or zero) signs make det exact in sign: their signs are
// compared, not multiplied (the product underflows to zero near 1e-80 and skipped the exact path there).
__device__ __forceinline__ int orient2d(double ax, double ay, double bx, double by, double cx, double cy,
                                        double errA, unsigned long long& n_exact) {
    double detleft = (ax - cx) * (by - cy);
    double detright = (ay - cy) * (bx - cx);
    double det = detleft - detright;
    double errbound = errA * (fabs(detleft) + fabs(detright));
    if (fabs(det) < errbound && ((detleft > 0.0 && detright > 0.0) || (detleft < 0.0 && detright < 0.0))) {
        ++n_exact;
        return orient2d_exact(ax, ay, bx, by, cx, cy);
    }
    return (det > 0.0) - (det < 0.0);
}

// ---- bounds: per-polygon bbox, world box and summed bbox sizes in one pass ------
// summary = [minx, miny, maxx, maxy, sum_w, sum_h, max_w, max_h], initialised by init_summary (or by the
// launch that starts a run, as join's init_run): +inf for the minima, -inf for the maxima, 0 for the rest.
__device__ __forceinline__ void summary_identity(double* summary, int lane) {
    if (lane < 8) summary[lane] = lane < 2 ? 1.0 / 0.0 : (lane < 4 ? -1.0 / 0.0 : 0.0);
}

extern "C" __global__ void init_summary(double* summary) { summary_identity(summary, threadIdx.x); }

__device__ __forceinline__ void bounds_summary_add(double* summary, double x0, double y0, double x1, double y1,
                                                   double w, double h);

// A geometry's vertices run from its first ring's start to its last ring's end: read through the two offset tables
// here rather than gathered into a third table by an extra launch. A group of LANES consecutive lanes (1, 2, 4 or 8)
// takes a polygon, striding over its vertices, so a warp's loads cover its polygons' vertex runs side by side; ``t``
// is the thread's index among the polygon threads, polygon t / LANES. The box is written by the group's first lane,
// which alone adds its size to the summary. Every thread of the block must call it (shuffles, then block_extent's
// barrier). LANES is a template argument: at 1 the loop is the thread-a-polygon one, a plain stride, no shuffles.
template <int LANES>
__device__ __forceinline__ void polygon_bounds(const double* coords, const int* ring_off, const int* geom_ring_off,
                                               long long G, double* bbox, double* summary, long long t) {
    const long long g = t / LANES;
    const int sub = (int)(t % LANES);
    double x0 = 1.0 / 0.0, y0 = 1.0 / 0.0, x1 = -1.0 / 0.0, y1 = -1.0 / 0.0, w = 0.0, h = 0.0;
    if (g < G) {
        const double2* xy = reinterpret_cast<const double2*>(coords);     // one 16-byte load a vertex
#pragma unroll 4
        for (int k = ring_off[geom_ring_off[g]] + sub, k1 = ring_off[geom_ring_off[g + 1]]; k < k1; k += LANES) {
            const double2 v = xy[k];
            x0 = fmin(x0, v.x); y0 = fmin(y0, v.y); x1 = fmax(x1, v.x); y1 = fmax(y1, v.y);
        }
    }
    for (int off = LANES / 2; off > 0; off >>= 1) {      // the group's box, in each of its lanes
        x0 = fmin(x0, __shfl_xor_sync(FULL_MASK, x0, off));
        y0 = fmin(y0, __shfl_xor_sync(FULL_MASK, y0, off));
        x1 = fmax(x1, __shfl_xor_sync(FULL_MASK, x1, off));
        y1 = fmax(y1, __shfl_xor_sync(FULL_MASK, y1, off));
    }
    if (g < G && sub == 0) {
        reinterpret_cast<double2*>(bbox)[2 * g] = make_double2(x0, y0);
        reinterpret_cast<double2*>(bbox)[2 * g + 1] = make_double2(x1, y1);
        w = x1 - x0; h = y1 - y0;
    }
    bounds_summary_add(summary, x0, y0, x1, y1, w, h);
}

// A block's polygon boxes (each thread's, empty past the last polygon: w = h = 0) into summary: the world box,
// the sums of the widths and heights, and their maxima. The whole block must call it.
__device__ __forceinline__ void bounds_summary_add(double* summary, double x0, double y0, double x1, double y1,
                                                   double w, double h) {
    __shared__ double wh[4][32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    double mw = w, mh = h;
    for (int off = 16; off > 0; off >>= 1) {
        w += __shfl_down_sync(FULL_MASK, w, off);
        h += __shfl_down_sync(FULL_MASK, h, off);
        mw = fmax(mw, __shfl_down_sync(FULL_MASK, mw, off));
        mh = fmax(mh, __shfl_down_sync(FULL_MASK, mh, off));
    }
    if (lane == 0) { wh[0][warp] = w; wh[1][warp] = h; wh[2][warp] = mw; wh[3][warp] = mh; }
    block_extent(summary, x0, y0, x1, y1);   // its __syncthreads also publishes wh
    if (threadIdx.x == 0) {
        for (int k = 1; k < (int)((blockDim.x + 31) >> 5); ++k) {
            w += wh[0][k]; h += wh[1][k]; mw = fmax(mw, wh[2][k]); mh = fmax(mh, wh[3][k]);
        }
        atomicAdd(summary + 4, w); atomicAdd(summary + 5, h);
        atomic_max_double(summary + 6, mw); atomic_max_double(summary + 7, mh);   // widths are >= 0
    }
}



__device__ __forceinline__ void cell_range(const double* b, double ox, double oy, double sx, double sy, int shift,
                                           unsigned int& x0, unsigned int& y0, unsigned int& x1, unsigned int& y1) {
    x0 = quantise(b[0], ox, sx) >> shift; x1 = quantise(b[2], ox, sx) >> shift;
    y0 = quantise(b[1], oy, sy) >> shift; y1 = quantise(b[3], oy, sy) >> shift;
}

// ---- grid parameters, chosen on the device -------------------------------------
// The same fp64 operations as grid.py's world_scale and grid_level (frexp, not log2, so
// the level is exact on both sides): the host never has to read the world box to pick
// the grid. Stored in the run's ledger (the kernels' gpu.py), read by the kernels that
// bucket or scan cells through a pointer.
struct GridParams { double ox, oy, sx, sy; long long level, shift, cells, table; };

__device__ __forceinline__ void grid_from_summary(const double* summary, long long G, int bias, int max_level,
                                                  GridParams& gp) {
    double minx = summary[0], miny = summary[1], maxx = summary[2], maxy = summary[3];
    double g = G > 1 ? (double)G : 1.0;
    double mean_w = summary[4] / g, mean_h = summary[5] / g;
    double extent = fmax(fmax(maxx - minx, maxy - miny), 1e-300);
    double cell = fmax(fmax(mean_w, mean_h), extent / (double)(1 << max_level));
    int e = 0;
    frexp(extent / cell, &e);                   // extent / cell in [2^(e-1), 2^e)
    int level = min(max(e - 1 + bias, 1), max_level);
    gp.ox = minx; gp.oy = miny;
    gp.sx = 65536.0 / fmax(maxx - minx, 1e-300); gp.sy = 65536.0 / fmax(maxy - miny, 1e-300);
    gp.level = level; gp.shift = 16 - level;
    gp.cells = 1ll << (2 * level); gp.table = gp.cells + 1;
}

// For the counting launches that choose the grid (join's point_cells_grid, overlay's corner_cells_grid): the first
// thread of each block works the grid out into the block's shared ``gp``, and the first block's first thread stores
// it in the ledger (``gp_out``) for the kernels after. It holds a barrier, so every thread of the block calls it.
// One thread a block works it out: on an H200 at 1M points, every thread working the grid out for itself ran the
// join's plan after the build 0.7% slower (interleaved, 80 rounds).
__device__ __forceinline__ void block_grid_from_summary(const double* summary, long long G, int bias, int max_level,
                                                        GridParams& gp, GridParams* gp_out) {
    if (threadIdx.x == 0) grid_from_summary(summary, G, bias, max_level, gp);
    __syncthreads();
    if (blockIdx.x == 0 && threadIdx.x == 0) *gp_out = gp;
}

// The Morton cell of (x, y) on the grid: a point's cell in the join, a bbox corner's in the overlay.
__device__ __forceinline__ unsigned int grid_cell(double x, double y, const GridParams& gp) {
    int shift = (int)gp.shift;
    return morton(quantise(x, gp.ox, gp.sx) >> shift, quantise(y, gp.oy, gp.sy) >> shift);
}

// The grid from the summary, and the bucket table zeroed for it (its first gp.table entries of a table sized for
// the largest level), with one more int32 array (``also``, n_also entries) zeroed in the same launch. Every
// thread works the parameters out for itself (a few fp64 operations on 8 words, all threads reading the same L2
// line) and the first stores them for the kernels after.
extern "C" __global__ void grid_zero(const double* summary, long long G, int bias, int max_level, GridParams* gp_out,
                                     int* counts, int* also, long long n_also) {
    GridParams gp;
    grid_from_summary(summary, G, bias, max_level, gp);
    long long i0 = blockIdx.x * (long long)blockDim.x + threadIdx.x, stride = (long long)gridDim.x * blockDim.x;
    if (i0 == 0) *gp_out = gp;
    for (long long i = i0; i < gp.table; i += stride) counts[i] = 0;
    for (long long i = i0; i < n_also; i += stride) also[i] = 0;
}

__device__ __forceinline__ void box_cells(const double* b, const GridParams* gp, unsigned int& x0, unsigned int& y0,
                                          unsigned int& x1, unsigned int& y1) {
    cell_range(b, gp->ox, gp->oy, gp->sx, gp->sy, (int)gp->shift, x0, y0, x1, y1);
}

// A box's cells, laid out for a warp: lane i takes cell c0 + i of the box's ncell cells (nx a row, from (x0, y0)),
// its run of bucketed items in cell_start (first, and the run's length), and the runs' inclusive offsets over
// the lanes (incl; excl = incl less its own run). Returns the items in those 32 cells, the same on every lane.
// Every lane must call it. With run_item below, a warp takes the joined runs 32 items at a time, every lane
// busy, where a cell at a time (a cell holds an item or two) left most lanes idle.
__device__ __forceinline__ int warp_cell_runs(const int* cell_start, unsigned int x0, unsigned int y0, unsigned int nx,
                                              unsigned int ncell, unsigned int c0, int lane, int& first, int& incl,
                                              int& excl) {
    unsigned int c = c0 + lane;
    int cnt = 0;
    first = 0;
    if (c < ncell) {
        unsigned int cell = morton(x0 + c % nx, y0 + c / nx);
        first = cell_start[cell];
        cnt = cell_start[cell + 1] - first;
    }
    incl = cnt;
    for (int off = 1; off < 32; off <<= 1) {
        int v = __shfl_up_sync(FULL_MASK, incl, off);
        if (lane >= off) incl += v;
    }
    excl = incl - cnt;
    return __shfl_sync(FULL_MASK, incl, 31);
}

// Item f of warp_cell_runs' joined runs: its index in the bucketed order, found by a binary search over the lanes'
// inclusive offsets (five shuffles). Every lane must call it; an f past the runs gives an index not to read.
__device__ __forceinline__ int run_item(int f, int first, int incl, int excl) {
    int k = 0;
    for (int step = 16; step > 0; step >>= 1)            // k = lanes whose runs end at or before f
        if (__shfl_sync(FULL_MASK, incl, k + step - 1) <= f) k += step;
    return __shfl_sync(FULL_MASK, first, k & 31) + f - __shfl_sync(FULL_MASK, excl, k & 31);
}

// Crossing-number classification of q against every ring of geometry g (as pip.py):
// returns the crossing parity; boundary is set when q lies on an edge.
// The edge loop was issue-bound (ncu found one instruction every 2.3 cycles a scheduler), and a warp's lanes
// test different edges. Tested edge by edge, whenever one lane's edge straddled the point's height every lane
// stepped through the orientation test, so a warp ran it for nearly every edge. So a ring is taken 32 edges
// at a time in two passes: the first compares only the vertices' heights with the point's (each vertex
// once) and marks the edges that straddle it or touch its height in a mask; the second tests just those,
// a few a lane, and a warp's trip count is its busiest lane's. Only those edges can cross the ray or hold
// the point, so the crossings, the boundary flag and the counters are what testing every edge gives. The
// bounding-box test that only tells a boundary point apart runs only when the orientation is exactly zero
// (a point off the edge's line is never on it). Interleaved against the edge-by-edge loop, on an H100 and an
// H200: join's refine at 1M x 100k 101.4 -> 76.1 and 98.0 -> 72.1 us, overlay v3's area stage at 100k x 100k
// 417.9 -> 364.5 and 407.8 -> 352.2 us. Unrolling the first pass 4 times changed nothing (72.1 against 72.2 us).
// n_edges counts every edge scanned, n_orient the marked ones the orientation filter ran on: the join's cost model
// counts FLOPs from n_orient (9 a test; ncu measured exactly that, where every edge's count was 7.4x too many).
__device__ __forceinline__ int classify_point(const double2* coords, const int* ring_off, const int* geom_ring_off,
                                              int g, double2 q, double errA, unsigned long long& n_exact,
                                              unsigned long long& n_edges, unsigned long long& n_orient,
                                              bool& boundary) {
    int crossings = 0;
    for (int r = geom_ring_off[g], r1 = geom_ring_off[g + 1]; r < r1; ++r) {
        int k0 = ring_off[r], k1 = ring_off[r + 1] - 1;
        n_edges += k1 - k0;
        double ay = coords[k0].y;
        for (int c0 = k0; c0 < k1; c0 += 32) {
            const int c1 = min(c0 + 32, k1);
            unsigned int mask = 0;
            bool above_a = ay > q.y, level_a = ay == q.y;
            for (int k = c0; k < c1; ++k) {
                const double by = coords[k + 1].y;
                const bool above_b = by > q.y, level_b = by == q.y;
                // Most edges lie wholly above or below the point: without a straddle the
                // point can only touch the edge at the height of one of its ends.
                if (above_a != above_b || level_a || level_b) mask |= 1u << (k - c0);
                above_a = above_b; level_a = level_b; ay = by;
            }
            n_orient += __popc(mask);
            for (; mask; mask &= mask - 1) {
                const int k = c0 + __ffs(mask) - 1;
                const double2 a = coords[k], b = coords[k + 1];
                const bool above_b = b.y > q.y, straddle = (a.y > q.y) != above_b;
                int o = orient2d(a.x, a.y, b.x, b.y, q.x, q.y, errA, n_exact);
                if (o == 0)
                    boundary |= fmin(a.x, b.x) <= q.x && q.x <= fmax(a.x, b.x) && fmin(a.y, b.y) <= q.y &&
                                q.y <= fmax(a.y, b.y);
                // Upward edge (b above): the crossing is right of q iff q is left of a->b.
                crossings ^= straddle && (above_b ? o > 0 : o < 0);
            }
        }
    }
    return crossings;
}

// The overlay's callers, which count no orientation tests.
__device__ __forceinline__ int classify_point(const double2* coords, const int* ring_off, const int* geom_ring_off,
                                              int g, double2 q, double errA, unsigned long long& n_exact,
                                              unsigned long long& n_edges, bool& boundary) {
    unsigned long long n_orient = 0;
    return classify_point(coords, ring_off, geom_ring_off, g, q, errA, n_exact, n_edges, n_orient, boundary);
}
