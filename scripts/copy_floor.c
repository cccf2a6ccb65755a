/* Hardware ceiling of the hicache CPU load/backup patterns: the copies sgl-bench
 * times, written as plain C loops (no Python, no framework), against a contiguous
 * memcpy of the same bytes. Build: cc -O2 -mavx2 -pthread scripts/copy_floor.c -o floor */
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static size_t L = 61, ROW = 1152, N = 4096; /* layers, bytes per token-layer, tokens per call */

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

static void *big(size_t n) {
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) { perror("mmap"); exit(1); }
    if (!getenv("NOHUGE")) madvise(p, n, MADV_HUGEPAGE);
    memset(p, 1, n);
    return p;
}

/* non-temporal copy: 32-byte aligned destinations assumed (rows are 1152 = 36*32) */
static void nt_copy(char *d, const char *s, size_t n) {
    size_t i = 0;
    for (; i + 128 <= n; i += 128) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(s + i));
        __m256i b = _mm256_loadu_si256((const __m256i *)(s + i + 32));
        __m256i c = _mm256_loadu_si256((const __m256i *)(s + i + 64));
        __m256i e = _mm256_loadu_si256((const __m256i *)(s + i + 96));
        _mm256_stream_si256((__m256i *)(d + i), a);
        _mm256_stream_si256((__m256i *)(d + i + 32), b);
        _mm256_stream_si256((__m256i *)(d + i + 64), c);
        _mm256_stream_si256((__m256i *)(d + i + 96), e);
    }
    if (i < n) memcpy(d + i, s + i, n - i);
}

typedef struct { size_t nd; char **dst; const char **src; size_t piece; int nt; } Job;
typedef struct { Job *job; size_t lo, hi; } Part;

static void run_part(Job *j, size_t lo, size_t hi) {
    for (size_t i = lo; i < hi; i++) {
        if (j->nt) nt_copy(j->dst[i], j->src[i], j->piece); else memcpy(j->dst[i], j->src[i], j->piece);
    }
    if (j->nt) _mm_sfence();
}
static void *thr(void *a) { Part *p = a; run_part(p->job, p->lo, p->hi); return NULL; }

/* one call = the whole job list (all layers), split in `threads` contiguous parts per layer */
static double timed(Job *layers, size_t nl, int threads) {
    double t0 = now();
    for (size_t l = 0; l < nl; l++) {
        Job *j = &layers[l];
        if (threads == 1) { run_part(j, 0, j->nd); continue; }
        pthread_t t; Part p = {j, j->nd / 2, j->nd};
        pthread_create(&t, NULL, thr, &p);
        run_part(j, 0, j->nd / 2);
        pthread_join(t, NULL);
    }
    return now() - t0;
}

static char *scratch;
static void evict(void) { memset(scratch, 2, 64 << 20); }

static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }

static void shuffle(size_t *a, size_t n, unsigned *seed) {
    for (size_t i = n - 1; i > 0; i--) { size_t k = rand_r(seed) % (i + 1); size_t t = a[i]; a[i] = a[k]; a[k] = t; }
}

