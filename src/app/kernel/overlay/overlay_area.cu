// Overlay kernels, part 2: from the candidate edge pairs to the areas (exact refine, the records' sort,
// area reconstruction). Compiled after overlay.cu (scan.cu and common.cuh in front), whose edge-slot
// conventions and helpers they share.

// ---- exact intersection refine ----------------------------------------------------
// The same classification as segments.py. Parameters along a segment use its
// dominant axis, so its own endpoints sit at exactly 0 and 1. Each candidate appends
// up to four split records (slot, t) and, for a collinear overlap, two overlap records
// (slot, lo, hi, keep), counted in n_records[0] and [1]. stats: [0] proper, [1] touch,
// [2] collinear overlap, [3] ambiguous pairs, [4] split events, [5] marks at segment ends.
// With ev_kind (v3) each split record also says whether it is a proper crossing (1) or
// not (0: a touch, or an end of a shared stretch). Every version marks a touch at a segment's
// own end (t = 0 or 1), keeps a proper crossing whose parameter rounds to an end, and keeps the
// parameter of one segment's endpoint on the other where it rounds to 0 or 1 (end_param): every
// contact of the two boundaries leaves a record on both rings (a shared stretch its overlap
// records too), so a ring with none meets the other boundary nowhere and one of its vertices
// decides it (area_rings), and v3's walk meets a record wherever its status may change. A proper
// crossing's parameter is O3 / (O3 - O4) on e and O1 / (O1 - O2) on f, from orientation values
// to about an ulp (orient2d_value): within a few ulps of the exact crossing even for nearly
// collinear segments.
__device__ __forceinline__ double seg_param(double px, double py, double2 s0, double2 s1) {
    return fabs(s1.x - s0.x) >= fabs(s1.y - s0.y) ? (px - s0.x) / (s1.x - s0.x) : (py - s0.y) / (s1.y - s0.y);
}

__device__ __forceinline__ bool in_box(double px, double py, double2 s0, double2 s1) {
    return fmin(s0.x, s1.x) <= px && px <= fmax(s0.x, s1.x) && fmin(s0.y, s1.y) <= py && py <= fmax(s0.y, s1.y);
}

__device__ __forceinline__ double inside_split(double t) { return (t > 0.0 && t < 1.0) ? t : -1.0; }

// The parameter along s0->s1 of a point p on that segment (in its box), 0 and 1 included (a record there is a
// mark), or -1 (none) for a segment of length 0 (0 / 0; the marks below record its contacts), as segments.py's
// np.clip leaves NaN.
__device__ __forceinline__ double end_param(double2 p, double2 s0, double2 s1) {
    double t = seg_param(p.x, p.y, s0, s1);
    return isnan(t) ? -1.0 : fmin(fmax(t, 0.0), 1.0);
}

// The input vertex (an endpoint of e or f) whose dominant coordinate is c.
__device__ __forceinline__ double2 interval_point(double c, bool use_x, double2 e0, double2 e1, double2 f0, double2 f1) {
    if ((use_x ? e0.x : e0.y) == c) return e0;
    if ((use_x ? e1.x : e1.y) == c) return e1;
    if ((use_x ? f0.x : f0.y) == c) return f0;
    return f1;
}

// At most 80 registers: crossing_param's call took refine_pairs from 70 to 82 (88 allocated), two blocks of 256 an SM
// instead of three; capped, it keeps three, with one word spilled outside the call (sm_90, nvcc 13). __maxnreg__
// needs CUDA 12.4; an older NVRTC compiles it uncapped.
#if __CUDACC_VER_MAJOR__ > 12 || (__CUDACC_VER_MAJOR__ == 12 && __CUDACC_VER_MINOR__ >= 4)
#define REFINE_MAX_REGISTERS __maxnreg__(80)
#else
#define REFINE_MAX_REGISTERS
#endif

