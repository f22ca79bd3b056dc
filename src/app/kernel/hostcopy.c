/* The host's half of pinned staging, in C: copy chunks of the caller's (pageable) arrays into pinned
 * buffers on a few threads with streaming stores, and queue each chunk's DMA the moment its bytes are in.
 *
 * Why C: on the lent H200 hosts the Python version (numpy copies on a thread pool, the main thread woken
 * as each chunk lands) staged 50 MB in 2.24 ms where this one takes 1.65 ms (one node, interleaved), for
 * two reasons measured there. The Python threads start one after another as each takes the
 * interpreter's lock (30-300 us apart), so the first DMA waits for the first 4 MiB; and glibc's memcpy
 * reads every line of the pinned buffer before writing it (it streams only past ~158 MB), which adds to
 * the memory traffic the DMA competes with. Here the workers wait on one condition variable, take 1 MiB
 * chunks off an atomic counter and write with non-temporal stores; the calling thread spins on the
 * chunks' flags and queues each one's DMA through the driver as it lands.
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
#define HOSTCOPY_BYTES 0        /* a chunk's kinds: copy its bytes */
#define HOSTCOPY_NARROW_I64 1   /* or int64 values to int32 */

static pthread_mutex_t call_lock = PTHREAD_MUTEX_INITIALIZER;  /* one staging at a time */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t go = PTHREAD_COND_INITIALIZER, idle = PTHREAD_COND_INITIALIZER;
static int workers;          /* started in this process */
static uint64_t generation;  /* bumped per call: a worker runs each generation once */
static int busy;             /* workers still in the current call */
static int active;           /* workers that copy in the current call (the others go back to sleep) */

/* An array to stage, and each chunk cut from it, is a row of five words: where it is read, where it is
 * written (pinned), where its DMA sends it (device), the bytes written, and how (HOSTCOPY_BYTES or
 * HOSTCOPY_NARROW_I64). The caller hands over one row an array and the chunks are cut here: in Python each
 * chunk's addresses cost microseconds, which on the lent hosts came to 0.07-0.18 ms of a build's time
 * before the first byte was copied. */
enum { ROW_SRC, ROW_PIN, ROW_DEV, ROW_LEN, ROW_KIND, ROW_WORDS };
static const uint64_t *j_chunks;
static int j_n;
static atomic_int j_next;
static atomic_int *j_ready;

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
    _mm_sfence();   /* the streamed bytes are visible before the chunk's flag says so */
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

