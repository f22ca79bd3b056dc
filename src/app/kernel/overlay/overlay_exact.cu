// Overlay kernels, exactness where the two layers' boundaries nearly coincide: compiled after overlay.cu and before
// overlay_area.cu and overlay_v3.cu (scan.cu and common.cuh in front), which use what is here.
//
// A piece of an edge lies on the segment between two input vertices e0, e1; its test point is e0 + t (e1 - e0) for
// the middle t of its bounds, and that exact point is classified, not its rounding m: where a piece runs within
// rounding distance of the other boundary, m can lie on the other side of it. classify_segment_point decides from m
// wherever the bounds on |P - m| allow (every test of a piece off the other boundary), and says ``unsure``
// otherwise; classify_segment_point_exact then decides from the input doubles. A function a kernel calls costs it
// its own registers on top of those the kernel holds, so the exact path runs in kernels of its own
// (area_rings_exact, area_cut_rings_exact), on the rings whose pieces the hot kernels could not decide
// (piece_inside<false> gives up, the ring is listed), and the hot kernels carry none of it. pip.py's
// classify_segment_points is the CPU's twin. A proper crossing's parameter is a ratio of orientation values to an
// ulp (orient2d_value), so the pieces' bounds are within a few ulps of the exact crossings.

// One more term into a nonoverlapping expansion e of n components (grow_expansion).
__device__ __forceinline__ void grow_term(double* e, int& n, double q) {
    for (int j = 0; j < n; ++j) { double s, h; two_sum(q, e[j], s, h); e[j] = h; q = s; }
    e[n++] = q;
}

__device__ __forceinline__ int expansion_sign(const double* e, int n) {
    for (int j = n - 1; j >= 0; --j)
        if (e[j] != 0.0) return e[j] > 0.0 ? 1 : -1;
    return 0;
}

// Part of a two_diff: the difference, or its rounding error.
__device__ __forceinline__ double diff_part(double p, double q, bool tail) {
    double d, e;
    two_diff(p, q, d, e);
    return tail ? e : d;
}

// (a - c) x (b - c) to about one ulp: the exact expansion summed from its smallest component up (robust.py's
// orient2d_exact_value, bit for bit: the same 16 terms grown in the same order, one at a time in a loop not
// unrolled, so it costs its callers few registers).
__device__ __forceinline__ double orient2d_exact_value(double ax, double ay, double bx, double by, double cx,
                                                    double cy) {
    double e[16];
    int n = 0;
#pragma unroll 1
    for (int i = 0; i < 8; ++i) {
        // Products (acx, bcy), (acx, bcy_t), (acx_t, bcy), (acx_t, bcy_t), then -(acy, bcx) likewise.
        bool xy = i < 4;
        double u = diff_part(xy ? ax : ay, xy ? cx : cy, (i >> 1) & 1);
        double w = diff_part(xy ? by : bx, xy ? cy : cx, i & 1);
        double p, q;
        two_prod(xy ? u : -u, w, p, q);
        if (n == 0) e[n++] = p; else grow_term(e, n, p);
        grow_term(e, n, q);
    }
    double v = 0.0;
    for (int j = 0; j < 16; ++j) v += e[j];
    return v;
}

// robust.py's ORIENT_DD_BOUND: below this share of |detleft| + |detright| the double-double value may be off by
// more than an ulp, and the exact expansion is summed instead.
#define ORIENT_DD_BOUND 0x1p-40

// (a - c) x (b - c) to about one ulp (robust.py's orient2d_values, bit for bit): both products exactly, their
// difference exactly, plus the first-order terms of the coordinate differences' rounding errors. The overlay's
// proper crossings are ratios of these (refine_pairs).
__device__ __forceinline__ double orient2d_value(double ax, double ay, double bx, double by, double cx, double cy) {
    double acx, acxt, bcy, bcyt, acy, acyt, bcx, bcxt;
    two_diff(ax, cx, acx, acxt); two_diff(by, cy, bcy, bcyt);
    two_diff(ay, cy, acy, acyt); two_diff(bx, cx, bcx, bcxt);
    double p1, e1, p2, e2, s, se;
    two_prod(acx, bcy, p1, e1); two_prod(acy, bcx, p2, e2);
    two_diff(p1, p2, s, se);
    if (fabs(s) < ORIENT_DD_BOUND * (fabs(p1) + fabs(p2))) return orient2d_exact_value(ax, ay, bx, by, cx, cy);
    double tails = (acx * bcyt + bcy * acxt) - (acy * bcxt + bcx * acyt);
    return s + ((se + (e1 - e2)) + tails);
}

