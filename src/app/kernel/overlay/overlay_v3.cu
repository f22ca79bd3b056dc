// overlay v3's kernels; compiled after overlay.cu and overlay_area.cu (scan.cu and common.cuh in front), whose
// helpers (point_at) and edge-slot conventions they share.

// ---- v3 filter, part 2: half a warp per polygon pair, b's edges broadcast by shuffles --
// A group of EDGE_GROUP (16) lanes takes a polygon pair, two pairs a warp. Lanes hold 16 of
// a's edges at a time (those that reach b's bbox); b's edges that reach a's bbox are found
// 16 at a time by a ballot and each is broadcast to the group's lanes: the same tests as
// edge_pairs, with no lane looping over b on its own. Half a warp because the kernel waits
// on memory, not on its arithmetic: each pair first follows a chain of dependent loads
// (pair -> polygon -> rings -> coordinates), and with a warp a pair only 32 of those chains
// were in flight an SM (64 registers a thread: 32 warps). The layers' polygons have 16 edges a ring, so a group covers a ring
// in one step, as a warp did with half its lanes idle. The two groups of a warp run their
// own loops: every warp intrinsic names only its group's lanes (gmask), as cooperative
// groups' tiled partitions do.
// One pass: a broadcast's hits go into the group's stash in shared memory (a ballot places
// them), and the stash is written out when full and at the pair's end, its room reserved
// with one atomic add on stats[1]; those past ``room`` are not written (the caller grows
// the room and runs again when stats[1] comes back larger). Candidates land in no
// particular order: refine's records are grouped by slot and sorted by t afterwards anyway.
// The pairs' buffers have a room of P too: n_pairs, a device word, holds how many are live
// (live_count), and so do the slot tables (n_slots): a pair whose slots end past it is
// skipped (pair_in_room). stats[0] += MBR tests, stats[1] += candidates.
#define EDGE_GROUP 16          // lanes a polygon pair (gpu.py's EDGE_GROUP)
#define EDGE_STASH 64          // candidates a group keeps (random layers find about 4.5 a pair)
#define EDGE_STASH_WARPS 16    // the most warps a block: blocks of up to 512 threads

// Whether live pair p's edge slots fit the slots' room (n_slots): v3's sort and area kernels index tables sized
// by it (an entry a bucket of slots). Where they do not, the run's slot count is past the room, and the run goes
// again in a larger one.
__device__ __forceinline__ bool pair_in_room(int p, int P, const unsigned long long* n_pairs,
                                             const long long* slot_incl, long long n_slots) {
    return p < live_count(P, n_pairs) && slot_incl[p] <= n_slots;
}

// The bbox of the edge a lane's coordinate k starts, if it starts one: k < end, and not its ring's last
// coordinate (a ring's last repeats its first). (ring, ring_end) follow k forward, chunk after chunk.
__device__ __forceinline__ bool lane_edge_box(const double2* c, const int* ro, int k, int end, int& ring,
                                              int& ring_end, double& x0, double& y0, double& x1, double& y1) {
    if (k >= end) return false;
    while (k >= ring_end + 1) { ++ring; ring_end = ro[ring + 1] - 1; }
    if (k >= ring_end) return false;
    double2 e0 = c[k], e1 = c[k + 1];
    x0 = fmin(e0.x, e1.x); y0 = fmin(e0.y, e1.y); x1 = fmax(e0.x, e1.x); y1 = fmax(e0.y, e1.y);
    return true;
}

// The group's stash (cnt candidates, group-uniform) out to its reserved room; every lane of the group calls it.
// gl: the lane's place in its group; leader: the group's first lane in the warp.
__device__ __forceinline__ void flush_edge_stash(const int2* stash, int& cnt, int p, int gl, unsigned int gmask,
                                                 int leader, unsigned long long* counter, long long room, int* out_p,
                                                 int* out_ka, int* out_kb) {
    if (cnt == 0) return;
    unsigned long long base = 0;
    if (gl == 0) base = atomicAdd(counter, (unsigned long long)cnt);
    base = __shfl_sync(gmask, base, leader);
    __syncwarp(gmask);                               // the lanes' stash writes before they are read
    for (int i = gl; i < cnt; i += EDGE_GROUP) {
        long long pos = (long long)base + i;
        if (pos < room) { int2 v = stash[i]; out_p[pos] = p; out_ka[pos] = v.x; out_kb[pos] = v.y; }
    }
    __syncwarp(gmask);                               // read before the next hits overwrite them
    cnt = 0;
}