extern "C" __global__ void REFINE_MAX_REGISTERS refine_pairs(const double2* ca, const int* gro_a, const int* ro_a,
        const double2* cb, const int* gro_b, const int* ro_b, const int* pair_a, const int* pair_b,
        const long long* slot_incl, const int* cand_p, const int* cand_ka, const int* cand_kb, int C,
        const unsigned long long* n_cand, double errA, int* ev_slot, double* ev_t, signed char* ev_kind, int* ov_slot,
        double* ov_lo, double* ov_hi, int* ov_keep, unsigned long long* stats, unsigned long long* n_records) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned long long n_proper = 0, n_touch = 0, n_overlap = 0, n_amb = 0, n_events = 0, n_marks = 0;
    double te[2] = {-1.0, -1.0}, tf[2] = {-1.0, -1.0}, ov_e[2] = {0.0, 0.0}, ov_f[2] = {0.0, 0.0};
    int slot_e = 0, slot_f = 0;
    bool same = false;
    // v3's candidate buffers have a room of C; n_cand (a device word) holds the real count.
    if (c < live_count(C, n_cand)) {
        int p = cand_p[c], ka = cand_ka[c], kb = cand_kb[c];
        int a = pair_a[p], b = pair_b[p];
        int a0 = ro_a[gro_a[a]], b0 = ro_b[gro_b[b]];
        long long base = p == 0 ? 0 : slot_incl[p - 1];
        slot_e = (int)(base + (ka - a0));
        slot_f = (int)(base + (ro_a[gro_a[a + 1]] - a0) + (kb - b0));
        double2 e0 = ca[ka], e1 = ca[ka + 1], f0 = cb[kb], f1 = cb[kb + 1];
        unsigned long long ex = 0;
        int o1 = orient2d(e0.x, e0.y, e1.x, e1.y, f0.x, f0.y, errA, ex);
        int o2 = orient2d(e0.x, e0.y, e1.x, e1.y, f1.x, f1.y, errA, ex);
        int o3 = orient2d(f0.x, f0.y, f1.x, f1.y, e0.x, e0.y, errA, ex);
        int o4 = orient2d(f0.x, f0.y, f1.x, f1.y, e1.x, e1.y, errA, ex);
        n_amb = ex > 0;
        bool col = o1 == 0 && o2 == 0;
        bool use_x = fabs(e1.x - e0.x) >= fabs(e1.y - e0.y);
        double ce0 = use_x ? e0.x : e0.y, ce1 = use_x ? e1.x : e1.y;
        double cf0 = use_x ? f0.x : f0.y, cf1 = use_x ? f1.x : f1.y;
        double lo = fmax(fmin(ce0, ce1), fmin(cf0, cf1)), hi = fmin(fmax(ce0, ce1), fmax(cf0, cf1));
        if (col && lo < hi) {
            n_overlap = 1;
            double2 plo = interval_point(lo, use_x, e0, e1, f0, f1), phi = interval_point(hi, use_x, e0, e1, f0, f1);
            double el = seg_param(plo.x, plo.y, e0, e1), eh = seg_param(phi.x, phi.y, e0, e1);
            double fl = seg_param(plo.x, plo.y, f0, f1), fh = seg_param(phi.x, phi.y, f0, f1);
            double elo = fmin(el, eh), ehi = fmax(el, eh), flo = fmin(fl, fh), fhi = fmax(fl, fh);
            te[0] = inside_split(elo); te[1] = inside_split(ehi);
            tf[0] = inside_split(flo); tf[1] = inside_split(fhi);
            same = (ce1 - ce0) * (cf1 - cf0) > 0.0;
            ov_e[0] = elo; ov_e[1] = ehi; ov_f[0] = flo; ov_f[1] = fhi;
        } else if (!col && o1 * o2 < 0 && o3 * o4 < 0) {
            n_proper = 1;
            // orient(f0, f1, .) is affine along e and zero at the crossing; O3 and O4 have opposite signs, so
            // O3 - O4 does not cancel (segments.py). A crossing whose parameter rounds to an end of the segment
            // (at 0 or 1) is kept: v3's walk flips its status at every proper crossing, and in every version it
            // makes its ring a cut one.
            te[0] = crossing_param(cb + kb, ca + ka);
            tf[0] = crossing_param(ca + ka, cb + kb);
        } else if (!col || lo == hi) {
            // An endpoint of one segment on the other. Its parameter is recorded even where it is (or rounds to)
            // 0 or 1: (0.5, 1 - 2^-53), strictly inside the segment from (0.5, -1) to (0.5, 1), is at
            // (2 - 2^-53) / 2, which rounds to 1, and inside_split dropping it left that segment with no record of
            // a contact its ring has (a ring with none is judged by its first vertex; v3's walk went on past it
            // with the status it had). A record at 0 or 1 is a mark: it cuts no piece.
            bool hit = false;
            if (o1 == 0 && in_box(f0.x, f0.y, e0, e1)) { te[0] = end_param(f0, e0, e1); hit = true; }
            if (o2 == 0 && in_box(f1.x, f1.y, e0, e1)) { te[1] = end_param(f1, e0, e1); hit = true; }
            if (o3 == 0 && in_box(e0.x, e0.y, f0, f1)) { tf[0] = end_param(e0, f0, f1); hit = true; }
            if (o4 == 0 && in_box(e1.x, e1.y, f0, f1)) { tf[1] = end_param(e1, f0, f1); hit = true; }
            n_touch = hit;
            if (hit) {
                // A touch at a segment's own end (the other segment's endpoint is not on it) splits nothing, but
                // the other boundary meets this ring there (v3's walk: its status is unknown past it): mark the
                // end (t = 0 or 1). Two segments that are not collinear meet in one point, so a segment with no
                // record of its own has at most one mark.
                if (te[0] < 0.0 && te[1] < 0.0) {
                    if (o3 == 0 && in_box(e0.x, e0.y, f0, f1)) te[0] = 0.0;
                    else if (o4 == 0 && in_box(e1.x, e1.y, f0, f1)) te[0] = 1.0;
                }
                if (tf[0] < 0.0 && tf[1] < 0.0) {
                    if (o1 == 0 && in_box(f0.x, f0.y, e0, e1)) tf[0] = 0.0;
                    else if (o2 == 0 && in_box(f1.x, f1.y, e0, e1)) tf[0] = 1.0;
                }
            }
        }
        for (int i = 0; i < 2; ++i) {
            // Split events are the records strictly inside a segment; records at its ends are marks.
            n_events += (te[i] > 0.0 && te[i] < 1.0) + (tf[i] > 0.0 && tf[i] < 1.0);
            n_marks += (te[i] == 0.0 || te[i] == 1.0) + (tf[i] == 0.0 || tf[i] == 1.0);
        }
    }
    // The records, appended (a warp reserves its lanes' room with one atomic on n_records[0] or [1]): the
    // sort after this groups them by slot and reads how many there are from those words. A record slot a
    // candidate with fewer records left empty cost the sort a thread (4.8M records' threads for 773k records
    // at 100k x 100k).
    unsigned long long at = warp_reserve((te[0] >= 0.0) + (te[1] >= 0.0) + (tf[0] >= 0.0) + (tf[1] >= 0.0), n_records);
    for (int i = 0; i < 4; ++i) {
        double t = i < 2 ? te[i] : tf[i - 2];
        if (t < 0.0) continue;
        ev_slot[at] = i < 2 ? slot_e : slot_f;
        ev_t[at] = t;
        if (ev_kind) ev_kind[at] = n_proper;
        ++at;
    }
    // A collinear overlap: a stretch shared by both segments. A keeps it when both run the same way; B never
    // does (no double count).
    at = warp_reserve(n_overlap ? 2u : 0u, n_records + 1);
    if (n_overlap) {
        ov_slot[at] = slot_e; ov_lo[at] = ov_e[0]; ov_hi[at] = ov_e[1]; ov_keep[at] = same;
        ov_slot[at + 1] = slot_f; ov_lo[at + 1] = ov_f[0]; ov_hi[at + 1] = ov_f[1]; ov_keep[at + 1] = 0;
    }
    unsigned long long v[6] = {n_proper, n_touch, n_overlap, n_amb, n_events, n_marks};
    block_add<6>(stats, v);
}

