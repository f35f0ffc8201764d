/*
 * Replays a fuzz target's corpus without libFuzzer, so every build (gcc, ASan) runs the committed
 * seed inputs as an ordinary test. Usage: fuzz_<name>_replay FILE_OR_DIR...
 * Prints TAP: one line per input, then "N passed, 0 failed". A crash fails the test.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static size_t n_run;

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        return -1;
    }
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        return -1;
    }
    long len = ftell(f);
    rewind(f);
    uint8_t *buf = malloc(len > 0 ? (size_t)len : 1);
    if (!buf || (len > 0 && fread(buf, 1, (size_t)len, f) != (size_t)len)) {
        free(buf);
        fclose(f);
        return -1;
    }
    fclose(f);
    LLVMFuzzerTestOneInput(buf, (size_t)len);
    free(buf);
    printf("ok %zu - %s (%ld bytes)\n", ++n_run, path, len);
    return 0;
}

static int run_path(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "no such input: %s\n", path);
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) return run_file(path);
    DIR *d = opendir(path);
    if (!d) return -1;
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        char child[4096];
        snprintf(child, sizeof child, "%s/%s", path, e->d_name);
        if (run_path(child) != 0) rc = -1;
    }
    closedir(d);
    return rc;
}

int main(int argc, char **argv)
{
    int rc = 0;
    for (int i = 1; i < argc; i++)
        if (run_path(argv[i]) != 0) rc = 1;
    /* Also a few degenerate inputs that every target must survive. */
    static const uint8_t zeros[64];
    LLVMFuzzerTestOneInput(NULL, 0);
    LLVMFuzzerTestOneInput(zeros, sizeof zeros);
    n_run += 2;
    printf("1..%zu\n%zu passed, %d failed\n", n_run, n_run - (rc != 0), rc != 0);
    return rc != 0 || n_run < 3;
}