// ptxas holds it to 64 registers at this bound (24 bytes a thread spilled to L1); with a bound of 1 block an SM it
// takes 72 and spills none, and ran the filter stage 1.07x slower at 100k x 100k on an H200 (a tie at 10k x 10k).
extern "C" __global__ void __launch_bounds__(32 * EDGE_STASH_WARPS)
edge_pairs_warp(const double2* ca, const int* ro_a, const int* gro_a, const double* box_a, const double2* cb,
                const int* ro_b, const int* gro_b, const double* box_b, const int* pair_a, const int* pair_b, int P,
                const unsigned long long* n_pairs, const long long* slot_incl, long long n_slots, long long room,
                int* out_p, int* out_ka, int* out_kb, unsigned long long* stats) {
    __shared__ WarpSums<1> sums;
    __shared__ int2 stashes[EDGE_STASH_WARPS][32 / EDGE_GROUP][EDGE_STASH];
    warp_sums_init(sums);
    int p = (int)((blockIdx.x * (long long)blockDim.x + threadIdx.x) / EDGE_GROUP);    // group-uniform
    int lane = threadIdx.x & 31, gl = lane % EDGE_GROUP, leader = lane - gl;
    unsigned int gmask = (0xffffffffu >> (32 - EDGE_GROUP)) << leader;
    int2* stash = stashes[threadIdx.x >> 5][leader / EDGE_GROUP];
    unsigned long long tests = 0;
    if (pair_in_room(p, P, n_pairs, slot_incl, n_slots)) {
        int a = pair_a[p], b = pair_b[p];
        const double* BA = box_a + 4 * (long long)a;
        const double* BB = box_b + 4 * (long long)b;
        double bax0 = BA[0], bay0 = BA[1], bax1 = BA[2], bay1 = BA[3];
        int a0 = ro_a[gro_a[a]], a1 = ro_a[gro_a[a + 1]];
        int b0 = ro_b[gro_b[b]], b1 = ro_b[gro_b[b + 1]];
        int ring = gro_a[a], ring_end = ro_a[ring + 1] - 1;
        int cnt = 0;                                 // candidates in the stash (group-uniform)
        for (int abase = a0; abase < a1; abase += EDGE_GROUP) {
            int k = abase + gl;
            double ex0 = 0, ey0 = 0, ex1 = 0, ey1 = 0;
            bool live = lane_edge_box(ca, ro_a, k, a1, ring, ring_end, ex0, ey0, ex1, ey1) &&
                        boxes_meet(ex0, ey0, ex1, ey1, BB);
            if (!__any_sync(gmask, live)) continue;
            int rb = gro_b[b], rb_end = ro_b[rb + 1] - 1;
            for (int bbase = b0; bbase < b1; bbase += EDGE_GROUP) {
                int kb = bbase + gl;
                double fx0 = 0, fy0 = 0, fx1 = 0, fy1 = 0;
                bool near = lane_edge_box(cb, ro_b, kb, b1, rb, rb_end, fx0, fy0, fx1, fy1) &&
                            fx0 <= bax1 && bax0 <= fx1 && fy0 <= bay1 && bay0 <= fy1;
                // The group's lanes, from bit 0 (masked: only they voted, whatever the other group does).
                unsigned int nb = (__ballot_sync(gmask, near) & gmask) >> leader;
                while (nb) {
                    int j = __ffs(nb) - 1;
                    nb &= nb - 1;
                    double gx0 = __shfl_sync(gmask, fx0, leader + j), gy0 = __shfl_sync(gmask, fy0, leader + j);
                    double gx1 = __shfl_sync(gmask, fx1, leader + j), gy1 = __shfl_sync(gmask, fy1, leader + j);
                    bool hit = live && ex0 <= gx1 && gx0 <= ex1 && ey0 <= gy1 && gy0 <= ey1;
                    tests += live;
                    unsigned int hits = (__ballot_sync(gmask, hit) & gmask) >> leader;
                    if (cnt + __popc(hits) > EDGE_STASH)
                        flush_edge_stash(stash, cnt, p, gl, gmask, leader, stats + 1, room, out_p, out_ka, out_kb);
                    if (hit) stash[cnt + __popc(hits & ((1u << gl) - 1))] = make_int2(k, bbase + j);
                    cnt += __popc(hits);
                }
            }
        }
        flush_edge_stash(stash, cnt, p, gl, gmask, leader, stats + 1, room, out_p, out_ka, out_kb);
    }
    unsigned long long v[1] = {tests};
    warp_sums_add(sums, stats, v);       // no barrier at the end: a pair's work varies with its edges
}

