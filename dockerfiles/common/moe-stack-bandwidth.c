/* moe-stack-bandwidth [MiB]: STREAM-like memory bandwidth of this host, for the hybrid-decode bound
 * (`moe-stack tune`): a read-only sum (what decode does to the expert weights) and a triad
 * (a = b + s*c), over arrays far larger than the caches (default 2048 MiB each), all threads (the
 * container's cpuset and OMP_NUM_THREADS decide), best of 5. Prints "read GB/s" and "triad GB/s"
 * (the triad counts 2 reads + 1 write). */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#define ROUNDS 5

int main(int argc, char **argv)
{
    long mib = argc > 1 ? atol(argv[1]) : 2048;
    if (mib < 64 || mib > (1L << 20)) {
        fprintf(stderr, "moe-stack-bandwidth: the array size is 64 to 1048576 MiB, not %s\n", argv[1]);
        return 64;
    }
    long n = mib * (1L << 20) / (long)sizeof(double);
    double *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b), *c = malloc(n * sizeof *c);
    if (!a || !b || !c) {
        fprintf(stderr, "moe-stack-bandwidth: can't allocate 3 x %ld MiB\n", mib);
        return 71;
    }
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) {
        a[i] = 0.0;
        b[i] = 1.0;
        c[i] = 2.0;
    }
    double best_read = 0, best_triad = 0, sink = 0;
    for (int round = 0; round < ROUNDS; round++) {
        double start = omp_get_wtime(), sum = 0;
#pragma omp parallel for schedule(static) reduction(+ : sum)
        for (long i = 0; i < n; i++)
            sum += b[i];
        double read = n * sizeof(double) / (omp_get_wtime() - start) / 1e9;
        sink += sum;
        start = omp_get_wtime();
#pragma omp parallel for schedule(static)
        for (long i = 0; i < n; i++)
            a[i] = b[i] + 3.0 * c[i];
        double triad = 3.0 * n * sizeof(double) / (omp_get_wtime() - start) / 1e9;
        best_read = read > best_read ? read : best_read;
        best_triad = triad > best_triad ? triad : best_triad;
    }
    printf("threads %d\nread GB/s %.1f\ntriad GB/s %.1f\n(check %g)\n", omp_get_max_threads(), best_read, best_triad,
           sink + a[n / 2]);
    free(a);
    free(b);
    free(c);
    return 0;
}
