// join v5: v4's morton_sort and output_sort, each one cooperative launch (compiled after join.cu, whose per-item
// device functions it calls, so the two versions run the same code on each point, pair and segment).
//
// Why: at the default sizes the plan is bound by its host's launches (5-8 us each on the lent hosts, the GPU
// idle in between), and v4's morton_sort launches three kernels (count into cells, scan the cell table,
// scatter) and its output_sort three more (scan the hit counts, scatter the pairs, sort each point's
// segment). Each step needs the one before it done on the whole grid, so here the grid waits at a barrier
// instead of ending the kernel. The kernels are launched cooperatively (cudaLaunchCooperativeKernel), which keeps
// every block of the grid resident at once -- the driver refuses a grid that cannot be -- and that is what makes
// a barrier across blocks safe; gpu.py sizes the grid within the occupancy the kernel allows. The barrier is
// cooperative groups' grid sync, written out in common.cuh (grid_barrier): its header needs the toolkit's and CCCL's
// include folders, which CuPy finds for its own build but not for the PTX a profile keeps beside it. On an H200
// a barrier across 264 blocks cost ~1.5 us, and a cooperative launch 6.0 against 4.8 us of host time for a
// plain one; captured into a CUDA graph, it replays.

// grid_barrier: common.cuh's.

#define FUSED_SCAN_ITEMS 4

// morton_sort in one launch: the grid chosen and every point counted into its cell (point_cells_grid), the
// cell table's inclusive scan to the real table length the device chose (table_len, a word of the ledger),
// and every point scattered to its place, with its coordinates (point_scatter_xy), or, with ``gather``, the
// indices scattered and then the coordinates gathered in bucketed order (v4's point_scatter + point_gather_xy,
// its choice from GATHER_XY_FROM points). The scatter leaves the cell table zeroed and the summary at its
// identities for the next run, as v4's does.
extern "C" __global__ void morton_fused(const double* pts, long long N, const double* summary, long long G, int bias,
                                        int max_level, GridParams* gp_out, unsigned int* pcell, int* slot,
                                        int* counts, int* point_counts, long long table_max,
                                        const long long* table_len, int* cell_start, unsigned long long* scan_state,
                                        int* sorted_pt, double2* sorted_xy, int gather, double* restore_summary,
                                        unsigned int* barrier) {
    __shared__ GridParams gp;
    block_grid_from_summary(summary, G, bias, max_level, gp, gp_out);
    const long long first = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    const long long stride = (long long)gridDim.x * blockDim.x;
    if (first == 0) point_counts[N] = 0;
    for (long long i = first; i < N; i += stride) count_point(i, pts, gp, pcell, slot, counts, point_counts);
    grid_barrier(barrier);        // every count in, the table length (gp_out) stored
    scan_single_pass<int, int, FUSED_SCAN_ITEMS>(counts, table_max, table_len, cell_start, scan_state);
    grid_barrier(barrier);        // every cell's start known
    const double2* xy = reinterpret_cast<const double2*>(pts);
    for (long long i = first; i < N; i += stride)
        scatter_point(i, xy, pcell, slot, cell_start, sorted_pt, gather ? nullptr : sorted_xy, counts, restore_summary);
    if (!gather) return;          // launch-uniform: every block returns here, or none does
    grid_barrier(barrier);
    for (long long j = first; j < N; j += stride) sorted_xy[j] = xy[sorted_pt[j]];
}

// output_sort in one launch: the scan of refine's per-point hit counts into each point's start, every hit to its
// place (pair_scatter: n_hits is refine's count, read here), then each point's polygons sorted (segment_sort).
extern "C" __global__ void output_fused(const int* point_counts, long long N, long long* start,
                                        unsigned long long* scan_state, const unsigned long long* hits,
                                        const unsigned long long* n_hits, const int* hit_slot, int* out_pt,
                                        int* out_poly, unsigned int* barrier) {
    scan_single_pass<int, long long, FUSED_SCAN_ITEMS>(point_counts, N + 1, nullptr, start, scan_state);
    grid_barrier(barrier);
    const long long first = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long h_end = (long long)*n_hits;
    for (long long h = first; h < h_end; h += stride) scatter_pair(h, hits, hit_slot, start, out_pt, out_poly);
    grid_barrier(barrier);
    for (long long i = first; i < N; i += stride) sort_segment(i, start, out_poly);
}