// ---- v3 area reconstruction: inside/outside carried along the ring -----------------
// As area_rings, but a cut ring's pieces do not each need a point-in-polygon test. Along
// the ring the status (inside or outside the other polygon) changes only where the other
// boundary meets it, and every such point has a record: a proper crossing flips the
// status; a touch, a mark at a segment's end or a shared stretch makes it unknown, and
// the next piece is classified by its middle point as in area_rings (piece_inside: exact
// for that point). A status is carried only from a classification that can be trusted:
// outside the other polygon's bbox, or a test off the boundary on a piece at least TRUST_T
// of its edge long (a piece a few ulps long may have its bounds a few ulps off, and its
// middle outside the piece it stands for).
//
// Two kernels. area_rings_flip takes a thread per (pair, side, ring) as area_rings does:
// a ring with no record (the other boundary meets it nowhere) is settled by one exact
// point-in-polygon test of its first vertex, and a cut ring is appended to a list.
// area_cut_rings walks the listed rings, 32 to a warp: walks are long and the uncut
// rings short, and mixed in one warp the walk would hold the others.
#define TRUST_T 1e-6

struct RingRef {        // one ring of one side of a polygon pair, and the other polygon
    const double2* C; int k0, k1; long long slot0;
    const double2* CO; const int *roO, *groO; int go; const double* boxO;
};

__device__ __forceinline__ RingRef ring_ref(long long tid, int max_rings, const double2* ca, const int* ro_a,
                                            const int* gro_a, const double* box_a, const double2* cb,
                                            const int* ro_b, const int* gro_b, const double* box_b,
                                            const int* pair_a, const int* pair_b, const long long* slot_incl,
                                            int& r, int& p, int& side) {
    long long per_pair = 2LL * max_rings;
    p = (int)(tid / per_pair);
    int rem = (int)(tid % per_pair), lr = rem % max_rings;
    side = rem / max_rings;
    int a = pair_a[p], b = pair_b[p];
    const int *ro = side ? ro_b : ro_a, *gro = side ? gro_b : gro_a;
    int g = side ? b : a;
    RingRef R;
    R.go = side ? a : b;
    R.C = side ? cb : ca;
    R.CO = side ? ca : cb;
    R.roO = side ? ro_a : ro_b; R.groO = side ? gro_a : gro_b;
    R.boxO = (side ? box_a : box_b) + 4 * (long long)R.go;
    r = gro[g] + lr;
    if (r >= gro[g + 1]) { r = -1; return R; }
    long long base = p == 0 ? 0 : slot_incl[p - 1];
    int a_coords = ro_a[gro_a[a + 1]] - ro_a[gro_a[a]];
    R.slot0 = base + (side ? a_coords : 0) - ro[gro[g]];     // slot of coordinate k: slot0 + k
    R.k0 = ro[r]; R.k1 = ro[r + 1] - 1;
    return R;
}