static void run_chunks(void) {
    for (;;) {
        int c = atomic_fetch_add(&j_next, 1);
        if (c >= j_n) return;
        const uint64_t *k = j_chunks + (size_t)c * ROW_WORDS;
        if (k[ROW_KIND] == HOSTCOPY_NARROW_I64)
            narrow_i64((int32_t *)(uintptr_t)k[ROW_PIN], (const int64_t *)(uintptr_t)k[ROW_SRC], (size_t)k[ROW_LEN]);
        else
            copy_streaming((char *)(uintptr_t)k[ROW_PIN], (const char *)(uintptr_t)k[ROW_SRC], (size_t)k[ROW_LEN]);
        atomic_store_explicit(&j_ready[c], 1, memory_order_release);
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
        if (mine) run_chunks();
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

/* A chunk's bytes of output: chunk_bytes rounded down to a multiple of 8 (at least 8), so that a narrowed
 * chunk's source stays as aligned as its target. */
static uint64_t chunk_step(uint64_t chunk_bytes) {
    return chunk_bytes < 16 ? 8 : chunk_bytes - chunk_bytes % 8;
}

/* How many chunks (so DMAs) the arrays' rows are cut into. */
int hostcopy_chunks(int n_arrays, const uint64_t *arrays, uint64_t chunk_bytes) {
    uint64_t step = chunk_step(chunk_bytes), count = 0;
    for (int a = 0; a < n_arrays; a++) count += (arrays[a * ROW_WORDS + ROW_LEN] + step - 1) / step;
    return (int)count;
}

/* The chunks of the arrays' rows: a table of *n rows, malloc'd; NULL with *n 0 when there is nothing to
 * copy, NULL with *n -1 when there is no memory. */
static uint64_t *cut_chunks(int n_arrays, const uint64_t *arrays, uint64_t chunk_bytes, int *n) {
    uint64_t step = chunk_step(chunk_bytes), count = (uint64_t)hostcopy_chunks(n_arrays, arrays, chunk_bytes);
    *n = (int)count;
    if (count == 0) return NULL;
    uint64_t *table = malloc(count * ROW_WORDS * sizeof(uint64_t)), *k = table;
    if (!table) {
        *n = -1;
        return NULL;
    }
    for (int a = 0; a < n_arrays; a++) {
        const uint64_t *row = arrays + a * ROW_WORDS;
        const uint64_t ratio = row[ROW_KIND] == HOSTCOPY_NARROW_I64 ? 2 : 1;   /* source bytes per byte written */
        for (uint64_t lo = 0; lo < row[ROW_LEN]; lo += step, k += ROW_WORDS) {
            k[ROW_SRC] = row[ROW_SRC] + lo * ratio;
            k[ROW_PIN] = row[ROW_PIN] + lo;
            k[ROW_DEV] = row[ROW_DEV] + lo;
            k[ROW_LEN] = row[ROW_LEN] - lo < step ? row[ROW_LEN] - lo : step;
            k[ROW_KIND] = row[ROW_KIND];
        }
    }
    return table;
}

/* Stage n_arrays arrays (rows of ROW_WORDS words) in chunks of chunk_bytes: each chunk is written to pinned
 * host memory, copied or narrowed as its array's kind says, then sent to the device by htod on stream.
 * threads: the workers that copy (the calling thread queues the DMAs). Returns 0; -1 when no worker thread
 * could start or there was no memory (nothing was copied); or the driver's error code from the first DMA
 * that failed (the copies still finish before the return, so the pinned buffers are free). */
int hostcopy_stage(int n_arrays, const uint64_t *arrays, uint64_t chunk_bytes, int threads, htod_fn htod,
                   void *stream) {
    pthread_once(&fork_handlers, add_fork_handlers);
    int n;
    uint64_t *chunks = cut_chunks(n_arrays, arrays, chunk_bytes, &n);
    if (n <= 0) return n;
    atomic_int *ready = calloc((size_t)n, sizeof(atomic_int));
    if (!ready) {
        free(chunks);
        return -1;
    }
    pthread_mutex_lock(&call_lock);
    pthread_mutex_lock(&mu);
    int have = ensure_workers(threads < 1 ? 1 : threads);
    if (have == 0) {
        pthread_mutex_unlock(&mu);
        pthread_mutex_unlock(&call_lock);
        free(ready);
        free(chunks);
        return -1;
    }
#if defined(__x86_64__)
    use_avx2 = __builtin_cpu_supports("avx2");
#endif
    j_chunks = chunks, j_n = n, j_ready = ready;
    atomic_store(&j_next, 0);
    busy = have;
    active = threads < have ? (threads < 1 ? 1 : threads) : have;
    generation++;
    pthread_cond_broadcast(&go);
    pthread_mutex_unlock(&mu);

    /* Each chunk's DMA is queued as soon as it lands, in whatever order they land: a slow chunk holds up
     * only its own DMA. The order of DMAs on the stream does not matter: the plan's kernels come after all. */
    int err = 0, first = 0;
    for (int left = n; left > 0;) {
        int found = 0;
        for (int c = first; c < n; c++) {
            if (atomic_load_explicit(&ready[c], memory_order_acquire) != 1) continue;
            atomic_store_explicit(&ready[c], 2, memory_order_relaxed);   /* queued */
            const uint64_t *k = chunks + (size_t)c * ROW_WORDS;
            if (!err) err = htod(k[ROW_DEV], (const void *)(uintptr_t)k[ROW_PIN], (size_t)k[ROW_LEN], stream);
            left--, found = 1;
        }
        while (first < n && atomic_load_explicit(&ready[first], memory_order_relaxed) == 2) first++;
#if defined(__x86_64__)
        if (!found) _mm_pause();
#endif
    }
    pthread_mutex_lock(&mu);
    while (busy) pthread_cond_wait(&idle, &mu);
    pthread_mutex_unlock(&mu);
    pthread_mutex_unlock(&call_lock);
    free(ready);
    free(chunks);
    return err;
}

/* For the tests, with no GPU: the same chunked copy, no DMA. */
static int no_dma(uint64_t dst, const void *src, size_t n, void *stream) {
    (void)dst, (void)src, (void)n, (void)stream;
    return 0;
}

int hostcopy_copy(int n_arrays, const uint64_t *arrays, uint64_t chunk_bytes, int threads) {
    return hostcopy_stage(n_arrays, arrays, chunk_bytes, threads, no_dma, NULL);
}