// ---- reconstruction-event sort: records grouped by slot, then ordered by their key ---
// Counting sort (count with an atomic rank, scan, scatter) and an insertion sort of each
// slot's few records: split records by t, overlap records by lo, both sets in the same
// launches (a fixed grid striding over both; how many records each set holds is a device
// word, n_records[0] and [1], counted by refine_pairs). Each set has its own table, keyed
// by slot >> shift: v1 and v2 key it by slot (shift 0); v3 by buckets of 32 slots, and
// sorts each bucket's records in overlay_v3.cu's bucket_sort (a table of every edge slot
// cost more than the records: 11.6M entries for 773k records at 100k x 100k). The table has
// n_keys + 1 entries (entry key + 1 counts key's records; the scan makes them starts).
// Also the overlap table's fate, decided here where the count is known: with no overlap record (refine found
// no collinear overlap, the usual case) its starts are zeroed and the scan after this is told to cover nothing
// (ov_scan_len 0), in place of a scan of the whole table (71 us at 100k x 100k on an H200 for a table of every
// edge slot); otherwise ov_scan_len is the table's length. ``ov_start`` is the scan's output buffer.
extern "C" __global__ void slot_count(const int* ev_slot, int* ev_rank, int* ev_counts, const int* ov_slot,
                                      int* ov_rank, int* ov_counts, const unsigned long long* n_records,
                                      long long n_keys, int shift, long long* ov_scan_len, int* ov_start) {
    long long n_ev = (long long)n_records[0], n_ov = (long long)n_records[1];
    long long i0 = blockIdx.x * (long long)blockDim.x + threadIdx.x, stride = (long long)gridDim.x * blockDim.x;
    if (i0 == 0) *ov_scan_len = n_ov ? n_keys + 1 : 0;
    for (long long i = i0; i < n_ev + n_ov; i += stride) {
        bool ov = i >= n_ev;
        long long r = ov ? i - n_ev : i;
        const int* slot = ov ? ov_slot : ev_slot;
        (ov ? ov_rank : ev_rank)[r] = atomicAdd((ov ? ov_counts : ev_counts) + (slot[r] >> shift) + 1, 1);
    }
    if (n_ov == 0)
        for (long long i = i0; i <= n_keys; i += stride) ov_start[i] = 0;
}

