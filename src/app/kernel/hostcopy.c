/* The host's half of pinned staging, in C: copy the caller's (pageable) arrays into pinned buffers on a
 * few threads with streaming stores, and queue each DMA the moment its bytes are in.
 *
 * Why C: on the lent H200 hosts the Python version (numpy copies on a thread pool, the main thread woken
 * as each chunk lands) staged 50 MB in 2.24 ms where this one takes 1.65 ms (one node, interleaved), for
 * two reasons measured there. The Python threads start one after another as each takes the
 * interpreter's lock (30-300 us apart), so the first DMA waits for the first 4 MiB; and glibc's memcpy
 * reads every line of the pinned buffer before writing it (it streams only past ~158 MB), which adds to
 * the memory traffic the DMA competes with. Here the workers wait on one condition variable, take slices
 * (128 KiB from staging.py) in order off an atomic counter and write with non-temporal stores; the calling
 * thread spins on the runs' counts of slices still to write and queues each run's DMA through the driver
 * as its last slice lands.
 *
 * Slices and runs are two sizes on purpose. The link waits for the first DMA's bytes, and a thread copies
 * ~9 GB/s, so with a DMA a work unit of 1 MiB (as before) the first byte crossed ~115 us into the copy; the
 * first run is one slice now, and each next run twice the last, up to a few MiB, because every DMA costs
 * ~2.5 us of the copy engine's time beyond its bytes'. Interleaved on H200 nodes, 1 MiB units against
 * 128 KiB slices in runs up to 4 MiB: join v4's build at 1M x 100k 1.32 against 1.19 ms, overlay v3's at
 * 100k x 100k 1.76 against 1.60 ms.
 *
 * Built on first use by app.kernel.hostcopy with the system's C compiler; without one, staging stays
 * in Python. One staging at a time per process (a lock); the worker threads are started once per
 * process and sleep between calls.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* cuMemcpyHtoDAsync_v2 (CUresult (*)(CUdeviceptr, const void *, size_t, CUstream)): passed in as a
 * pointer, so this library needs no CUDA headers or link. */
typedef int (*htod_fn)(uint64_t dst, const void *src, size_t n, void *stream);

#define MAX_WORKERS 64
#define HOSTCOPY_BYTES 0        /* an array's kinds: copy its bytes */
#define HOSTCOPY_NARROW_I64 1   /* or int64 values to int32 */

static pthread_mutex_t call_lock = PTHREAD_MUTEX_INITIALIZER;  /* one staging at a time */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t go = PTHREAD_COND_INITIALIZER, idle = PTHREAD_COND_INITIALIZER;
static int workers;          /* started in this process */
static uint64_t generation;  /* bumped per call: a worker runs each generation once */
static int busy;             /* workers still in the current call */
static int active;           /* workers that copy in the current call (the others go back to sleep) */

/* An array to stage, and each run and slice cut from it, is a row of five words: where it is read, where it
 * is written (pinned), where its DMA sends it (device), the bytes written, and how (HOSTCOPY_BYTES or
 * HOSTCOPY_NARROW_I64). The caller hands over one row an array and the pieces are cut here: in Python each
 * piece's addresses cost microseconds, which on the lent hosts came to 0.07-0.18 ms of a build's time
 * before the first byte was copied. */
enum { ROW_SRC, ROW_PIN, ROW_DEV, ROW_LEN, ROW_KIND, ROW_WORDS };
static const uint64_t *j_slices;  /* the work: slices, taken in order off j_next */
static const int *j_run_of;       /* each slice's run (DMA) */
static int j_n;
static atomic_int j_next;
static atomic_int *j_left;        /* per run: slices not yet written */

static int use_avx2;         /* set before the workers start a call */

#if defined(__x86_64__)
/* 32-byte streaming stores where the CPU has AVX2 (6% faster than 16-byte ones on the lent H200 hosts),
 * chosen at run time so that the library loads on any x86-64. n is a multiple of 128, d 32-byte aligned. */
__attribute__((target("avx2"))) static void stream_avx2(char *d, const char *s, size_t n) {
    for (size_t i = 0; i < n; i += 128) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(s + i)), b = _mm256_loadu_si256((const __m256i *)(s + i + 32));
        __m256i c = _mm256_loadu_si256((const __m256i *)(s + i + 64)), e = _mm256_loadu_si256((const __m256i *)(s + i + 96));
        _mm256_stream_si256((__m256i *)(d + i), a);
        _mm256_stream_si256((__m256i *)(d + i + 32), b);
        _mm256_stream_si256((__m256i *)(d + i + 64), c);
        _mm256_stream_si256((__m256i *)(d + i + 96), e);
    }
}

