/* read_reference MiB ROUNDS: an independent check of moe-stack-bandwidth, written as plainly as a read
 * can be: one OpenMP reduction over 8-byte integers that the compiler vectorises, no pinning, no hand
 * vectors. Prints the best round's GB/s. */
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    if (argc != 3)
        return 64;
    long n = atol(argv[1]) * (1L << 20) / 8;
    int rounds = atoi(argv[2]);
    uint64_t *a = malloc(n * sizeof *a), sum = 0;
    if (!a)
        return 71;
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++)
        a[i] = i;
    double best = 0;
    for (int r = 0; r <= rounds; r++) {
        double start = omp_get_wtime();
#pragma omp parallel for schedule(static) reduction(+ : sum)
        for (long i = 0; i < n; i++)
            sum += a[i];
        double rate = n * 8.0 / (omp_get_wtime() - start) / 1e9;
        best = r > 0 && rate > best ? rate : best; /* round 0 warms up */
    }
    printf("reference read GB/s %.1f\n(check %llu)\n", best, (unsigned long long)sum);
    free(a);
    return 0;
}
