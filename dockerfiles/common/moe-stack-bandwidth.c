/* moe-stack-bandwidth [MiB] [--rounds N] [--pages default|4k|thp|2m|1g]: the host's memory read rate,
 * the bound of hybrid decode (`moe-stack tune`, `bench`): decode streams the routed experts' weights
 * once per token, so the rate that matters is a pure read, done the way the engine's kernels read.
 *
 * - Wide loads: 64-byte vectors (the compiler splits them to what the -march it was given has: the
 *   images compile this with the engine's CPU target; the measured gap: -march=x86-64, 16-byte loads,
 *   reads 0.62 of what AVX-512 reads on an Emerald Rapids host) and 8 independent accumulators, so
 *   neither the load width nor an add's latency caps the rate below the memory's.
 * - One thread per CPU this process may use (its cpuset; OMP_NUM_THREADS caps the count), each pinned
 *   to its CPU and reading the slice it wrote first (its own NUMA node's memory, as a pinned engine
 *   thread's first touch gives).
 * - One array (default 2048 MiB) far beyond any cache, on the page size the weights will have
 *   (--pages: 4k forbids transparent huge pages, thp asks for them, 2m/1g take hugetlbfs pages;
 *   default: the kernel's policy, as a malloc'd --no-mmap load gets).
 * - A warm-up round, then N rounds (default 9).
 *
 * Prints "read GB/s" (the best round: the bound), "read median GB/s" and "read min GB/s" (the spread),
 * with the threads, CPUs and pages it ran on. Exit 64: bad arguments; 71: no memory of that kind. */
#define _GNU_SOURCE
#include <omp.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#ifndef MAP_HUGE_SHIFT
#define MAP_HUGE_SHIFT 26
#endif

#define BLOCK 512 /* bytes one step of the loop reads: 8 accumulators x 64 bytes */
#define MAX_ROUNDS 1000

typedef uint64_t vec __attribute__((vector_size(64)));

struct options {
    long mib;
    int rounds;
    const char *pages;
};

static int usage(const char *problem, const char *value)
{
    fprintf(stderr, "moe-stack-bandwidth: %s %s (usage: moe-stack-bandwidth [MiB 64..1048576] [--rounds 1..%d] "
                    "[--pages default|4k|thp|2m|1g])\n", problem, value, MAX_ROUNDS);
    return 64;
}

static int parse(int argc, char **argv, struct options *opt)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--rounds") && i + 1 < argc) {
            opt->rounds = atoi(argv[++i]);
            if (opt->rounds < 1 || opt->rounds > MAX_ROUNDS)
                return usage("the rounds are 1 to 1000, not", argv[i]);
        } else if (!strcmp(argv[i], "--pages") && i + 1 < argc) {
            opt->pages = argv[++i];
            if (strcmp(opt->pages, "default") && strcmp(opt->pages, "4k") && strcmp(opt->pages, "thp") &&
                strcmp(opt->pages, "2m") && strcmp(opt->pages, "1g"))
                return usage("the pages are default, 4k, thp, 2m or 1g, not", opt->pages);
        } else if (argv[i][0] != '-') {
            opt->mib = atol(argv[i]);
            if (opt->mib < 64 || opt->mib > (1L << 20))
                return usage("the array size is 64 to 1048576 MiB, not", argv[i]);
        } else {
            return usage("unknown or incomplete option", argv[i]);
        }
    }
    return 0;
}

/* `bytes` of anonymous memory on `pages`; NULL (and why, on stderr) when the kernel has none such. */
static void *allocate(size_t bytes, const char *pages)
{
    int huge = !strcmp(pages, "2m") ? 21 : !strcmp(pages, "1g") ? 30 : 0;
    int flags = MAP_PRIVATE | MAP_ANONYMOUS | (huge ? MAP_HUGETLB | (huge << MAP_HUGE_SHIFT) : 0);
    size_t page = (size_t)1 << (huge ? huge : 21); /* hugetlb: whole pages; else room to align to 2 MiB */
    size_t mapped = (bytes + page - 1) / page * page + (huge ? 0 : page);
    char *base = mmap(NULL, mapped, PROT_READ | PROT_WRITE, flags, -1, 0);
    if (base == MAP_FAILED) {
        fprintf(stderr, "moe-stack-bandwidth: can't map %zu MiB on %s pages%s\n", bytes >> 20, pages,
                huge ? " (reserve them: /sys/kernel/mm/hugepages/hugepages-*/nr_hugepages)" : "");
        return NULL;
    }
    char *start = huge ? base : (char *)(((uintptr_t)base + page - 1) & ~(uintptr_t)(page - 1));
    if (!strcmp(pages, "thp") && madvise(start, bytes, MADV_HUGEPAGE))
        perror("moe-stack-bandwidth: madvise(MADV_HUGEPAGE)");
    if (!strcmp(pages, "4k") && madvise(start, bytes, MADV_NOHUGEPAGE))
        perror("moe-stack-bandwidth: madvise(MADV_NOHUGEPAGE)");
    return start;
}