// ---- v3's record sort, its last step: each bucket's records by slot, then by key ----------
// v3's tables are keyed by buckets of SLOT_BUCKET (32) edge slots (overlay_area.cu's slot_count
// and slot_scatter with shift SLOT_BUCKET_SHIFT): a table of every edge slot cost more to
// zero and scan than the records it placed. Here each record finds its place in its bucket
// (``grouped``, as the scatter left it) by counting the bucket's records that sort before
// it -- by slot, then key (t, or lo), then record number, so ties are placed the same way
// every run -- a thread a record, each reading its bucket's few records (about 2.7 at
// 100k x 100k). A record's place gets its number (``order``) and its slot (``sslot``: the
// area kernels find a slot's records in the sorted list by it, first_at); a split record's
// also gets its t and kind, so the ring walk reads them in order with no indirection.
// A bucket of more than SLOT_BUCKET_RANKED records is ordered by its first-ranked record's
// thread instead (counted by slot and placed, then each slot's run sorted by key, as
// slot_sort does for a slot): no worse than a table of every slot, where each record of a
// bucket of thousands would read thousands.
#define SLOT_BUCKET_SHIFT 5    // gpu.py's SLOT_BUCKET_SHIFT
#define SLOT_BUCKET (1 << SLOT_BUCKET_SHIFT)
#define SLOT_BUCKET_RANKED 256

struct SortedRecords {         // one record set's sorted outputs
    int* order;
    int* sslot;
    double* ts;                // split records only: t and kind in sorted order (null for overlap records)
    signed char* ks;
};

__device__ __forceinline__ void place_record(const SortedRecords& out, int at, int r, int slot, const double* key,
                                             const signed char* kind) {
    out.order[at] = r;
    out.sslot[at] = slot;
    if (out.ts) { out.ts[at] = key[r]; out.ks[at] = kind[r]; }
}

extern "C" __global__ void bucket_sort(const int* ev_slot, const int* ev_rank, const int* ev_start, const double* ev_t,
                                       const signed char* ev_kind, const int* ev_grouped, int* ev_order, int* ev_sslot,
                                       double* ev_ts, signed char* ev_ks, const int* ov_slot, const int* ov_rank,
                                       const int* ov_start, const double* ov_lo, const int* ov_grouped, int* ov_order,
                                       int* ov_sslot, const unsigned long long* n_records) {
    long long n_ev = (long long)n_records[0], n_ov = (long long)n_records[1];
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n_ev + n_ov; i += stride) {
        bool ov = i >= n_ev;
        int r = (int)(ov ? i - n_ev : i);
        const int* slot = ov ? ov_slot : ev_slot;
        const double* key = ov ? ov_lo : ev_t;
        const int* grouped = ov ? ov_grouped : ev_grouped;
        SortedRecords out = ov ? SortedRecords{ov_order, ov_sslot, nullptr, nullptr}
                               : SortedRecords{ev_order, ev_sslot, ev_ts, ev_ks};
        int sv = slot[r];
        int b = sv >> SLOT_BUCKET_SHIFT;
        int i0 = (ov ? ov_start : ev_start)[b], i1 = (ov ? ov_start : ev_start)[b + 1];
        if (i1 - i0 <= SLOT_BUCKET_RANKED) {
            double kv = key[r];
            int at = i0;
            for (int j = i0; j < i1; ++j) {
                int w = grouped[j], sw = slot[w];
                if (sw < sv) { ++at; continue; }
                if (sw > sv || w == r) continue;
                double kw = key[w];
                at += kw < kv || (kw == kv && w < r);
            }
            place_record(out, at, r, sv, key, ev_kind);
            continue;
        }
        if ((ov ? ov_rank : ev_rank)[r] != 0) continue;
        int at[SLOT_BUCKET];
        for (int k = 0; k < SLOT_BUCKET; ++k) at[k] = 0;
        for (int k = i0; k < i1; ++k) ++at[slot[grouped[k]] & (SLOT_BUCKET - 1)];
        for (int k = 0, run = i0; k < SLOT_BUCKET; ++k) { int c = at[k]; at[k] = run; run += c; }
        int* order = out.order;
        for (int k = i0; k < i1; ++k) { int v = grouped[k]; order[at[slot[v] & (SLOT_BUCKET - 1)]++] = v; }
        for (int k = i0 + 1; k < i1; ++k) {     // order is by slot now: only a slot's own run moves
            int v = order[k], s = slot[v];
            double kv = key[v];
            int j = k - 1;
            while (j >= i0 && slot[order[j]] == s && key[order[j]] > kv) { order[j + 1] = order[j]; --j; }
            order[j + 1] = v;
        }
        for (int k = i0; k < i1; ++k) place_record(out, k, order[k], slot[order[k]], key, ev_kind);
    }
}

