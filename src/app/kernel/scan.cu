// Inclusive prefix sum in one launch (a single pass with decoupled look-back), replacing cupy.cumsum, whose
// ~30 us of host time per call dominated small stages, and our earlier two launches (tile sums, then a pass
// adding each tile's offset), each of which cost a few microseconds of device time plus a gap before the next.
//
// A block takes tiles (its threads x ITEMS items) in turn, numbered by an atomic counter in the order they are taken.
// For each it publishes the tile's total in a status word, reads its predecessors' words, 32 at a time, until
// it meets one that carries the inclusive prefix of everything before it, and publishes its own inclusive
// prefix in turn. Every tile a block waits on was taken earlier by a block that is running: no deadlock,
// whatever order the hardware schedules blocks in.
//
// The grid is fixed (gpu_build.py: two blocks an SM, as many as fit). join's cell table is sized for the
// finest grid and its real length read on the device: with a block a tile, 2,049 blocks were launched for
// the 33 tiles of 65k cells at 1M x 100k, and those that only returned cost a microsecond. In nsys on an H200
// (join v4): that scan 4.4 us against 8.9 us for the two launches, the 1M-entry hit-count scan 12.5 against
// 12.7 us; at 100k x 10k 4.2 against 8.6 us and 4.8 against 4.5 us; and one launch, not two. Tiles of 4,096
// (512 threads of 8 items) took 17.5 us for the hit counts.
//
// The state (tile counter, blocks done, status words) lives in a buffer zeroed once when it is allocated; the
// last block to finish zeroes it again, so no memset is needed between runs and the launch can sit in a CUDA
// graph. When n_dev is given the length is read from the device (at most n).
//
// Instantiated for the input/output integer types the kernels use. Totals must stay within +-2^61 (they are
// counts here): a status word keeps its flag in the top two bits.

// Two block shapes, as measured on an H200 (medians of 40 launches, CUDA events): 1,024 threads of 2 items for
// most scans, and for long int32 scans (the overlay's 10.6M event slots at 100k x 100k) 512 threads of 4 items,
// 4 blocks an SM: 71.3 against 90.5 us at 10.6M, 14.8 against 15.5 us at 1M, but 11.1 against 10.3 us at 65k
// and slower for int64 (139.7 against 117.9 us at 10.6M). gpu_build.py picks the shape by dtype and length
// (the wide one only for scans of a whole buffer: one whose length the device reads is mostly shorter).
#define SCAN_THREADS 1024
#define SCAN_ITEMS 2
#define SCAN_WIDE_THREADS 512
#define SCAN_WIDE_ITEMS 4
#define SCAN_STATE_HEAD 2                            // tile counter, blocks done; then a status word a tile
#define SCAN_AGGREGATE (1ull << 62)                  // the tile's own total
#define SCAN_PREFIX (2ull << 62)                     // the total of the tile and every tile before it
#define SCAN_FLAGS (3ull << 62)

template <typename T>
__device__ __forceinline__ T block_inclusive_scan(T v, T* warp_totals, T& block_total) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int off = 1; off < 32; off <<= 1) {
        T up = __shfl_up_sync(0xffffffffu, v, off);
        if (lane >= off) v += up;
    }
    if (lane == 31) warp_totals[warp] = v;
    __syncthreads();
    if (warp == 0) {
        T w = lane < (int)(blockDim.x >> 5) ? warp_totals[lane] : T(0);     // fewer than 32 warps: zeros after
        for (int off = 1; off < 32; off <<= 1) {
            T up = __shfl_up_sync(0xffffffffu, w, off);
            if (lane >= off) w += up;
        }
        warp_totals[lane] = w;
    }
    __syncthreads();
    block_total = warp_totals[31];
    T prefix = warp == 0 ? T(0) : warp_totals[warp - 1];
    __syncthreads();
    return v + prefix;
}

__device__ __forceinline__ long long scan_status_value(unsigned long long s) {
    return (long long)(s << 2) >> 2;                 // the low 62 bits, sign-extended
}

// Warp 0 of tile ``tile``'s block: the sum of every tile before it, from their status words.
__device__ long long scan_look_back(volatile unsigned long long* status, long long tile) {
    int lane = threadIdx.x & 31;
    long long before = 0;
    for (long long end = tile; ; end -= 32) {        // lane i reads tile end - 1 - i: nearest first
        long long j = end - 1 - lane;
        unsigned long long s = j >= 0 ? status[j] : SCAN_PREFIX;    // tile 0 always carries a prefix
        while (__any_sync(0xffffffffu, (s & SCAN_FLAGS) == 0))       // wait for the window's tiles to publish
            if ((s & SCAN_FLAGS) == 0) s = status[j];
        unsigned int prefixes = __ballot_sync(0xffffffffu, (s & SCAN_FLAGS) == SCAN_PREFIX);
        int stop = prefixes ? __ffs(prefixes) - 1 : 31;             // the nearest prefix ends the walk
        long long v = lane <= stop ? scan_status_value(s) : 0;
        for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
        before += __shfl_sync(0xffffffffu, v, 0);
        if (prefixes) return before;
    }
}