/* n a multiple of 64, d 16-byte aligned. */
static void stream_sse2(char *d, const char *s, size_t n) {
    for (size_t i = 0; i < n; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(s + i)), b = _mm_loadu_si128((const __m128i *)(s + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32)), e = _mm_loadu_si128((const __m128i *)(s + i + 48));
        _mm_stream_si128((__m128i *)(d + i), a);
        _mm_stream_si128((__m128i *)(d + i + 16), b);
        _mm_stream_si128((__m128i *)(d + i + 32), c);
        _mm_stream_si128((__m128i *)(d + i + 48), e);
    }
}
#endif

static void copy_streaming(char *d, const char *s, size_t n) {
#if defined(__x86_64__)
    const int avx2 = use_avx2;
    size_t align = avx2 ? 32 : 16;
    size_t head = (align - ((uintptr_t)d & (align - 1))) & (align - 1);   /* streaming stores want an aligned target */
    if (head > n) head = n;
    memcpy(d, s, head);
    d += head, s += head, n -= head;
    size_t body = n & ~(size_t)(avx2 ? 127 : 63);
    if (avx2) stream_avx2(d, s, body); else stream_sse2(d, s, body);
    memcpy(d + body, s + body, n - body);
    _mm_sfence();   /* the streamed bytes are visible before the run's count says so */
#else
    memcpy(d, s, n);
#endif
}

/* int64 to int32 (the kernels' offsets), len bytes of int32 out: the values were checked to fit. Streamed
 * like the copies: the low halves of four values picked into one 16-byte store. */
static void narrow_i64(int32_t *d, const int64_t *s, size_t len) {
    size_t n = len / 4, i = 0;
#if defined(__x86_64__)
    for (; i < n && ((uintptr_t)(d + i) & 15); i++) d[i] = (int32_t)s[i];
    for (; i + 4 <= n; i += 4) {
        __m128 a = _mm_castsi128_ps(_mm_loadu_si128((const __m128i *)(s + i)));
        __m128 b = _mm_castsi128_ps(_mm_loadu_si128((const __m128i *)(s + i + 2)));
        _mm_stream_si128((__m128i *)(d + i), _mm_castps_si128(_mm_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0))));
    }
    _mm_sfence();
#endif
    for (; i < n; i++) d[i] = (int32_t)s[i];
}

static void run_slices(void) {
    for (;;) {
        int c = atomic_fetch_add(&j_next, 1);
        if (c >= j_n) return;
        const uint64_t *k = j_slices + (size_t)c * ROW_WORDS;
        if (k[ROW_KIND] == HOSTCOPY_NARROW_I64)
            narrow_i64((int32_t *)(uintptr_t)k[ROW_PIN], (const int64_t *)(uintptr_t)k[ROW_SRC], (size_t)k[ROW_LEN]);
        else
            copy_streaming((char *)(uintptr_t)k[ROW_PIN], (const char *)(uintptr_t)k[ROW_SRC], (size_t)k[ROW_LEN]);
        atomic_fetch_sub_explicit(&j_left[j_run_of[c]], 1, memory_order_release);
    }
}

static void *worker(void *arg) {
    const int index = (int)(intptr_t)arg;
    uint64_t seen = 0;
    pthread_mutex_lock(&mu);
    for (;;) {
        while (generation == seen) pthread_cond_wait(&go, &mu);
        seen = generation;
        const int mine = index < active;
        pthread_mutex_unlock(&mu);
        if (mine) run_slices();
        pthread_mutex_lock(&mu);
        if (--busy == 0) pthread_cond_signal(&idle);
    }
    return NULL;
}

/* A fork while another thread is inside hostcopy_stage would hand the child the locks held by a thread it
 * does not have, and its first staging would wait on them for ever. So a fork waits for a staging call in
 * progress to end (the forking thread takes both locks first), and the child, whose one thread is the one
 * that took them, releases them with fresh condition variables and no workers: it starts its own. */
static void before_fork(void) {
    pthread_mutex_lock(&call_lock);
    pthread_mutex_lock(&mu);
}

static void after_fork_in_parent(void) {
    pthread_mutex_unlock(&mu);
    pthread_mutex_unlock(&call_lock);
}

static void after_fork_in_child(void) {
    pthread_cond_init(&go, NULL);      /* the parent's waiters are not in the child */
    pthread_cond_init(&idle, NULL);
    workers = 0, busy = 0;
    pthread_mutex_unlock(&mu);
    pthread_mutex_unlock(&call_lock);
}

/* Added on the first call, before any worker starts: every fork after that runs them. */
static pthread_once_t fork_handlers = PTHREAD_ONCE_INIT;