// The parameter on q0 -> q1 where it crosses the line p0 -> p1 (a proper crossing: q0 and q1 strictly on either
// side): orient(p0, p1, .) is affine along q and zero there, so it is v0 / (v0 - v1) for the orientations of q0 and
// q1, whose signs differ (no cancellation), each to about an ulp. Out of line and called twice by refine_pairs
// for a proper crossing: inlined four times, the orientations took refine_pairs from 70 to 116 registers.
__device__ __noinline__ double crossing_param(const double2* p, const double2* q) {
    const double2 p0 = p[0], p1 = p[1], q0 = q[0], q1 = q[1];
    double v0 = orient2d_value(p0.x, p0.y, p1.x, p1.y, q0.x, q0.y);
    double v1 = orient2d_value(p0.x, p0.y, p1.x, p1.y, q1.x, q1.y);
    return fmin(fmax(v0 / (v0 - v1), 0.0), 1.0);
}

// One coordinate of the point P = c0 + t (c1 - c0) of a segment between input vertices (the overlay's pieces): m, as
// the kernels round it, and a bound d on |P - m|, 0 where m is P (error-free transforms: P - m is exactly the sum
// of the three roundings' errors, the difference's times t). The bound has 2^-48 to spare for its own rounding and
// for the rounding of the bounds built on it (segment orientation), and a subnormal's share where a rounding may
// have underflowed. pip.py's segment_points, bit for bit.
__device__ __forceinline__ void segment_coord(double c0, double c1, double t, double& m, double& d) {
    double dc, dce, p, pe, me;
    two_diff(c1, c0, dc, dce);
    two_prod(t, dc, p, pe);
    two_sum(c0, p, m, me);
    const bool exact = dce == 0.0 && pe == 0.0 && me == 0.0 &&
                       (p == 0.0 ? (t == 0.0 || dc == 0.0) : fabs(p) >= 0x1p-900);
    d = exact ? 0.0 : ((fabs(me) + fabs(pe)) + fabs(t * dce)) * (1.0 + 0x1p-48) + 0x1p-1070;
}

__device__ __forceinline__ void segment_point(double2 e0, double2 e1, double t, double2& m, double2& d) {
    segment_coord(e0.x, e1.x, t, m.x, d.x);
    segment_coord(e0.y, e1.y, t, m.y, d.y);
}

// Exact sign of v - P.y (y) or v - P.x, for P on the segment e[0] -> e[1] at t: six doubles summed exactly
// (robust.py's segment_coord_exact), while no product with t underflows (robust.py's caveat: t = 0 or
// |t| >= 2^-199 suffices in COORD_RANGE). Out of line: rare, only where v lies within the bound of m.
__device__ __noinline__ int segment_coord_exact(double v, const double2* e, double t, bool y) {
    double c0 = y ? e[0].y : e[0].x, c1 = y ? e[1].y : e[1].x;
    double x[6];
    int n = 0;
    double s, st, d, dt, p, pt, q, qt;
    two_diff(v, c0, s, st); two_diff(c1, c0, d, dt);
    two_prod(t, d, p, pt); two_prod(t, dt, q, qt);
    grow_term(x, n, s); grow_term(x, n, st); grow_term(x, n, -p);
    grow_term(x, n, -pt); grow_term(x, n, -q); grow_term(x, n, -qt);
    return expansion_sign(x, n);
}