// The position of the first record at slot s or after it, in a record list sorted by slot: its bucket's start,
// then past the bucket's records of earlier slots (a bucket holds a few records at most, usually).
__device__ __forceinline__ int first_at(long long s, const int* start, const int* sslot) {
    long long b = s >> SLOT_BUCKET_SHIFT;
    int j = start[b], end = start[b + 1];
    while (j < end && sslot[j] < s) ++j;
    return j;
}

// Whether a record list sorted by slot has one at a slot in s0 .. s1 - 1: the records of the buckets those slots
// fall in are start[b0] .. start[b1 + 1]; with none (a ring of a pair that does not cross) two loads decide.
__device__ __forceinline__ bool any_record(long long s0, long long s1, const int* start, const int* sslot) {
    int j = start[s0 >> SLOT_BUCKET_SHIFT], end = start[(s1 >> SLOT_BUCKET_SHIFT) + 1];
    while (j < end && sslot[j] < s0) ++j;
    return j < end && sslot[j] < s1;
}

// At most 64 registers (93 unbounded; it spills 40 bytes a thread, which stay in L1): 32 warps an SM instead of
// fewer, for a kernel that mostly waits on each ring's chain of dependent loads. Interleaved in one process on an
// H200, the stage took 469.8 us unbounded against 387.1 us at 100k x 100k (1.21x slower), 133.1 against 140.9 at
// 10k x 10k (0.95x): the default sizes' gain is smaller than the large size's loss.
extern "C" __global__ void __launch_bounds__(512, 2) area_rings_flip(
        const double2* ca, const int* ro_a, const int* gro_a, const double* box_a, const double* ra2_a,
        const double* rbox_a, const double2* cb, const int* ro_b, const int* gro_b, const double* box_b,
        const double* ra2_b, const double* rbox_b, const int* pair_a, const int* pair_b, int P,
        const unsigned long long* n_pairs, int max_rings, const long long* slot_incl, long long n_slots,
        const int* ev_start, const int* ev_sslot, const int* ov_start, const int* ov_sslot, double errA,
        double* contrib, long long* cut_list, unsigned long long* stats) {
    __shared__ WarpSums<1> sums;
    warp_sums_init(sums);
    long long tid = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    double acc = 0.0;
    bool cut = false;
    unsigned long long n_pip = 0, ex = 0, edges = 0;
    int r = -1, p = 0, side = 0;
    if (tid < (long long)P * 2 * max_rings &&
        pair_in_room((int)(tid / (2LL * max_rings)), P, n_pairs, slot_incl, n_slots)) {
        RingRef R = ring_ref(tid, max_rings, ca, ro_a, gro_a, box_a, cb, ro_b, gro_b, box_b, pair_a, pair_b,
                             slot_incl, r, p, side);
        if (r >= 0) {
            long long s0 = R.slot0 + R.k0, s1 = R.slot0 + R.k1;     // the ring's edge slots: s0 .. s1 - 1
            cut = any_record(s0, s1, ev_start, ev_sslot) || any_record(s0, s1, ov_start, ov_sslot);
            const double* rb = (side ? rbox_b : rbox_a) + 4 * (long long)r;
            if (!cut && boxes_meet(rb[0], rb[1], rb[2], rb[3], R.boxO)) {
                double2 m = R.C[R.k0];     // an input vertex, off the other boundary (the ring has no record)
                const double* bo = R.boxO;
                if (bo[0] <= m.x && m.x <= bo[2] && bo[1] <= m.y && m.y <= bo[3]) {
                    bool bnd = false;
                    ++n_pip;
                    if (classify_point(R.CO, R.roO, R.groO, R.go, m, errA, ex, edges, bnd) && !bnd)
                        acc += (side ? ra2_b : ra2_a)[r];
                }
            }
        }
        contrib[tid] = acc;      // a cut ring's is written by area_cut_rings
    }
    // Append the warp's cut rings with one global atomic (stats[3] counts them and sizes the list). A block's
    // append (two barriers) held its warps until the slowest ring's point-in-polygon test was done.
    unsigned long long at = warp_append(cut, stats + 3);
    if (cut) cut_list[at] = tid;
    unsigned long long v[1] = {n_pip};
    warp_sums_add(sums, stats, v);
}