int main(int argc, char **argv) {
    size_t ps = argc > 1 ? strtoul(argv[1], 0, 10) : 64;
    const char *layout = argc > 2 ? argv[2] : "layer_first";
    int rounds = argc > 3 ? atoi(argv[3]) : 5;
    /* the timing table holds 64 rounds; a page must divide the 4096 tokens of a call */
    if (rounds < 1 || rounds > 64 || ps == 0 || N % ps) { fprintf(stderr, "rounds 1..64, page dividing %zu\n", N); return 2; }
    size_t dev_tok = 2 * N, host_tok = 4 * N, np = N / ps;
    size_t bytes = N * L * ROW;
    char *dev = big(dev_tok * L * ROW), *host = big(host_tok * L * ROW);
    char *ca = big(bytes), *cb = big(bytes);
    scratch = big(64 << 20);
    unsigned seed = 1234 + ps;
    size_t *dp = malloc(sizeof(size_t) * (dev_tok / ps)), *hp = malloc(sizeof(size_t) * (host_tok / ps));
    for (size_t i = 0; i < dev_tok / ps; i++) dp[i] = i;
    for (size_t i = 0; i < host_tok / ps; i++) hp[i] = i;
    shuffle(dp, dev_tok / ps, &seed); shuffle(hp, host_tok / ps, &seed);
    /* device layer_first: [layer][token][row]; host per layout */
    int pf = !strcmp(layout, "page_first"), pfd = !strcmp(layout, "page_first_direct");
    size_t piece = pf ? ROW : ps * ROW, per_page = pf ? ps : 1;
    Job load[61], backup[61], loadnt[61];
    for (size_t l = 0; l < L; l++) {
        size_t nd = np * per_page;
        char **ld = malloc(nd * sizeof(char *)); const char **ls = malloc(nd * sizeof(char *));
        char **bd = malloc(nd * sizeof(char *)); const char **bs = malloc(nd * sizeof(char *));
        size_t k = 0;
        for (size_t i = 0; i < np; i++) {
            size_t d = dp[i], h = hp[i];
            for (size_t t = 0; t < per_page; t++, k++) {
                char *dv = dev + l * dev_tok * ROW + (d * ps + t) * ROW;
                char *hv;
                if (pf) hv = host + ((h * ps + t) * L + l) * ROW;          /* [token][layer][row] */
                else if (pfd) hv = host + ((h * L + l) * ps) * ROW;        /* [page][layer][ps][row] */
                else hv = host + (l * host_tok + h * ps) * ROW;            /* [layer][token][row] */
                ld[k] = dv; ls[k] = hv; bd[k] = hv; bs[k] = dv;
            }
        }
        load[l] = (Job){nd, ld, ls, piece, 0};
        loadnt[l] = (Job){nd, ld, ls, piece, 1};
        backup[l] = (Job){nd, bd, (const char **)bs, piece, 0};
    }
    /* backup in host order: page-major, every layer of a page (token) before the next */
    size_t ntot = np * per_page * L, q = 0;
    char **sd = malloc(ntot * sizeof(char *)); const char **ss = malloc(ntot * sizeof(char *));
    for (size_t i = 0; i < np; i++)
        for (size_t t = 0; t < per_page; t++)
            for (size_t l = 0; l < L; l++, q++) {
                size_t k = i * per_page + t;
                sd[q] = backup[l].dst[k]; ss[q] = backup[l].src[k];
            }
    Job stacked = {ntot, sd, ss, piece, 0};
    Job stackednt = {ntot, sd, ss, piece, 1};
    char *cd[1] = {cb}; const char *cs[1] = {ca};
    Job c1 = {1, cd, cs, bytes, 0};
    /* 2-thread contiguous: two halves */
    char *cd2[2] = {cb, cb + bytes / 2}; const char *cs2[2] = {ca, ca + bytes / 2};
    Job c2 = {2, cd2, cs2, bytes / 2, 0};
    const char *names[] = {"copy1", "copy2", "load1", "load2", "loadnt1", "loadnt2", "backup1", "backup2", "hostord1", "hostord2", "hostnt1", "hostnt2"};
    double t[12][64];
    for (int r = 0; r < rounds + 1; r++) {
        double v[12];
        evict(); v[0] = timed(&c1, 1, 1);
        evict(); v[1] = timed(&c2, 1, 2);
        evict(); v[2] = timed(load, L, 1);
        evict(); v[3] = timed(load, L, 2);
        evict(); v[4] = timed(loadnt, L, 1);
        evict(); v[5] = timed(loadnt, L, 2);
        evict(); v[6] = timed(backup, L, 1);
        evict(); v[7] = timed(backup, L, 2);
        evict(); v[8] = timed(&stacked, 1, 1);
        evict(); v[9] = timed(&stacked, 1, 2);
        evict(); v[10] = timed(&stackednt, 1, 1);
        evict(); v[11] = timed(&stackednt, 1, 2);
        if (r) for (int i = 0; i < 12; i++) t[i][r - 1] = v[i];
    }
    printf("%s page %zu (%zu B pieces x %zu per layer, %zu MB per call)\n", layout, ps, piece, np * per_page, bytes >> 20);
    double best[12], med[12];
    for (int i = 0; i < 12; i++) {
        qsort(t[i], rounds, sizeof(double), cmp); best[i] = t[i][0]; med[i] = t[i][rounds / 2];
    }
    double ref = best[0] < best[1] ? best[0] : best[1], refm = med[0] < med[1] ? med[0] : med[1];
    for (int i = 0; i < 12; i++)
        printf("  %-8s best %7.2f ms (%5.1f GB/s, %.2fx ref)  median %7.2f ms (%.2fx)\n", names[i], best[i] * 1e3,
               bytes / best[i] / 1e9, ref / best[i], med[i] * 1e3, refm / med[i]);
    return 0;
}