/* The sum of `n` 512-byte blocks at `p`: 8 independent accumulators of 64-byte loads. Built without a
 * -march (the portable image), it carries AVX-512 and AVX2 clones, the widest the CPU has chosen at start. */
#ifndef __AVX2__
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
static uint64_t read_blocks(const vec *p, size_t n)
{
    vec s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0}, s4 = {0}, s5 = {0}, s6 = {0}, s7 = {0};
    for (size_t i = 0; i < n; i++, p += 8) {
        s0 += p[0];
        s1 += p[1];
        s2 += p[2];
        s3 += p[3];
        s4 += p[4];
        s5 += p[5];
        s6 += p[6];
        s7 += p[7];
    }
    vec s = s0 + s1 + s2 + s3 + s4 + s5 + s6 + s7;
    uint64_t total = 0;
    for (int k = 0; k < 8; k++)
        total += s[k];
    return total;
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Each thread pinned to the i-th CPU of `allowed`; writes, then reads its slice: a warm-up round and
 * `rounds` timed ones into seconds[]. Returns the sum read (so no read is optimised away). */
static uint64_t measure(char *array, size_t blocks, const cpu_set_t *allowed, int rounds, double *seconds)
{
    int cpus[CPU_SETSIZE], ncpu = 0;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, allowed))
            cpus[ncpu++] = c;
    uint64_t sink = 0;
#pragma omp parallel reduction(+ : sink)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        cpu_set_t mine;
        CPU_ZERO(&mine);
        CPU_SET(cpus[t % ncpu], &mine);
        if (sched_setaffinity(0, sizeof mine, &mine))
            perror("moe-stack-bandwidth: sched_setaffinity");
        size_t first = blocks * t / nt, last = blocks * (t + 1) / nt;
        memset(array + first * BLOCK, t + 1, (last - first) * BLOCK);
        for (int round = -1; round < rounds; round++) {
            double start = 0;
#pragma omp barrier
#pragma omp master
            start = omp_get_wtime();
            sink += read_blocks((const vec *)(array + first * BLOCK), last - first);
#pragma omp barrier
#pragma omp master
            if (round >= 0)
                seconds[round] = omp_get_wtime() - start;
        }
    }
    return sink;
}

static void print_cpus(const cpu_set_t *allowed)
{
    const char *sep = "";
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (!CPU_ISSET(c, allowed) || (c > 0 && CPU_ISSET(c - 1, allowed)))
            continue;
        int end = c;
        while (end + 1 < CPU_SETSIZE && CPU_ISSET(end + 1, allowed))
            end++;
        printf(end > c ? "%s%d-%d" : "%s%d", sep, c, end);
        sep = ",";
    }
}

int main(int argc, char **argv)
{
    struct options opt = {2048, 9, "default"};
    int bad = parse(argc, argv, &opt);
    if (bad)
        return bad;
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof allowed, &allowed)) {
        perror("moe-stack-bandwidth: sched_getaffinity");
        return 71;
    }
    if (!getenv("OMP_NUM_THREADS"))
        omp_set_num_threads(CPU_COUNT(&allowed));
    size_t bytes = (size_t)opt.mib << 20, blocks = bytes / BLOCK;
    char *array = allocate(bytes, opt.pages);
    if (!array)
        return 71;
    double seconds[MAX_ROUNDS], rate[MAX_ROUNDS];
    uint64_t sink = measure(array, blocks, &allowed, opt.rounds, seconds);
    for (int r = 0; r < opt.rounds; r++)
        rate[r] = blocks * (double)BLOCK / seconds[r] / 1e9;
    qsort(rate, opt.rounds, sizeof *rate, by_value);
    double median = opt.rounds % 2 ? rate[opt.rounds / 2] : (rate[opt.rounds / 2 - 1] + rate[opt.rounds / 2]) / 2;
    printf("threads %d\ncpus ", omp_get_max_threads());
    print_cpus(&allowed);
    printf("\npages %s\narray MiB %ld\nrounds %d\n", opt.pages, opt.mib, opt.rounds);
    printf("read GB/s %.1f\nread median GB/s %.1f\nread min GB/s %.1f\n(check %llu)\n", rate[opt.rounds - 1],
           median, rate[0], (unsigned long long)sink);
    return 0;
}
