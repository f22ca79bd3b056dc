// Join kernels (points x polygons). Compiled by gpu.py with NVRTC, --fmad=false:
// the orientation filter's error bound assumes separately rounded multiply and
// subtract, and CPU/GPU must compute identical Morton codes.
// Coordinates are interleaved fp64 (x, y); offsets are int32, CSR style.

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

// One atomic per warp instead of one per thread: every lane must call this.
__device__ __forceinline__ void warp_add(unsigned long long* target, unsigned long long v) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(FULL_MASK, v, off);
    if ((threadIdx.x & 31) == 0 && v) atomicAdd(target, v);
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

// Exact sign of (a - c) x (b - c); rare, so kept out of line to spare registers.
__device__ __noinline__ int orient2d_exact(double ax, double ay, double bx, double by, double cx, double cy) {
    double acx, acxt, bcy, bcyt, acy, acyt, bcx, bcxt;
    two_diff(ax, cx, acx, acxt); two_diff(by, cy, bcy, bcyt);
    two_diff(ay, cy, acy, acyt); two_diff(bx, cx, bcx, bcxt);
    double t[16];
    two_prod(acx, bcy, t[0], t[1]);    two_prod(acx, bcyt, t[2], t[3]);
    two_prod(acxt, bcy, t[4], t[5]);   two_prod(acxt, bcyt, t[6], t[7]);
    two_prod(-acy, bcx, t[8], t[9]);   two_prod(-acy, bcxt, t[10], t[11]);
    two_prod(-acyt, bcx, t[12], t[13]); two_prod(-acyt, bcxt, t[14], t[15]);
    double e[16];
    int n = 1;
    e[0] = t[0];
    for (int i = 1; i < 16; ++i) {          // grow_expansion: nonoverlapping, increasing
        double q = t[i];
        for (int j = 0; j < n; ++j) { double s, h; two_sum(q, e[j], s, h); e[j] = h; q = s; }
        e[n++] = q;
    }
    for (int j = 15; j >= 0; --j)
        if (e[j] != 0.0) return e[j] > 0.0 ? 1 : -1;
    return 0;
}

__device__ __forceinline__ int orient2d(double ax, double ay, double bx, double by, double cx, double cy,
                                        double errA, unsigned long long& n_exact) {
    double detleft = (ax - cx) * (by - cy);
    double detright = (ay - cy) * (bx - cx);
    double det = detleft - detright;
    double errbound = errA * (fabs(detleft) + fabs(detright));
    if (fabs(det) < errbound && detleft * detright > 0.0) {
        ++n_exact;
        return orient2d_exact(ax, ay, bx, by, cx, cy);
    }
    return (det > 0.0) - (det < 0.0);
}

// ---- bounds --------------------------------------------------------------------
extern "C" __global__ void polygon_bounds(const double* coords, const int* geom_coord_off, long long G,
                                          double* bbox) {
    long long g = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (g >= G) return;
    double x0 = 1.0 / 0.0, y0 = 1.0 / 0.0, x1 = -1.0 / 0.0, y1 = -1.0 / 0.0;
    for (int k = geom_coord_off[g]; k < geom_coord_off[g + 1]; ++k) {
        double x = coords[2 * (long long)k], y = coords[2 * (long long)k + 1];
        x0 = fmin(x0, x); y0 = fmin(y0, y); x1 = fmax(x1, x); y1 = fmax(y1, y);
    }
    bbox[4 * g] = x0; bbox[4 * g + 1] = y0; bbox[4 * g + 2] = x1; bbox[4 * g + 3] = y1;
}

// ---- Morton sort keys: (code << 32) | point index -------------------------------
extern "C" __global__ void point_keys(const double* pts, long long N, double ox, double oy, double sx, double sy,
                                      unsigned long long* keys) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= N) return;
    unsigned int code = morton(quantise(pts[2 * i], ox, sx), quantise(pts[2 * i + 1], oy, sy));
    keys[i] = ((unsigned long long)code << 32) | (unsigned long long)i;
}

// ---- grid of polygon bboxes: entry = (cell Morton code << 32) | polygon ---------
extern "C" __global__ void poly_cell_count(const double* bbox, long long G, double ox, double oy, double sx,
                                           double sy, int shift, long long* counts) {
    long long g = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (g >= G) return;
    const double* b = bbox + 4 * g;
    long long nx = (quantise(b[2], ox, sx) >> shift) - (quantise(b[0], ox, sx) >> shift) + 1;
    long long ny = (quantise(b[3], oy, sy) >> shift) - (quantise(b[1], oy, sy) >> shift) + 1;
    counts[g] = nx * ny;
}

extern "C" __global__ void poly_cell_scatter(const double* bbox, long long G, double ox, double oy, double sx,
                                             double sy, int shift, const long long* incl_offsets,
                                             unsigned long long* entries) {
    long long g = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (g >= G) return;
    const double* b = bbox + 4 * g;
    unsigned int x0 = quantise(b[0], ox, sx) >> shift, x1 = quantise(b[2], ox, sx) >> shift;
    unsigned int y0 = quantise(b[1], oy, sy) >> shift, y1 = quantise(b[3], oy, sy) >> shift;
    long long out = g == 0 ? 0 : incl_offsets[g - 1];
    for (unsigned int y = y0; y <= y1; ++y)
        for (unsigned int x = x0; x <= x1; ++x)
            entries[out++] = ((unsigned long long)morton(x, y) << 32) | (unsigned long long)g;
}

