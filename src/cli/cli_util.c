/* cli_util.c — option parsing and the model fingerprint, shared by the serving commands. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
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


void kvf_cli_block_stop_signals(sigset_t *sigs)
{
    sigemptyset(sigs);
    sigaddset(sigs, SIGINT);
    sigaddset(sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
}

int kvf_cli_open_model(const char *cmd, const char *path, kvf_gguf_t **g, kvf_model_t **m,
                       kvf_tokenizer_t **tok, uint64_t *fp)
{
    char err[256] = "";
    if (kvf_gguf_open(path, g, err, sizeof(err)) < 0 || kvf_model_load(*g, m, err, sizeof(err)) < 0 ||
        (tok && kvf_tokenizer_create(*g, tok, err, sizeof(err)) < 0)) {
        fprintf(stderr, "kvfence %s: %s: %s\n", cmd, path, err);
        return -1;
    }
    if (kvf_cli_file_fp(path, fp) < 0) {
        fprintf(stderr, "kvfence %s: cannot read %s\n", cmd, path);
        return -1;
    }
    return 0;
}