template <typename In, typename Out, int ITEMS>
__device__ void scan_single_pass(const In* x, long long n, const long long* n_dev, Out* out,
                                 unsigned long long* state) {
    __shared__ Out warp_totals[32];
    __shared__ long long tile_shared, before_shared;
    __shared__ bool last_shared;
    volatile unsigned long long* status = state + SCAN_STATE_HEAD;
    // Every block of the fixed grid takes part, those past the real length too: its first tile is taken
    // while the length is read, not after.
    if (threadIdx.x == 0) tile_shared = (long long)atomicAdd(state, 1ull);
    if (n_dev) n = min(*n_dev, n);
    const long long tile_items = (long long)blockDim.x * ITEMS;
    long long tiles = (n + tile_items - 1) / tile_items;
    for (bool first = true; ; first = false) {
        if (!first) {
            __syncthreads();                         // the last tile's shared words read before they change
            if (threadIdx.x == 0) tile_shared = (long long)atomicAdd(state, 1ull);
        }
        __syncthreads();
        long long tile = tile_shared;                // block-uniform: no __syncthreads skipped
        if (tile >= tiles) break;
        long long base = tile * tile_items + (long long)threadIdx.x * ITEMS;
        Out items[ITEMS];
        Out sum = 0;
#pragma unroll
        for (int k = 0; k < ITEMS; ++k) {
            items[k] = base + k < n ? (Out)x[base + k] : Out(0);
            sum += items[k];
            items[k] = sum;
        }
        Out total;
        Out incl = block_inclusive_scan<Out>(sum, warp_totals, total);
        Out excl = incl - sum;
        unsigned long long total_bits = (unsigned long long)(long long)total & ~SCAN_FLAGS;
        if (threadIdx.x == 0) status[tile] = (tile == 0 ? SCAN_PREFIX : SCAN_AGGREGATE) | total_bits;
        if (threadIdx.x < 32) {
            long long before = tile == 0 ? 0 : scan_look_back(status, tile);
            if (threadIdx.x == 0) {
                before_shared = before;
                if (tile > 0)
                    status[tile] = SCAN_PREFIX | ((unsigned long long)(before + (long long)total) & ~SCAN_FLAGS);
            }
        }
        __syncthreads();
        Out add = (Out)before_shared + excl;
#pragma unroll
        for (int k = 0; k < ITEMS; ++k)
            if (base + k < n) out[base + k] = items[k] + add;
    }
    // The last block to get here (every other has finished reading the status words) zeroes the state.
    if (threadIdx.x == 0) last_shared = atomicAdd(state + 1, 1ull) == gridDim.x - 1;
    __syncthreads();
    if (last_shared) {
        for (long long i = threadIdx.x; i < tiles; i += blockDim.x) status[i] = 0ull;
        if (threadIdx.x == 0) { state[0] = 0ull; state[1] = 0ull; }
    }
}

extern "C" {
__global__ void __launch_bounds__(SCAN_THREADS) scan_i32_i32(const int* x, long long n, const long long* nd, int* out,
                                                             unsigned long long* state) {
    scan_single_pass<int, int, SCAN_ITEMS>(x, n, nd, out, state);
}
__global__ void __launch_bounds__(SCAN_WIDE_THREADS) scan_i32_i32_wide(const int* x, long long n, const long long* nd,
                                                                       int* out, unsigned long long* state) {
    scan_single_pass<int, int, SCAN_WIDE_ITEMS>(x, n, nd, out, state);
}
__global__ void __launch_bounds__(SCAN_THREADS) scan_i32_i64(const int* x, long long n, const long long* nd,
                                                             long long* out, unsigned long long* state) {
    scan_single_pass<int, long long, SCAN_ITEMS>(x, n, nd, out, state);
}
__global__ void __launch_bounds__(SCAN_THREADS) scan_i64_i64(const long long* x, long long n, const long long* nd,
                                                             long long* out, unsigned long long* state) {
    scan_single_pass<long long, long long, SCAN_ITEMS>(x, n, nd, out, state);
}
}