// Walks cut ring R (of pair p), carrying its status: the shoelace terms of its kept pieces into acc, relative to o.
// EXACT false (area_cut_rings): false as soon as a test the status needs cannot tell (the ring is then walked again
// by area_cut_rings_exact, and what this walk counted is dropped).
template <bool EXACT>
__device__ __forceinline__ bool walk_ring(const RingRef& R, double2 o, const int* ev_start, const int* ev_sslot,
                                          const double* ev_ts, const signed char* ev_ks, const int* ov_start,
                                          const int* ov_sslot, const int* ov_order, const double* ov_lo,
                                          const double* ov_hi, const int* ov_keep, int n_ev, int n_ov, double errA,
                                          double& acc, unsigned long long& n_pip, unsigned long long& n_pieces,
                                          unsigned long long& n_kept, unsigned long long& edges) {
    const double* boxO = R.boxO;
    int status = -1;   // -1 unknown, 0 outside, 1 inside
    // The records are sorted by slot, and the ring's edges are consecutive slots: an edge's records start
    // where its predecessor's end, and the slot of the next record (e_at, o_at; -1 past the last) says
    // whether this edge has any, so an edge with none loads nothing but its end point (loaded a step ahead).
    int s = (int)(R.slot0 + R.k0);        // slots fit an int (the backend checks the slot count)
    int e_lo = first_at(s, ev_start, ev_sslot), o_lo = first_at(s, ov_start, ov_sslot);
    int e_at = e_lo < n_ev ? ev_sslot[e_lo] : -1, o_at = o_lo < n_ov ? ov_sslot[o_lo] : -1;
    double2 e0 = R.C[R.k0], e1 = R.C[R.k0 + 1];
    for (int k = R.k0; k < R.k1; ++k, ++s) {
        double2 c_next = e1;
        if (k + 1 < R.k1) c_next = R.C[k + 2];
        int e_hi = e_lo, o_hi = o_lo;
        while (e_at == s) { ++e_hi; e_at = e_hi < n_ev ? ev_sslot[e_hi] : -1; }
        while (o_at == s) { ++o_hi; o_at = o_hi < n_ov ? ov_sslot[o_hi] : -1; }
        if (status < 0 && e_lo == e_hi && o_lo == o_hi &&
            !boxes_meet(fmin(e0.x, e1.x), fmin(e0.y, e1.y), fmax(e0.x, e1.x), fmax(e0.y, e1.y), boxO))
            status = 0;   // no records and away from the other polygon: outside
        double t0 = 0.0;
        for (int j = e_lo; j <= e_hi; ++j) {
            double t1 = j < e_hi ? ev_ts[j] : 1.0;
            if (t1 > t0) {
                ++n_pieces;
                double tm = 0.5 * (t0 + t1);
                bool keep;
                bool shared = on_overlap(tm, o_lo, o_hi, ov_order, ov_lo, ov_hi, ov_keep, keep);
                if (shared) {
                    status = -1;
                } else if (status >= 0) {
                    keep = status;
                } else {
                    bool in_box, bnd, unsure = false;
                    keep = piece_inside<EXACT>(R.C + k, tm, R.CO, R.roO, R.groO, R.go, boxO, errA, edges, in_box, bnd,
                                               unsure);
                    if (unsure) return false;
                    n_pip += in_box;
                    status = !in_box ? 0 : ((!bnd && t1 - t0 >= TRUST_T) ? (int)keep : -1);
                }
                if (keep) {
                    ++n_kept;
                    double2 q0 = point_at(e0, e1, t0), q1 = point_at(e0, e1, t1);
                    acc += (q0.x - o.x) * (q1.y - o.y) - (q1.x - o.x) * (q0.y - o.y);
                }
                t0 = t1;
            }
            if (j < e_hi) status = (ev_ks[j] && status >= 0) ? status ^ 1 : -1;
        }
        e_lo = e_hi; o_lo = o_hi; e0 = e1; e1 = c_next;
    }
    return true;
}

