/* Counts OpenMP parallel regions (libgomp's GOMP_parallel, which ATen's CPU kernels call
 * for a team) in a global that scripts/omp_regions_probe.py reads through ctypes.
 *
 *   cc -O2 -shared -fPIC scripts/omp_regions.c -o /tmp/libompregions.so -ldl
 *   LD_PRELOAD=/tmp/libompregions.so python scripts/omp_regions_probe.py ...
 */
#define _GNU_SOURCE
#include <dlfcn.h>

unsigned long omp_regions = 0;

typedef void (*parallel_fn)(void (*)(void *), void *, unsigned, unsigned);

void GOMP_parallel(void (*fn)(void *), void *data, unsigned threads, unsigned flags) {
    static parallel_fn real = 0;
    if (!real) real = (parallel_fn)dlsym(RTLD_NEXT, "GOMP_parallel");
    __atomic_fetch_add(&omp_regions, 1, __ATOMIC_RELAXED);
    real(fn, data, threads, flags);
}