// ``ev_clear`` and ``ov_clear`` (v3; null for v1, v2): slot_count's two tables, zeroed for the next run once the
// scans have read them. The record ranked first in each busy entry zeroes it (as the filter's corner_scatter
// does), so the next run queues no memset of the tables.
extern "C" __global__ void slot_scatter(const int* ev_slot, const int* ev_rank, const int* ev_start, int* ev_order,
                                        const int* ov_slot, const int* ov_rank, const int* ov_start, int* ov_order,
                                        const unsigned long long* n_records, int shift, int* ev_clear, int* ov_clear) {
    long long n_ev = (long long)n_records[0], n_ov = (long long)n_records[1];
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n_ev + n_ov; i += stride) {
        bool ov = i >= n_ev;
        long long r = ov ? i - n_ev : i;
        int s = (ov ? ov_slot : ev_slot)[r] >> shift;
        int rank = (ov ? ov_rank : ev_rank)[r];
        (ov ? ov_order : ev_order)[(ov ? ov_start : ev_start)[s] + rank] = (int)r;
        int* clear = ov ? ov_clear : ev_clear;
        if (clear != nullptr && rank == 0) clear[s + 1] = 0;
    }
}

// The record ranked first in its slot sorts that slot's records by key. Most edge slots hold no record (773k
// split events over about 8.5M slots at 100k x 100k), and a thread per slot took 36 us on an H200, most of its
// threads finding nothing to sort.
extern "C" __global__ void slot_sort(const int* ev_slot, const int* ev_rank, const int* ev_start, const double* ev_t,
                                     int* ev_order, const int* ov_slot, const int* ov_rank, const int* ov_start,
                                     const double* ov_lo, int* ov_order, const unsigned long long* n_records) {
    long long n_ev = (long long)n_records[0], n_ov = (long long)n_records[1];
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n_ev + n_ov; i += stride) {
        bool ov = i >= n_ev;
        long long r = ov ? i - n_ev : i;
        if ((ov ? ov_rank : ev_rank)[r] != 0) continue;
        const int* start = ov ? ov_start : ev_start;
        const double* key = ov ? ov_lo : ev_t;
        int* order = ov ? ov_order : ev_order;
        int s = (ov ? ov_slot : ev_slot)[r];
        int i0 = start[s], i1 = start[s + 1];
        for (int k = i0 + 1; k < i1; ++k) {
            int v = order[k];
            double kv = key[v];
            int j = k - 1;
            while (j >= i0 && key[order[j]] > kv) { order[j + 1] = order[j]; --j; }
            order[j + 1] = v;
        }
    }
}