// Exact sign of orient2d(a, b, P) for P on e[0] -> e[1] at t: orientation is affine in P, so it is
// orient2d(a, b, e0) + t ((b - a) x (e1 - e0)), 48 doubles summed exactly (robust.py's segment_orient_exact), while
// no product with t underflows (robust.py's caveat: t = 0 or |t| >= 2^-199 suffices in COORD_RANGE). Each
// of the 16 products of coordinate differences (and their tails) is made and grown into the expansion in turn,
// a loop not unrolled: a kernel's registers are the most any function it calls needs, and this one is rare.
__device__ __noinline__ int segment_orient_exact(double2 a, double2 b, const double2* e, double t) {
    const double2 e0 = e[0], e1 = e[1];
    double x[48];
    int n = 0;
#pragma unroll 1
    for (int i = 0; i < 16; ++i) {
        // Products 0-7: orient2d(a, b, e0) = (a - e0) x (b - e0); 8-15: (b - a) x (e1 - e0), times t. In each set,
        // j = 0-3: (u.x part) * (w.y part), 4-7: -(u.y part) * (w.x part); bit 1 of j takes u's tail, bit 0 w's.
        int j = i & 7;
        bool second = i >= 8, xy = j < 4;
        double ux = second ? (xy ? b.x : b.y) : (xy ? a.x : a.y);
        double uo = second ? (xy ? a.x : a.y) : (xy ? e0.x : e0.y);
        double wx = second ? (xy ? e1.y : e1.x) : (xy ? b.y : b.x);
        double wo = xy ? e0.y : e0.x;
        double u = diff_part(ux, uo, (j >> 1) & 1), w = diff_part(wx, wo, j & 1);
        double p, q;
        two_prod(xy ? u : -u, w, p, q);
        if (!second) {
            grow_term(x, n, p); grow_term(x, n, q);
        } else {
            double r, rt;
            two_prod(t, p, r, rt); grow_term(x, n, r); grow_term(x, n, rt);
            two_prod(t, q, r, rt); grow_term(x, n, r); grow_term(x, n, rt);
        }
    }
    return expansion_sign(x, n);
}

// Sign of v - P (a vertex's coordinate against P's), exact: m and its bound decide unless v lies within it. (A double
// v above fl(m + d) is above m + d too: rounding to nearest keeps m + d below the next double up.)
__device__ __forceinline__ int segment_side(double v, double m, double d, const double2* e, double t, bool y) {
    return v > m + d ? 1 : (v < m - d ? -1 : (d == 0.0 ? 0 : segment_coord_exact(v, e, t, y)));
}

// classify_point for the exact point P = e[0] + t (e[1] - e[0]) on a segment between input vertices (an overlay
// piece's middle), given its rounding m and bounds d (segment_point): pip.py's classify_segment_points. The same
// two passes; the first marks the edges whose heights are not both surely above or both surely below P (farther
// than d.y from m), the second decides each marked edge from m: its heights surely above or below P, the
// orientation's sign surely right (Shewchuk's bound for m plus |(b - a) x (P - m)| <= |bx - ax| d.y + |by - ay| d.x;
// d carries 2^-48 to spare, which covers this bound's own rounding). Where a piece runs within
// rounding distance of this boundary, m can lie on the wrong side of it and P cannot: an edge m cannot decide
// sets ``unsure``, and P is classified again by classify_segment_point_exact, in a kernel of its own (see the top).
__device__ __forceinline__ int classify_segment_point(const double2* coords, const int* ring_off,
                                                      const int* geom_ring_off, int g, double2 m, double2 d,
                                                      double errA, unsigned long long& n_edges, bool& unsure) {
    int crossings = 0;
    const double lo = m.y - d.y, hi = m.y + d.y;
    for (int r = geom_ring_off[g], r1 = geom_ring_off[g + 1]; r < r1; ++r) {
        int k0 = ring_off[r], k1 = ring_off[r + 1] - 1;
        n_edges += k1 - k0;
        double ay = coords[k0].y;
        bool up_a = ay > hi, down_a = ay < lo;
        for (int c0 = k0; c0 < k1; c0 += 32) {
            const int c1 = min(c0 + 32, k1);
            unsigned int mask = 0;
            for (int k = c0; k < c1; ++k) {
                const double by = coords[k + 1].y;
                const bool up_b = by > hi, down_b = by < lo;
                if (!((up_a && up_b) || (down_a && down_b))) mask |= 1u << (k - c0);
                up_a = up_b; down_a = down_b;
            }
            for (; mask; mask &= mask - 1) {
                const int k = c0 + __ffs(mask) - 1;
                const double2 a = coords[k], b = coords[k + 1];
                const bool up_ka = a.y > hi, up_kb = b.y > hi, straddle = up_ka != up_kb;
                // Where m.y is P.y (d.y = 0), a vertex level with P is below it, as in classify_point.
                if (d.y != 0.0 && !((up_ka || a.y < lo) && (up_kb || b.y < lo))) { unsure = true; continue; }
                // Off a straddle, only an edge whose x-range may hold P can carry it.
                if (!straddle && !(fmin(a.x, b.x) <= m.x + d.x && m.x - d.x <= fmax(a.x, b.x))) continue;
                const double detleft = (a.x - m.x) * (b.y - m.y), detright = (a.y - m.y) * (b.x - m.x);
                const double det = detleft - detright;
                const double err = errA * (fabs(detleft) + fabs(detright)) +
                                   (fabs(b.x - a.x) * d.y + fabs(b.y - a.y) * d.x);
                if (fabs(det) <= err) {
                    unsure = true;
                    continue;
                }
                // Upward edge (b above): the crossing is right of P iff P is left of a->b.
                crossings ^= straddle && (up_kb ? det > 0.0 : det < 0.0);
            }
        }
    }
    return crossings;
}

