/* cli_util.c — option parsing and the model fingerprint, shared by the serving commands. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "cli.h"

int kvf_cli_parse_size(const char *v, uint64_t *out)
{
    char *end = NULL;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || !(x > 0)) return -1;
    uint64_t mul = 1;
    if (*end == 'k' || *end == 'K') mul = 1ull << 10, end++;
    else if (*end == 'm' || *end == 'M') mul = 1ull << 20, end++;
    else if (*end == 'g' || *end == 'G') mul = 1ull << 30, end++;
    if (*end == 'i' || *end == 'B' || *end == 'b') end++;
    if (*end == 'B') end++;
    if (*end) return -1;
    *out = (uint64_t)(x * (double)mul);
    return 0;
}

int kvf_cli_parse_u32(const char *v, uint32_t lo, uint32_t hi, uint32_t *out)
{
    char *end = NULL;
    errno = 0;
    unsigned long x = strtoul(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) return -1;
    *out = (uint32_t)x;
    return 0;
}

/* The model's fingerprint: XXH3 of the whole file, so two workers agree only on the same bytes. */
int kvf_cli_file_fp(const char *path, uint64_t *fp)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -errno;
    struct stat st;
    if (fstat(fd, &st) < 0 || st.st_size <= 0) {
        close(fd);
        return -EINVAL;
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return -errno;
    *fp = XXH3_64bits(p, (size_t)st.st_size);
    munmap(p, (size_t)st.st_size);
    return 0;
}