// Bounded for blocks of 512 (the largest the area stage's block takes): at most 128 registers (it compiles to about
// 110 on sm_90), so a change that needed more would spill rather than fail to launch at 512. A ring whose walk
// needs a test the filtered one cannot decide is listed (``redo``, its count in redo_count) for
// area_cut_rings_exact: the exact tests' expansions, called from here, cost this kernel 50 registers more.
extern "C" __global__ void __launch_bounds__(512) area_cut_rings(
        const double2* ca, const int* ro_a, const int* gro_a, const double* box_a, const double2* cb,
        const int* ro_b, const int* gro_b, const double* box_b, const int* pair_a, const int* pair_b, int max_rings,
        const long long* slot_incl, const int* ev_start, const int* ev_sslot, const double* ev_ts,
        const signed char* ev_ks, const int* ov_start, const int* ov_sslot, const int* ov_order,
        const double* ov_lo, const double* ov_hi, const int* ov_keep, const unsigned long long* n_records,
        double errA, const long long* cut_list, double* contrib, unsigned long long* stats, long long* redo,
        unsigned long long* redo_count) {
    unsigned long long n_pip = 0, n_pieces = 0, n_kept = 0, edges = 0;
    long long n_cut = (long long)stats[3];
    int n_ev = (int)n_records[0], n_ov = (int)n_records[1];
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n_cut;
         i += (long long)gridDim.x * blockDim.x) {
        long long tid = cut_list[i];
        int r, p, side;
        RingRef R = ring_ref(tid, max_rings, ca, ro_a, gro_a, box_a, cb, ro_b, gro_b, box_b, pair_a, pair_b,
                             slot_incl, r, p, side);
        const double2 o = shoelace_origin(box_a + 4 * (long long)pair_a[p], box_b + 4 * (long long)pair_b[p]);
        double acc = 0.0;
        unsigned long long pip = 0, pieces = 0, kept = 0;
        if (walk_ring<false>(R, o, ev_start, ev_sslot, ev_ts, ev_ks, ov_start, ov_sslot, ov_order, ov_lo, ov_hi,
                             ov_keep, n_ev, n_ov, errA, acc, pip, pieces, kept, edges)) {
            n_pip += pip; n_pieces += pieces; n_kept += kept;
            contrib[tid] = acc;
        } else {
            redo[atomicAdd(redo_count, 1ull)] = tid;       // area_cut_rings_exact writes its contribution
        }
    }
    unsigned long long v[3] = {n_pip, n_pieces, n_kept};
    block_add<3>(stats, v);
}

// The rings area_cut_rings listed (redo, redo_count of them), walked again with every test decided (from the input
// doubles where the filtered one could not): each ring's contribution and its tests, pieces and kept pieces.
extern "C" __global__ void __launch_bounds__(512, 1) area_cut_rings_exact(
        const double2* ca, const int* ro_a, const int* gro_a, const double* box_a, const double2* cb,
        const int* ro_b, const int* gro_b, const double* box_b, const int* pair_a, const int* pair_b, int max_rings,
        const long long* slot_incl, const int* ev_start, const int* ev_sslot, const double* ev_ts,
        const signed char* ev_ks, const int* ov_start, const int* ov_sslot, const int* ov_order,
        const double* ov_lo, const double* ov_hi, const int* ov_keep, const unsigned long long* n_records,
        double errA, const long long* redo, const unsigned long long* redo_count, double* contrib,
        unsigned long long* stats) {
    unsigned long long n_pip = 0, n_pieces = 0, n_kept = 0, edges = 0;
    long long n = (long long)*redo_count;
    int n_ev = (int)n_records[0], n_ov = (int)n_records[1];
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        long long tid = redo[i];
        int r, p, side;
        RingRef R = ring_ref(tid, max_rings, ca, ro_a, gro_a, box_a, cb, ro_b, gro_b, box_b, pair_a, pair_b,
                             slot_incl, r, p, side);
        const double2 o = shoelace_origin(box_a + 4 * (long long)pair_a[p], box_b + 4 * (long long)pair_b[p]);
        double acc = 0.0;
        walk_ring<true>(R, o, ev_start, ev_sslot, ev_ts, ev_ks, ov_start, ov_sslot, ov_order, ov_lo, ov_hi, ov_keep,
                        n_ev, n_ov, errA, acc, n_pip, n_pieces, n_kept, edges);
        contrib[tid] = acc;
    }
    unsigned long long v[3] = {n_pip, n_pieces, n_kept};
    block_add<3>(stats, v);
}
