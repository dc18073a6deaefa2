/* moe-stack-hugecopy SRC DST: copy a model file into a hugetlbfs mount, so that an engine which
 * mmaps its weights (llama.cpp) gets them on huge pages from the host's reserved pool.
 *
 * hugetlbfs takes no write(2): the pages are reserved with fallocate (which fails cleanly with
 * ENOSPC when the pool is short, where touching an unreserved page would SIGBUS) and filled through
 * a shared mapping. The copy's size is rounded up to whole huge pages (zero padding after the last
 * GGUF tensor, which readers ignore).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#define HUGETLBFS_MAGIC 0x958458f6
#define CHUNK (16u << 20)

static int fail(const char *what, const char *path)
{
    fprintf(stderr, "moe-stack-hugecopy: %s %s: %s\n", what, path, strerror(errno));
    return 1;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: moe-stack-hugecopy SRC DST   (DST on a hugetlbfs mount)\n");
        return 64;
    }
    const char *src_path = argv[1], *dst_path = argv[2];
    int src = open(src_path, O_RDONLY | O_CLOEXEC);
    struct stat info;
    if (src < 0 || fstat(src, &info) != 0)
        return fail("cannot read", src_path);
    /* The mount is checked before anything is created there, and the destination is opened without
     * following a link: a link planted in its place can't send the copy elsewhere. */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", dst_path);
    char *slash = strrchr(dir, '/');
    if (slash == NULL)
        snprintf(dir, sizeof dir, ".");
    else
        slash[slash == dir] = '\0';
    struct statfs fs;
    if (statfs(dir, &fs) != 0)
        return fail("cannot reach", dir);
    if ((unsigned long)fs.f_type != HUGETLBFS_MAGIC) {
        fprintf(stderr, "moe-stack-hugecopy: %s is not on a hugetlbfs mount\n", dst_path);
        return 1;
    }
    int dst = open(dst_path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    struct stat held;
    if (dst < 0 || fstat(dst, &held) != 0)
        return fail("cannot create", dst_path);
    if (!S_ISREG(held.st_mode) || held.st_uid != geteuid()) {
        fprintf(stderr, "moe-stack-hugecopy: %s exists and is not a file of this user's; remove it\n", dst_path);
        return 1;
    }
    size_t page = (size_t)fs.f_bsize, size = (size_t)info.st_size;
    size_t length = (size + page - 1) / page * page;
    /* A copy left by an earlier start is replaced: its pages go back to the pool first. */
    if (ftruncate(dst, 0) != 0)
        return fail("cannot truncate", dst_path);
    if (fallocate(dst, 0, 0, (off_t)length) != 0) {
        if (errno == ENOSPC) {
            fprintf(stderr, "moe-stack-hugecopy: the host's pool has fewer than %zu free %zu kB hugepages for %s; "
                            "reserve more with `sysctl -w vm.nr_hugepages=N` on the host\n",
                    length / page, page >> 10, src_path);
            return 1;
        }
        return fail("cannot reserve hugepages for", dst_path);
    }
    char *map = mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_SHARED, dst, 0);
    if (map == MAP_FAILED)
        return fail("cannot map", dst_path);
    size_t done = 0;
    while (done < size) {
        size_t want = size - done < CHUNK ? size - done : CHUNK;
        ssize_t got = read(src, map + done, want);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            if (got == 0)
                errno = EIO;  /* the file shrank while being copied */
            return fail("cannot read", src_path);
        }
        done += (size_t)got;
    }
    if (munmap(map, length) != 0 || close(dst) != 0)
        return fail("cannot finish", dst_path);
    close(src);
    return 0;
}