__device__ __forceinline__ long long first_entry(const unsigned long long* entries, long long E, unsigned int cell) {
    unsigned long long key = (unsigned long long)cell << 32;
    long long lo = 0, hi = E;
    while (lo < hi) {
        long long mid = (lo + hi) >> 1;
        if (entries[mid] < key) lo = mid + 1; else hi = mid;
    }
    return lo;
}

// ---- candidate filter: each point (Morton order) tests the bboxes listed in its cell
// Two passes over the same loop: count, then (after a scan) emit.
extern "C" __global__ void candidate_count(const double* pts, const unsigned long long* sorted_keys, long long N,
                                           const unsigned long long* entries, long long E, const double* bbox,
                                           int cell_shift, long long* counts, unsigned long long* examined) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    unsigned long long ex = 0;
    if (i < N) {
        unsigned long long key = sorted_keys[i];
        unsigned int cell = (unsigned int)(key >> 32) >> cell_shift;
        long long p = (long long)(key & 0xffffffffull);
        double px = pts[2 * p], py = pts[2 * p + 1];
        long long cnt = 0;
        for (long long j = first_entry(entries, E, cell); j < E && (unsigned int)(entries[j] >> 32) == cell; ++j) {
            const double* b = bbox + 4 * (long long)(entries[j] & 0xffffffffull);
            ++ex;
            cnt += (b[0] <= px) & (px <= b[2]) & (b[1] <= py) & (py <= b[3]);
        }
        counts[i] = cnt;
    }
    warp_add(examined, ex);
}

extern "C" __global__ void candidate_emit(const double* pts, const unsigned long long* sorted_keys, long long N,
                                          const unsigned long long* entries, long long E, const double* bbox,
                                          int cell_shift, const long long* incl_offsets, int* cand_pt,
                                          int* cand_poly) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= N) return;
    unsigned long long key = sorted_keys[i];
    unsigned int cell = (unsigned int)(key >> 32) >> cell_shift;
    long long p = (long long)(key & 0xffffffffull);
    double px = pts[2 * p], py = pts[2 * p + 1];
    long long out = i == 0 ? 0 : incl_offsets[i - 1];
    for (long long j = first_entry(entries, E, cell); j < E && (unsigned int)(entries[j] >> 32) == cell; ++j) {
        int g = (int)(entries[j] & 0xffffffffull);
        const double* b = bbox + 4 * (long long)g;
        if ((b[0] <= px) & (px <= b[2]) & (b[1] <= py) & (py <= b[3])) {
            cand_pt[out] = (int)p; cand_poly[out] = g; ++out;
        }
    }
}

// ---- predicate refine: crossing number over every ring edge, exact orientation ---
// stats[0] += orientations that needed the exact path, stats[1] += edge tests,
// stats[2] += candidate pairs with the point on the polygon's boundary.
extern "C" __global__ void refine(const double* pts, const double* coords, const int* ring_off,
                                  const int* geom_ring_off, const int* cand_pt, const int* cand_poly, long long C,
                                  int within, double errA, int* keep, unsigned long long* stats) {
    long long c = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    unsigned long long n_exact = 0, n_edges = 0, n_boundary = 0;
    if (c < C) {
        int p = cand_pt[c], g = cand_poly[c];
        double px = pts[2 * (long long)p], py = pts[2 * (long long)p + 1];
        int crossings = 0;
        bool boundary = false;
        for (int r = geom_ring_off[g]; r < geom_ring_off[g + 1]; ++r) {
            int k0 = ring_off[r], k1 = ring_off[r + 1] - 1;
            double ax = coords[2 * (long long)k0], ay = coords[2 * (long long)k0 + 1];
            n_edges += k1 - k0;
            for (int k = k0; k < k1; ++k) {
                double bx = coords[2 * (long long)k + 2], by = coords[2 * (long long)k + 3];
                bool above_a = ay > py, above_b = by > py;
                bool straddle = above_a != above_b;
                bool in_box = fmin(ax, bx) <= px && px <= fmax(ax, bx) && fmin(ay, by) <= py && py <= fmax(ay, by);
                if (straddle || in_box) {
                    int o = orient2d(ax, ay, bx, by, px, py, errA, n_exact);
                    boundary |= (o == 0) && in_box;
                    // Upward edge (b above): the crossing is right of p iff p is left of a->b.
                    crossings ^= straddle && (above_b ? o > 0 : o < 0);
                }
                ax = bx; ay = by;
            }
        }
        keep[c] = within ? (crossings && !boundary) : (crossings || boundary);
        n_boundary = boundary;
    }
    warp_add(stats, n_exact);
    warp_add(stats + 1, n_edges);
    warp_add(stats + 2, n_boundary);
}

// ---- compaction + output: key = (point << 32) | polygon sorts by point, then polygon
extern "C" __global__ void compact_pairs(const int* keep, const long long* incl_scan, const int* cand_pt,
                                         const int* cand_poly, long long C, unsigned long long* keys) {
    long long c = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (c >= C || !keep[c]) return;
    keys[incl_scan[c] - 1] = ((unsigned long long)cand_pt[c] << 32) | (unsigned int)cand_poly[c];
}

extern "C" __global__ void decode_pairs(const unsigned long long* keys, long long H, long long* pt, long long* poly) {
    long long h = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (h >= H) return;
    pt[h] = (long long)(keys[h] >> 32);
    poly[h] = (long long)(keys[h] & 0xffffffffull);
}
