/* STREAM-like memory bandwidth of this host, for the hybrid-decode bound: a read-only sum (what
 * decode does to expert weights) and a triad (a = b + s*c), over arrays far larger than the caches,
 * all threads, best of 5. Prints "read GB/s" and "triad GB/s" (triad counts 2 reads + 1 write). */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#define N (1L << 28) /* 2 GiB per array of doubles */
#define ROUNDS 5

int main(void)
{
    double *a = malloc(N * sizeof *a), *b = malloc(N * sizeof *b), *c = malloc(N * sizeof *c);
    if (!a || !b || !c)
        return 1;
#pragma omp parallel for schedule(static)
    for (long i = 0; i < N; i++) {
        a[i] = 0.0;
        b[i] = 1.0;
        c[i] = 2.0;
    }
    double best_read = 0, best_triad = 0, sink = 0;
    for (int round = 0; round < ROUNDS; round++) {
        double start = omp_get_wtime(), sum = 0;
#pragma omp parallel for schedule(static) reduction(+ : sum)
        for (long i = 0; i < N; i++)
            sum += b[i];
        double read = N * sizeof(double) / (omp_get_wtime() - start) / 1e9;
        sink += sum;
        start = omp_get_wtime();
#pragma omp parallel for schedule(static)
        for (long i = 0; i < N; i++)
            a[i] = b[i] + 3.0 * c[i];
        double triad = 3.0 * N * sizeof(double) / (omp_get_wtime() - start) / 1e9;
        best_read = read > best_read ? read : best_read;
        best_triad = triad > best_triad ? triad : best_triad;
    }
    printf("threads %d\nread GB/s %.1f\ntriad GB/s %.1f\n(check %g)\n", omp_get_max_threads(), best_read, best_triad,
           sink + a[N / 2]);
    return 0;
}
