// Inclusive prefix sum in two launches (tiles, add) -- three past 4096 tiles --, replacing
// cupy.cumsum whose ~30 us of host overhead per call dominated small stages.
// Instantiated for the input/output integer types the kernels use. When n_dev is given the
// length is read from the device (a sync-free plan sizes the launch for the most it can be,
// and the blocks past the real length return at once).

#define SCAN_THREADS 1024
#define SCAN_ITEMS 2
#define SCAN_TILE (SCAN_THREADS * SCAN_ITEMS)

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
        T w = warp_totals[lane];
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

template <typename In, typename Out>
__device__ void scan_tiles(const In* x, long long n, const long long* n_dev, Out* out, Out* tile_sums) {
    __shared__ Out warp_totals[32];
    if (n_dev) n = *n_dev;
    if ((long long)blockIdx.x * SCAN_TILE >= n) return;     // block-uniform: no __syncthreads skipped
    long long base = (long long)blockIdx.x * SCAN_TILE + (long long)threadIdx.x * SCAN_ITEMS;
    Out items[SCAN_ITEMS];
    Out sum = 0;
    for (int k = 0; k < SCAN_ITEMS; ++k) {
        items[k] = base + k < n ? (Out)x[base + k] : Out(0);
        sum += items[k];
        items[k] = sum;
    }
    Out total;
    Out incl = block_inclusive_scan<Out>(sum, warp_totals, total);
    Out excl = incl - sum;
    for (int k = 0; k < SCAN_ITEMS; ++k)
        if (base + k < n) out[base + k] = items[k] + excl;
    if (threadIdx.x == 0) tile_sums[blockIdx.x] = total;
}

// One block walks the tile sums in chunks, carrying the running total.
template <typename Out>
__device__ void scan_sums(Out* sums, long long t) {
    __shared__ Out warp_totals[32];
    Out carry = 0;
    for (long long start = 0; start < t; start += SCAN_THREADS) {
        long long i = start + threadIdx.x;
        Out v = i < t ? sums[i] : Out(0);
        Out total;
        Out incl = block_inclusive_scan<Out>(v, warp_totals, total);
        if (i < t) sums[i] = incl + carry;
        carry += total;
    }
}

// sums_scanned: 1 when scan_sums already turned the tile sums into prefixes;
// 0 when each block adds up the sums of the tiles before it itself (cheap for a
// few thousand tiles, and it saves a launch).
template <typename Out>
__device__ void add_tile_offsets(Out* out, long long n, const long long* n_dev, const Out* sums, int sums_scanned) {
    if (n_dev) n = *n_dev;
    if (blockIdx.x == 0 || (long long)blockIdx.x * SCAN_TILE >= n) return;
    __shared__ Out warp_totals[32];
    __shared__ Out prefix;
    if (sums_scanned) {
        if (threadIdx.x == 0) prefix = sums[blockIdx.x - 1];
    } else {
        Out part = 0;
        for (int i = threadIdx.x; i < (int)blockIdx.x; i += SCAN_THREADS) part += sums[i];
        Out total;
        block_inclusive_scan<Out>(part, warp_totals, total);
        if (threadIdx.x == 0) prefix = total;
    }
    __syncthreads();
    Out add = prefix;
    long long base = (long long)blockIdx.x * SCAN_TILE;
    for (int k = threadIdx.x; k < SCAN_TILE; k += SCAN_THREADS)
        if (base + k < n) out[base + k] += add;
}

extern "C" {
__global__ void scan_tiles_i32_i32(const int* x, long long n, const long long* nd, int* out, int* s) {
    scan_tiles<int, int>(x, n, nd, out, s);
}
__global__ void scan_tiles_i32_i64(const int* x, long long n, const long long* nd, long long* out, long long* s) {
    scan_tiles<int, long long>(x, n, nd, out, s);
}
__global__ void scan_tiles_i64_i64(const long long* x, long long n, const long long* nd, long long* out,
                                   long long* s) {
    scan_tiles<long long, long long>(x, n, nd, out, s);
}
__global__ void scan_sums_i32(int* s, long long t) { scan_sums<int>(s, t); }
__global__ void scan_sums_i64(long long* s, long long t) { scan_sums<long long>(s, t); }
__global__ void add_offsets_i32(int* out, long long n, const long long* nd, const int* s, int scanned) {
    add_tile_offsets<int>(out, n, nd, s, scanned);
}
__global__ void add_offsets_i64(long long* out, long long n, const long long* nd, const long long* s, int scanned) {
    add_tile_offsets<long long>(out, n, nd, s, scanned);
}
}