// ---- area reconstruction ------------------------------------------------------------
// A thread per (pair, side, ring). A ring with no record meets the other boundary nowhere
// and lies wholly inside or outside the other polygon: its first vertex decides, and it
// adds twice its area. A cut ring adds, for every piece of every edge that is strictly
// inside the other polygon (piece_inside: its middle point, exactly) or on a shared boundary
// that A keeps, the shoelace term of the piece relative to the middle of the overlap of the
// pair's bboxes (shoelace_origin). A cut ring with a piece the filtered test cannot decide is
// listed (``redo``, its count in redo_count) and area_rings_exact does it again from the input
// doubles. stats: [0] point-in-polygon tests, [1] pieces, [2] pieces kept, [3] cut rings.
__device__ __forceinline__ double2 point_at(double2 s0, double2 s1, double t) {
    return t == 1.0 ? s1 : make_double2(s0.x + t * (s1.x - s0.x), s0.y + t * (s1.y - s0.y));
}

// Whether the piece of an edge at parameter tm lies on a stretch shared with the other layer (a collinear
// overlap record of the edge's slot, o_lo..o_hi in ov_order), and whether any such record keeps it.
__device__ __forceinline__ bool on_overlap(double tm, int o_lo, int o_hi, const int* ov_order, const double* ov_lo,
                                           const double* ov_hi, const int* ov_keep, bool& keep) {
    bool shared = false;
    keep = false;
    for (int j = o_lo; j < o_hi; ++j) {
        int rec = ov_order[j];
        if (ov_lo[rec] <= tm && tm <= ov_hi[rec]) { shared = true; keep |= ov_keep[rec] != 0; }
    }
    return shared;
}

// Thread tid's ring of area_rings: its pair p, side (0: a's ring, 1: b's), the ring r (-1: past the polygon's
// rings), its coordinates k0..k1 and the slot of its coordinate k (slot0 + k), and the other polygon go.
struct AreaRing {
    int p, side, r, k0, k1, go;
    long long slot0;
    const double2 *C, *CO;
    const int *roO, *groO;
    const double* boxO;
};

__device__ __forceinline__ AreaRing area_ring(long long tid, int max_rings, const double2* ca, const int* ro_a,
                                              const int* gro_a, const double* box_a, const double2* cb,
                                              const int* ro_b, const int* gro_b, const double* box_b,
                                              const int* pair_a, const int* pair_b, const long long* slot_incl) {
    long long per_pair = 2LL * max_rings;
    AreaRing R;
    R.p = (int)(tid / per_pair);
    int rem = (int)(tid % per_pair), lr = rem % max_rings;
    R.side = rem / max_rings;
    int a = pair_a[R.p], b = pair_b[R.p];
    const int *ro = R.side ? ro_b : ro_a, *gro = R.side ? gro_b : gro_a;
    int g = R.side ? b : a;
    R.go = R.side ? a : b;
    R.C = R.side ? cb : ca;
    R.CO = R.side ? ca : cb;
    R.roO = R.side ? ro_a : ro_b; R.groO = R.side ? gro_a : gro_b;
    R.boxO = (R.side ? box_a : box_b) + 4 * (long long)R.go;
    R.r = gro[g] + lr;
    if (R.r >= gro[g + 1]) { R.r = -1; return R; }
    long long base = R.p == 0 ? 0 : slot_incl[R.p - 1];
    int a_coords = ro_a[gro_a[a + 1]] - ro_a[gro_a[a]];
    R.slot0 = base + (R.side ? a_coords : 0) - ro[gro[g]];
    R.k0 = ro[R.r]; R.k1 = ro[R.r + 1] - 1;
    return R;
}

