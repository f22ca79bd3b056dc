// overlay v4: v3 with the filter's first eight launches in one cooperative launch (compiled after overlay.cu and
// overlay_v3.cu, whose per-item device functions it calls, so both versions run the same code on each polygon,
// cell and pair).
//
// Why: at the default sizes the plan is bound by its host's launches (5-8 us each on the lent hosts, the GPU idle
// in between), and v3's segment_mbr_filter issues nine: B counted into the grid's cells (corner_cells_grid), the
// cell table's scan, B's scatter (corner_scatter), the polygon pairs' count pass (polygon_pairs), its scan, its
// emit pass, the pairs' sort (sort_pairs), the edge slots' scan, then the edge-pair filter (edge_pairs_warp). Each
// of the first eight needs the one before it done on the whole grid, so here the grid waits at a barrier
// (common.cuh's grid_barrier) instead of ending the kernel; the edge-pair filter, whose blocks keep a stash in
// shared memory and whose register budget is its own, stays a launch of its own. The launch is cooperative,
// which keeps every block of the grid resident at once (the driver refuses a grid that cannot be): gpu.py sizes
// the grid within the occupancy the kernel allows, and each step strides over its items.

#define FILTER_SCAN_ITEMS 4    // gpu.py's FILTER_SCAN_ITEMS: the scans take tiles of block x this

// segment_mbr_filter up to the edge-pair filter, in one launch. What v3's launches take, in their order, with
// the ledger's words as v3 passes them: the grid (gp_out) and the counters the first step zeroes, the pair stats
// (pair_stats: bbox tests, pairs, a's past their stash), the live pair count (n_pairs, pair_stats[1]) and the
// slots' total (slot_total). Each scan has a state of its own (scan.cu's, left zeroed when done).
// The launch bounds hold it to polygon_pairs' 40 registers (48 warps an SM at 256 threads a block; ptxas spills 4
// bytes a thread to L1 for it): unbounded it takes 55, and an SM holds 32 warps.
extern "C" __global__ void __launch_bounds__(512, 3)
filter_fused(const double* box_a, int GA, const double* box_b, int GB, double* summary, long long G_all, int bias,
             int max_level, GridParams* gp_out, unsigned long long* counters, int n_counters, unsigned int* cell,
             int* slot, int* corner_counts, long long table_max, const long long* table_len, int* cell_start,
             unsigned long long* cell_scan, int* sorted_b, long long* pair_counts, long long* pair_offsets,
             unsigned long long* pair_scan, int* stash, unsigned long long* pair_stats, int* pair_a, int* pair_b,
             long long room, const int* ro_a, const int* gro_a, const int* ro_b, const int* gro_b, long long* slots,
             unsigned long long* slot_total, long long* slot_incl, unsigned long long* slot_scan,
             unsigned int* barrier) {
    __shared__ GridParams gp;
    const int first = blockIdx.x * blockDim.x + threadIdx.x, stride = gridDim.x * blockDim.x;
    const int lane = threadIdx.x & 31, first_warp = first >> 5, warps = stride >> 5;
    // corner_cells_grid: the grid chosen, the run's counters zeroed, B counted into its cells (in a table zero
    // already, as the last run's scatter left it or gpu.py zeroed it).
    block_grid_from_summary(summary, G_all, bias, max_level, gp, gp_out);
    if (blockIdx.x == 0)
        for (int k = threadIdx.x; k < n_counters; k += blockDim.x) counters[k] = 0;
    for (int g = first; g < GB; g += stride) corner_count(g, box_b, gp, cell, slot, corner_counts);
    grid_barrier(barrier);        // every b counted, the grid's table length (gp_out) stored
    scan_single_pass<int, int, FILTER_SCAN_ITEMS>(corner_counts, table_max, table_len, cell_start, cell_scan);
    grid_barrier(barrier);        // every cell's start known
    for (int g = first; g < GB; g += stride) corner_place(g, cell, slot, cell_start, sorted_b, corner_counts);
    grid_barrier(barrier);        // B bucketed
    // polygon_pairs' count pass, a warp an a: each a's pairs counted, its first PAIR_STASH b's kept.
    unsigned long long v[3] = {0ull, 0ull, 0ull};
    for (int a = first_warp; a < GA; a += warps)                   // warp-uniform
        warp_polygon_pairs(a, lane, box_a, box_b, summary, &gp, cell_start, sorted_b, pair_counts, nullptr, nullptr,
                           0, stash, v[0], v[1], v[2]);
    block_add<3>(pair_stats, v);
    grid_barrier(barrier);        // every a counted
    scan_single_pass<long long, long long, FILTER_SCAN_ITEMS>(pair_counts, GA, nullptr, pair_offsets, pair_scan);
    grid_barrier(barrier);        // every a's offset known, and the stats complete
    // The emit pass, for the a's with more pairs than their stash (none, mostly: then every block skips it).
    if (*(volatile unsigned long long*)(pair_stats + 2) != 0)      // grid-uniform: every block reads the total
        for (int a = first_warp; a < GA; a += warps)
            if (pair_counts[a] > PAIR_STASH)
                warp_polygon_pairs(a, lane, box_a, box_b, summary, &gp, cell_start, sorted_b, pair_counts,
                                   pair_offsets, pair_b, room, stash, v[0], v[1], v[2]);
    grid_barrier(barrier);        // every pair written
    // sort_pairs: each a's pairs in a-major order, b ascending, and their edge slots; the summary back at its
    // identities for the next run (every read of it is done).
    unsigned long long total[1] = {0ull};
    for (int a = first; a < GA; a += stride)
        total[0] += sort_pairs_of(a, pair_offsets, room, stash, pair_a, pair_b, ro_a, gro_a, ro_b, gro_b, slots);
    if (first == 0)
        for (int k = 0; k < 8; ++k) summary_identity(summary, k);
    block_add<1>(slot_total, total);
    grid_barrier(barrier);        // every pair's slots written
    // The slots' inclusive scan over the live pairs (n_pairs, at most the room).
    scan_single_pass<long long, long long, FILTER_SCAN_ITEMS>(slots, room, (const long long*)(pair_stats + 1),
                                                              slot_incl, slot_scan);
}