// P (as classify_segment_point) against polygon g with every comparison exact: bit 0 the crossing parity, bit 1 P
// lies on the boundary. Each edge's heights and orientation come from m where its bounds decide them, else from the
// input doubles. Only the re-do kernels (area_rings_exact, area_cut_rings_exact) run it.
__device__ __forceinline__ int classify_segment_point_exact(const double2* coords, const int* ring_off,
                                                        const int* geom_ring_off, int g, const double2* e, double t,
                                                        double errA) {
    double2 m, d;
    segment_point(e[0], e[1], t, m, d);
    int crossings = 0;
    bool boundary = false;
    for (int r = geom_ring_off[g], r1 = geom_ring_off[g + 1]; r < r1; ++r) {
        for (int k = ring_off[r], k1 = ring_off[r + 1] - 1; k < k1; ++k) {
            const double2 a = coords[k], b = coords[k + 1];
            const int sa = segment_side(a.y, m.y, d.y, e, t, true), sb = segment_side(b.y, m.y, d.y, e, t, true);
            if ((sa > 0 && sb > 0) || (sa < 0 && sb < 0)) continue;     // wholly above or below P
            const bool above_b = sb > 0, straddle = (sa > 0) != above_b;
            const double detleft = (a.x - m.x) * (b.y - m.y), detright = (a.y - m.y) * (b.x - m.x);
            const double det = detleft - detright;
            int o = (det > 0.0) - (det < 0.0);
            if (fabs(det) <= errA * (fabs(detleft) + fabs(detright)) + (fabs(b.x - a.x) * d.y + fabs(b.y - a.y) * d.x))
                o = segment_orient_exact(a, b, e, t);
            if (o == 0)
                boundary |= segment_side(a.x, m.x, d.x, e, t, false) * segment_side(b.x, m.x, d.x, e, t, false) <= 0;
            crossings ^= straddle && (above_b ? o > 0 : o < 0);
        }
    }
    return crossings | ((int)boundary << 1);
}


// The shoelace's origin for pair (BA, BB): the middle of the overlap of the two bboxes, where the kept pieces lie
// (cpu.py's _cut_pieces, the same operations). The middle of a's bbox, 20 km from a 1 m^2 b on a's edge, cost
// each term ulps of 4e8 m^2: 1e-7 of b's area.
__device__ __forceinline__ double2 shoelace_origin(const double* BA, const double* BB) {
    return make_double2(0.5 * (fmax(BA[0], BB[0]) + fmin(BA[2], BB[2])),
                        0.5 * (fmax(BA[1], BB[1]) + fmin(BA[3], BB[3])));
}

// Whether the piece of edge e[0] -> e[1] whose middle is at tm lies strictly inside polygon go of the other layer:
// that middle point classified exactly, not its rounding. in_box: the test ran (the rounded point lies in the
// polygon's bbox grown by its bound d; the exact point may be in it when the rounded one is just outside); bnd: the
// point is on the polygon's boundary. EXACT false (the hot kernels): where the bounds cannot decide, ``unsure`` is
// set and the answer is void (the ring goes to the re-do kernels); EXACT true: decided from the input doubles.
// cpu.py's _classify_pieces.
template <bool EXACT>
__device__ __forceinline__ bool piece_inside(const double2* e, double tm, const double2* CO, const int* roO,
                                             const int* groO, int go, const double* boxO, double errA,
                                             unsigned long long& n_edges, bool& in_box, bool& bnd, bool& unsure) {
    double2 m, d;
    segment_point(e[0], e[1], tm, m, d);
    bnd = false;
    in_box = boxO[0] - d.x <= m.x && m.x <= boxO[2] + d.x && boxO[1] - d.y <= m.y && m.y <= boxO[3] + d.y;
    if (!in_box) return false;
    bool u = false;
    int v = classify_segment_point(CO, roO, groO, go, m, d, errA, n_edges, u);
    if (u) {
        if (!EXACT) {
            unsure = true;
            return false;
        }
        v = classify_segment_point_exact(CO, roO, groO, go, e, tm, errA);
        bnd = (v >> 1) != 0;
    }
    return (v & 1) && !bnd;
}