// A cut ring's pieces, each decided on its own (v1, v2): the shoelace terms of those kept into acc, relative to o.
// EXACT false: false as soon as a piece's test cannot tell (the ring is then done again by area_rings_exact, and
// what this call counted is dropped).
template <bool EXACT>
__device__ __forceinline__ bool cut_ring_pieces(const AreaRing& R, double2 o, const int* ev_start,
                                                const int* ev_order, const double* ev_t, const int* ov_start,
                                                const int* ov_order, const double* ov_lo, const double* ov_hi,
                                                const int* ov_keep, double errA, double& acc,
                                                unsigned long long& n_pip, unsigned long long& n_pieces,
                                                unsigned long long& n_kept, unsigned long long& edges) {
    const double* boxO = R.boxO;
    for (int k = R.k0; k < R.k1; ++k) {
        long long s = R.slot0 + k;
        int e_lo = ev_start[s], e_hi = ev_start[s + 1], o_lo = ov_start[s], o_hi = ov_start[s + 1];
        double2 e0 = R.C[k], e1 = R.C[k + 1];
        if (e_lo == e_hi && o_lo == o_hi &&
            !boxes_meet(fmin(e0.x, e1.x), fmin(e0.y, e1.y), fmax(e0.x, e1.x), fmax(e0.y, e1.y), boxO))
            continue;   // no events and away from the other polygon: outside
        double t0 = 0.0;
        for (int i = e_lo; i <= e_hi; ++i) {
            double t1 = i < e_hi ? ev_t[ev_order[i]] : 1.0;
            if (!(t1 > t0)) continue;
            ++n_pieces;
            double tm = 0.5 * (t0 + t1);
            bool keep;
            bool shared = on_overlap(tm, o_lo, o_hi, ov_order, ov_lo, ov_hi, ov_keep, keep);
            if (!shared) {
                bool in_box, bnd, unsure = false;
                keep = piece_inside<EXACT>(R.C + k, tm, R.CO, R.roO, R.groO, R.go, boxO, errA, edges, in_box, bnd,
                                           unsure);
                if (unsure) return false;
                n_pip += in_box;
            }
            if (keep) {
                ++n_kept;
                double2 q0 = point_at(e0, e1, t0), q1 = point_at(e0, e1, t1);
                acc += (q0.x - o.x) * (q1.y - o.y) - (q1.x - o.x) * (q0.y - o.y);
            }
            t0 = t1;
        }
    }
    return true;
}

extern "C" __global__ void area_rings(
        const double2* ca, const int* ro_a, const int* gro_a, const double* box_a, const double* ra2_a,
        const double* rbox_a, const double2* cb, const int* ro_b, const int* gro_b, const double* box_b,
        const double* ra2_b, const double* rbox_b, const int* pair_a, const int* pair_b, int P, int max_rings,
        const long long* slot_incl, const int* ev_start, const int* ev_order, const double* ev_t,
        const int* ov_start, const int* ov_order, const double* ov_lo, const double* ov_hi, const int* ov_keep,
        double errA, double* contrib, unsigned long long* stats, long long* redo, unsigned long long* redo_count) {
    long long tid = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    double acc = 0.0;
    unsigned long long n_pip = 0, n_pieces = 0, n_kept = 0, n_cut = 0, ex = 0, edges = 0;
    if (tid < (long long)P * 2 * max_rings) {
        AreaRing R = area_ring(tid, max_rings, ca, ro_a, gro_a, box_a, cb, ro_b, gro_b, box_b, pair_a, pair_b,
                               slot_incl);
        if (R.r >= 0) {
            const double* boxO = R.boxO;
            bool cut = ev_start[R.slot0 + R.k1] != ev_start[R.slot0 + R.k0] ||
                       ov_start[R.slot0 + R.k1] != ov_start[R.slot0 + R.k0];
            const double* rb = (R.side ? rbox_b : rbox_a) + 4 * (long long)R.r;
            if (!cut) {
                if (boxes_meet(rb[0], rb[1], rb[2], rb[3], boxO)) {
                    double2 m = R.C[R.k0];     // an input vertex, off the other boundary (the ring has no record)
                    if (boxO[0] <= m.x && m.x <= boxO[2] && boxO[1] <= m.y && m.y <= boxO[3]) {
                        bool bnd = false;
                        ++n_pip;
                        if (classify_point(R.CO, R.roO, R.groO, R.go, m, errA, ex, edges, bnd) && !bnd)
                            acc += (R.side ? ra2_b : ra2_a)[R.r];
                    }
                }
            } else {
                n_cut = 1;
                const double2 o = shoelace_origin(box_a + 4 * (long long)pair_a[R.p],
                                                  box_b + 4 * (long long)pair_b[R.p]);
                unsigned long long pip = 0, pieces = 0, kept = 0;
                if (cut_ring_pieces<false>(R, o, ev_start, ev_order, ev_t, ov_start, ov_order, ov_lo, ov_hi, ov_keep,
                                           errA, acc, pip, pieces, kept, edges)) {
                    n_pip += pip; n_pieces += pieces; n_kept += kept;
                } else {
                    acc = 0.0;          // area_rings_exact writes this ring's contribution
                    redo[atomicAdd(redo_count, 1ull)] = tid;
                }
            }
        }
        contrib[tid] = acc;
    }
    unsigned long long v[4] = {n_pip, n_pieces, n_kept, n_cut};
    block_add<4>(stats, v);
}