static void add_fork_handlers(void) {
    pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child);
}

static int ensure_workers(int want) {
    if (want > MAX_WORKERS) want = MAX_WORKERS;
    while (workers < want) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&t, &attr, worker, (void *)(intptr_t)workers);
        pthread_attr_destroy(&attr);
        if (rc) return workers;
        workers++;
    }
    return workers;
}

/* A size in bytes of output rounded down to a multiple of 8 (at least 8), so that a narrowed piece's source stays
 * as aligned as its target. */
static uint64_t step_of(uint64_t bytes) {
    return bytes < 16 ? 8 : bytes - bytes % 8;
}

/* The DMAs (runs): each array cut in order, the k-th run of the call min(dma_bytes, slice_bytes << k) bytes long
 * (an array's last run shorter). The first runs are small so that the link starts after one slice, not after a
 * full DMA's worth; the later ones are large because each DMA costs ~2.5 us of the copy engine's time over its
 * bytes' (measured on the lent H200 hosts). Calls each run to fn (NULL: count only); returns how many. */
typedef void (*run_fn)(void *ctx, int a, uint64_t lo, uint64_t len);
static int cut_runs(int n_arrays, const uint64_t *arrays, uint64_t slice_bytes, uint64_t dma_bytes, run_fn fn,
                    void *ctx) {
    const uint64_t slice = step_of(slice_bytes), most = step_of(dma_bytes > slice_bytes ? dma_bytes : slice_bytes);
    uint64_t size = slice;
    int runs = 0;
    for (int a = 0; a < n_arrays; a++) {
        const uint64_t len = arrays[a * ROW_WORDS + ROW_LEN];
        for (uint64_t lo = 0; lo < len; runs++) {
            const uint64_t n = len - lo < size ? len - lo : size;
            if (fn) fn(ctx, a, lo, n);
            lo += n;
            size = size * 2 > most ? most : size * 2;
        }
    }
    return runs;
}

/* How many DMAs the arrays' rows are sent in. */
int hostcopy_dmas(int n_arrays, const uint64_t *arrays, uint64_t slice_bytes, uint64_t dma_bytes) {
    return cut_runs(n_arrays, arrays, slice_bytes, dma_bytes, NULL, NULL);
}

/* A call's pieces: its runs (ROW_WORDS a run), its slices (ROW_WORDS a slice), each slice's run and each
 * run's count of slices still to write (set as the runs are cut; the workers count it down). */
struct pieces {
    const uint64_t *arrays;
    uint64_t slice;
    uint64_t *runs, *slices;
    int *run_of;
    atomic_int *left;
    int n_runs, n_slices;
};

static void row_piece(uint64_t *k, const uint64_t *row, uint64_t lo, uint64_t len) {
    const uint64_t ratio = row[ROW_KIND] == HOSTCOPY_NARROW_I64 ? 2 : 1;   /* source bytes per byte written */
    k[ROW_SRC] = row[ROW_SRC] + lo * ratio;
    k[ROW_PIN] = row[ROW_PIN] + lo;
    k[ROW_DEV] = row[ROW_DEV] + lo;
    k[ROW_LEN] = len;
    k[ROW_KIND] = row[ROW_KIND];
}

static void add_run(void *ctx, int a, uint64_t lo, uint64_t len) {
    struct pieces *p = ctx;
    const uint64_t *row = p->arrays + a * ROW_WORDS;
    row_piece(p->runs + (size_t)p->n_runs * ROW_WORDS, row, lo, len);
    int count = 0;
    for (uint64_t at = 0; at < len; at += p->slice, count++) {
        row_piece(p->slices + (size_t)p->n_slices * ROW_WORDS, row, lo + at, len - at < p->slice ? len - at : p->slice);
        p->run_of[p->n_slices++] = p->n_runs;
    }
    atomic_init(&p->left[p->n_runs++], count);
}

static void release_pieces(struct pieces *p) {
    free(p->runs), free(p->slices), free(p->run_of), free(p->left);
}

