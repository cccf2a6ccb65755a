/* The streaming gather's software prefetch, swept (issue #27, tenth session); not shipped
 * code. Replays one whole per-layer hicache load of the MLA shape (61 layers x 1152-byte
 * rows, 4096 tokens a call, device 2N tokens and host 2N, random pages, huge pages asked
 * for) as the shipped kernels do it: per (dst, src, len) triple, a prefetch of the first
 * 2 KiB of the source of the triple DIST ahead, then 32-byte loads and non-temporal
 * stores. Each variant HINT:DIST (hint 0 = prefetcht0, 1 = prefetcht1, 2 = prefetcht2,
 * 3 = prefetchnta) runs once per round, rounds interleaved, the variants' order reversed
 * every other round; one contiguous memcpy of the same bytes opens each round. Prints
 * best-of and median GB/s over 15 rounds.
 *
 *   cc -O2 -mavx2 -pthread scripts/prefetch_probe.c -o prefetch_probe
 *   ./prefetch_probe <page> <page_first|layer_first> <threads 1|2> 0:4 1:8 2:8 ...
 *
 * Two threads split each layer's table in halves; the second thread spins between
 * layers (the shipped team's helper spins too). */
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define LAYERS 61
#define ROW 1152
#define TOKENS 4096
#define ROUNDS 15
#define MAX_VARIANTS 16

typedef struct { uint64_t dst, src, len; } op_t;

static int hint, dist;
static op_t *tables[LAYERS];
static long entries;
static volatile int generation, helper_done, layer;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void *big(size_t n) {
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) { perror("mmap"); exit(1); }
    madvise(p, n, MADV_HUGEPAGE);
    memset(p, 1, n);
    return p;
}

static void gather(const op_t *ops, long n) {
    for (long i = 0; i < n; i++) {
        if (i + dist < n) {
            const char *p = (const char *)ops[i + dist].src;
            long m = ops[i + dist].len < 2048 ? (long)ops[i + dist].len : 2048;
            for (long k = 0; k < m; k += 64) {
                /* _mm_prefetch's hint must be a constant: one branch per hint */
                if (hint == 0) _mm_prefetch(p + k, _MM_HINT_T0);
                else if (hint == 1) _mm_prefetch(p + k, _MM_HINT_T1);
                else if (hint == 2) _mm_prefetch(p + k, _MM_HINT_T2);
                else _mm_prefetch(p + k, _MM_HINT_NTA);
            }
        }
        char *d = (char *)ops[i].dst;
        const char *s = (const char *)ops[i].src;
        long k = 0;
        for (; k + 64 <= (long)ops[i].len; k += 64) {
            __m256i a = _mm256_loadu_si256((const __m256i *)(s + k));
            __m256i b = _mm256_loadu_si256((const __m256i *)(s + k + 32));
            _mm256_stream_si256((__m256i *)(d + k), a);
            _mm256_stream_si256((__m256i *)(d + k + 32), b);
        }
        memcpy(d + k, s + k, ops[i].len - k);
    }
    _mm_sfence();
}

static void *helper(void *unused) {
    (void)unused;
    for (int seen = 0;;) {
        while (generation == seen) _mm_pause();
        seen = generation;
        long half = entries / 2;
        gather(tables[layer] + half, entries - half);
        __sync_fetch_and_add(&helper_done, 1);
    }
    return NULL;
}

static void load(int threads) {
    for (int l = 0; l < LAYERS; l++) {
        if (threads == 1) { gather(tables[l], entries); continue; }
        layer = l;
        helper_done = 0;
        __sync_synchronize();
        generation++;
        gather(tables[l], entries / 2);
        while (!helper_done) _mm_pause();
    }
}

static void shuffle(int *a, long n) {
    for (long i = 0; i < n; i++) a[i] = (int)i;
    for (long i = n - 1; i > 0; i--) { long j = rand() % (i + 1); int t = a[i]; a[i] = a[j]; a[j] = t; }
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc < 5) { fprintf(stderr, "usage: %s page layout threads HINT:DIST...\n", argv[0]); return 2; }
    int page = atoi(argv[1]), page_first = strcmp(argv[2], "page_first") == 0, threads = atoi(argv[3]);
    int variants = argc - 4;
    if (page < 1 || TOKENS % page || threads < 1 || threads > 2 || variants > MAX_VARIANTS) return 2;
    size_t bytes = (size_t)TOKENS * LAYERS * ROW;
    char *host = big(2 * bytes), *dev = big(2 * bytes), *ref_src = big(bytes), *ref_dst = big(bytes);
    long pages = TOKENS / page;
    int *host_pages = malloc(2 * pages * sizeof(int)), *dev_pages = malloc(2 * pages * sizeof(int));
    srand(1);
    shuffle(host_pages, 2 * pages);
    shuffle(dev_pages, 2 * pages);
    entries = page_first ? TOKENS : pages; /* page_first: a row per token; else a block per page */
    for (int l = 0; l < LAYERS; l++) {
        op_t *t = tables[l] = malloc(sizeof(op_t) * TOKENS);
        long k = 0;
        for (long p = 0; p < pages; p++) {
            char *d = dev + ((size_t)l * 2 * TOKENS + (size_t)dev_pages[p] * page) * ROW;
            if (page_first) { /* host [token][layer][row] */
                for (int i = 0; i < page; i++, k++)
                    t[k] = (op_t){(uint64_t)(d + (size_t)i * ROW),
                                  (uint64_t)(host + (((size_t)host_pages[p] * page + i) * LAYERS + l) * ROW), ROW};
            } else { /* host [layer][token][row] */
                t[k++] = (op_t){(uint64_t)d,
                                (uint64_t)(host + ((size_t)l * 2 * TOKENS + (size_t)host_pages[p] * page) * ROW),
                                (uint64_t)page * ROW};
            }
        }
    }
    pthread_t th;
    if (threads == 2) pthread_create(&th, NULL, helper, NULL);
    double times[MAX_VARIANTS][ROUNDS], ref[ROUNDS];
    for (int r = 0; r < ROUNDS; r++) {
        double t0 = now();
        memcpy(ref_dst, ref_src, bytes);
        ref[r] = now() - t0;
        for (int i = 0; i < variants; i++) {
            int v = r % 2 ? variants - 1 - i : i;
            if (sscanf(argv[4 + v], "%d:%d", &hint, &dist) != 2 || dist < 1) return 2;
            t0 = now();
            load(threads);
            times[v][r] = now() - t0;
        }
    }
    qsort(ref, ROUNDS, sizeof(double), by_value);
    printf("memcpy: best %.1f median %.1f GB/s\n", bytes / ref[0] / 1e9, bytes / ref[ROUNDS / 2] / 1e9);
    for (int v = 0; v < variants; v++) {
        qsort(times[v], ROUNDS, sizeof(double), by_value);
        printf("%s: best %.1f median %.1f GB/s\n", argv[4 + v], bytes / times[v][0] / 1e9,
               bytes / times[v][ROUNDS / 2] / 1e9);
    }
    return 0;
}