// The rings area_rings listed (redo, redo_count of them), their pieces decided from the input doubles: each ring's
// contribution and its tests, pieces and kept pieces (stats as area_rings'). A fixed grid striding over the list,
// whose length only the device knows; at most 128 registers (launched with the area stage's block, up to 512).
extern "C" __global__ void __launch_bounds__(512, 1) area_rings_exact(
        const double2* ca, const int* ro_a, const int* gro_a, const double* box_a, const double2* cb,
        const int* ro_b, const int* gro_b, const double* box_b, const int* pair_a, const int* pair_b, int max_rings,
        const long long* slot_incl, const int* ev_start, const int* ev_order, const double* ev_t,
        const int* ov_start, const int* ov_order, const double* ov_lo, const double* ov_hi, const int* ov_keep,
        double errA, const long long* redo, const unsigned long long* redo_count, double* contrib,
        unsigned long long* stats) {
    unsigned long long n_pip = 0, n_pieces = 0, n_kept = 0, edges = 0;
    long long n = (long long)*redo_count;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        long long tid = redo[i];
        AreaRing R = area_ring(tid, max_rings, ca, ro_a, gro_a, box_a, cb, ro_b, gro_b, box_b, pair_a, pair_b,
                               slot_incl);
        const double2 o = shoelace_origin(box_a + 4 * (long long)pair_a[R.p], box_b + 4 * (long long)pair_b[R.p]);
        double acc = 0.0;
        cut_ring_pieces<true>(R, o, ev_start, ev_order, ev_t, ov_start, ov_order, ov_lo, ov_hi, ov_keep, errA, acc,
                              n_pip, n_pieces, n_kept, edges);
        contrib[tid] = acc;
    }
    unsigned long long v[3] = {n_pip, n_pieces, n_kept};
    block_add<3>(stats, v);
}

// Per pair: half the sum of its rings' contributions; keep[p] = area > 0. kept[0] += pairs kept (the result's
// length, read by the host with the run's other counters). n_pairs: as live_count's (v3), or null.
extern "C" __global__ void pair_area(const double* contrib, int P, const unsigned long long* n_pairs, int max_rings,
                                     double* area, int* keep, unsigned long long* kept) {
    int p = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned long long k = 0;
    if (p < live_count(P, n_pairs)) {
        double s = 0.0;
        for (int i = 0; i < 2 * max_rings; ++i) s += contrib[(long long)p * 2 * max_rings + i];
        area[p] = 0.5 * s;
        keep[p] = k = 0.5 * s > 0.0;
    }
    unsigned long long v[1] = {k};
    block_add<1>(kept, v);
}

extern "C" __global__ void emit_areas(const int* keep, const long long* incl, int P, const unsigned long long* n_pairs,
                                      const int* pair_a, const int* pair_b, const double* area, int* out_a,
                                      int* out_b, double* out_area) {
    int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= live_count(P, n_pairs) || !keep[p]) return;
    long long i = incl[p] - 1;
    out_a[i] = pair_a[p]; out_b[i] = pair_b[p]; out_area[i] = area[p];
}