/* Cut the rows into runs and slices: 0, or -1 when there is no memory (all freed). */
static int cut_pieces(struct pieces *p, int n_arrays, const uint64_t *arrays, uint64_t slice_bytes,
                      uint64_t dma_bytes) {
    memset(p, 0, sizeof *p);
    p->arrays = arrays, p->slice = step_of(slice_bytes);
    const int runs = hostcopy_dmas(n_arrays, arrays, slice_bytes, dma_bytes);
    uint64_t slices = 0;
    for (int a = 0; a < n_arrays; a++) slices += (arrays[a * ROW_WORDS + ROW_LEN] + p->slice - 1) / p->slice;
    slices += (uint64_t)runs;      /* a run's last slice may be short: at most one more slice a run */
    p->runs = malloc(((size_t)runs + 1) * ROW_WORDS * sizeof(uint64_t));
    p->slices = malloc(((size_t)slices + 1) * ROW_WORDS * sizeof(uint64_t));
    p->run_of = malloc(((size_t)slices + 1) * sizeof(int));
    p->left = malloc(((size_t)runs + 1) * sizeof(atomic_int));
    if (!p->runs || !p->slices || !p->run_of || !p->left) {
        release_pieces(p);
        return -1;
    }
    cut_runs(n_arrays, arrays, slice_bytes, dma_bytes, add_run, p);
    return 0;
}

/* Stage n_arrays arrays (rows of ROW_WORDS words): each is written to pinned host memory, copied or narrowed as its
 * kind says, by the worker threads in slices of slice_bytes taken in order, and sent to the device by htod on stream
 * in runs of whole slices (cut_runs: from one slice up to dma_bytes), each run's DMA queued by the calling thread as
 * soon as its last slice is in. threads: the workers that copy. *dmas (unless NULL) is set to the number of DMAs.
 * Returns 0; -1 when no worker thread could start or there was no memory (nothing was copied); or the driver's
 * error code from the first DMA that failed (the copies still finish before the return, so the pinned buffers are
 * free). */
int hostcopy_stage(int n_arrays, const uint64_t *arrays, uint64_t slice_bytes, uint64_t dma_bytes, int threads,
                   htod_fn htod, void *stream, int *dmas) {
    pthread_once(&fork_handlers, add_fork_handlers);
    if (dmas) *dmas = 0;
    struct pieces p;
    if (cut_pieces(&p, n_arrays, arrays, slice_bytes, dma_bytes)) return -1;
    if (p.n_slices == 0) {
        release_pieces(&p);
        return 0;
    }
    char *queued = calloc((size_t)p.n_runs, 1);
    if (!queued) {
        release_pieces(&p);
        return -1;
    }
    pthread_mutex_lock(&call_lock);
    pthread_mutex_lock(&mu);
    int have = ensure_workers(threads < 1 ? 1 : threads);
    if (have == 0) {
        pthread_mutex_unlock(&mu);
        pthread_mutex_unlock(&call_lock);
        free(queued), release_pieces(&p);
        return -1;
    }
#if defined(__x86_64__)
    use_avx2 = __builtin_cpu_supports("avx2");
#endif
    j_slices = p.slices, j_run_of = p.run_of, j_n = p.n_slices, j_left = p.left;
    atomic_store(&j_next, 0);
    busy = have;
    active = threads < have ? (threads < 1 ? 1 : threads) : have;
    generation++;
    pthread_cond_broadcast(&go);
    pthread_mutex_unlock(&mu);
    /* Each run's DMA is queued as soon as its slices are in, in whatever order runs complete: a slow slice holds up
     * only its own run. The order of DMAs on the stream does not matter: the plan's kernels come after all. */
    int err = 0, first = 0;
    for (int todo = p.n_runs; todo > 0;) {
        int found = 0;
        for (int r = first; r < p.n_runs; r++) {
            if (queued[r] || atomic_load_explicit(&p.left[r], memory_order_acquire) != 0) continue;
            queued[r] = 1;
            const uint64_t *k = p.runs + (size_t)r * ROW_WORDS;
            if (!err) err = htod(k[ROW_DEV], (const void *)(uintptr_t)k[ROW_PIN], (size_t)k[ROW_LEN], stream);
            todo--, found = 1;
        }
        while (first < p.n_runs && queued[first]) first++;
#if defined(__x86_64__)
        if (!found) _mm_pause();
#endif
    }
    pthread_mutex_lock(&mu);
    while (busy) pthread_cond_wait(&idle, &mu);
    pthread_mutex_unlock(&mu);
    pthread_mutex_unlock(&call_lock);
    if (dmas) *dmas = p.n_runs;
    free(queued), release_pieces(&p);
    return err;
}
/* For the tests, with no GPU: the same sliced copy, no DMA. */
static int no_dma(uint64_t dst, const void *src, size_t n, void *stream) {
    (void)dst, (void)src, (void)n, (void)stream;
    return 0;
}

int hostcopy_copy(int n_arrays, const uint64_t *arrays, uint64_t slice_bytes, uint64_t dma_bytes, int threads) {
    return hostcopy_stage(n_arrays, arrays, slice_bytes, dma_bytes, threads, no_dma, NULL, NULL);
}
