/*
 * kvf_cli_check_secret_file over every class of mode (0600 and 0400 quiet, 0640 and 0644 warn,
 * 0620, 0602 and 0666 refused, a directory and a missing file refused), then the kvfence binary
 * itself: `router --api-keys F` with F at 0644 prints the one warning line naming F and the fix,
 * and with F at 0666 exits 2 with the refusal before it opens anything else.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/cli.h"
#include "kvf_test.h"

static const char *kvfence_bin;
static char dir[256];

static void make_file(const char *path, mode_t mode)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ASSERT_TRUE(fd >= 0);
    static const char keys[] = "sk-test-0123456789 alpha\n";
    ASSERT_EQ_INT(write(fd, keys, sizeof keys - 1), (int)(sizeof keys - 1));
    close(fd);
    ASSERT_OK(chmod(path, mode)); /* not subject to the umask */
}

static void setup_dir(void)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/kvf_cli_secret_XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    ASSERT_NOT_NULL(mkdtemp(dir));
}

static void test_modes(void)
{
    setup_dir();
    char path[320];
    snprintf(path, sizeof path, "%s/keys.txt", dir);
    static const struct {
        mode_t mode;
        int rc; /* 0 or the negative errno */
        bool warns;
    } cases[] = {
        {0600, 0, false},      {0400, 0, false},      {0700, 0, false},      {0640, 0, true},
        {0604, 0, true},       {0644, 0, true},       {0620, -EPERM, false}, {0602, -EPERM, false},
        {0666, -EPERM, false}, {0622, -EPERM, false},
    };
    for (size_t i = 0; i < KVF_ARRAY_LEN(cases); i++) {
        make_file(path, cases[i].mode);
        char warn[512], err[512];
        memset(warn, 'x', sizeof warn);
        memset(err, 'x', sizeof err);
        int rc = kvf_cli_check_secret_file(path, "--api-keys", warn, sizeof warn, err, sizeof err);
        if (rc != cases[i].rc)
            KVF_FAIL("mode %04o: rc %d, expected %d", cases[i].mode, rc, cases[i].rc);
        if (cases[i].warns) {
            ASSERT_NOT_NULL(strstr(warn, path));
            ASSERT_NOT_NULL(strstr(warn, "chmod 600"));
            ASSERT_NOT_NULL(strstr(warn, "--api-keys"));
            ASSERT_NULL(strchr(warn, '\n')); /* one line */
        } else {
            ASSERT_EQ_INT(warn[0], 0);
        }
        if (rc < 0) {
            ASSERT_NOT_NULL(strstr(err, path));
            ASSERT_NOT_NULL(strstr(err, "writable"));
            ASSERT_NOT_NULL(strstr(err, "chmod 600"));
        } else {
            ASSERT_EQ_INT(err[0], 0);
        }
        ASSERT_OK(unlink(path));
    }
    char warn[256], err[256];
    ASSERT_ERR(kvf_cli_check_secret_file(path, "--api-keys", warn, sizeof warn, err, sizeof err),
               -ENOENT);
    ASSERT_NOT_NULL(strstr(err, path));
    ASSERT_ERR(kvf_cli_check_secret_file(dir, "--cluster-key", warn, sizeof warn, err, sizeof err),
               -EINVAL);
    ASSERT_NOT_NULL(strstr(err, "--cluster-key"));
    ASSERT_OK(rmdir(dir));
}

/* Runs `kvfence router` with the key file at mode; returns its exit status and its stderr. */
static int run_router(const char *keys, char *out, size_t cap)
{
    int pfd[2];
    ASSERT_OK(pipe(pfd));
    pid_t pid = fork();
    ASSERT_TRUE(pid >= 0);
    if (pid == 0) {
        dup2(pfd[1], 2);
        close(pfd[0]);
        close(pfd[1]);
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        alarm(20);
        /* The model does not exist: after the key file's checks the router stops (exit 1). */
        execl(kvfence_bin, kvfence_bin, "router", "--model", "/nonexistent/model.gguf", "--prefill",
              "127.0.0.1:9", "--decode", "127.0.0.1:9", "--port", "0", "--api-keys", keys,
              (char *)NULL);
        _exit(127);
    }
    close(pfd[1]);
    size_t n = 0;
    ssize_t k;
    while (n + 1 < cap && (k = read(pfd[0], out + n, cap - 1 - n)) > 0)
        n += (size_t)k;
    out[n] = 0;
    close(pfd[0]);
    int st;
    ASSERT_EQ_INT(waitpid(pid, &st, 0), pid);
    ASSERT_TRUE(WIFEXITED(st));
    return WEXITSTATUS(st);
}

static void test_binary(void)
{
    setup_dir();
    char path[320], out[8192];
    snprintf(path, sizeof path, "%s/keys.txt", dir);

    make_file(path, 0600);
    ASSERT_EQ_INT(run_router(path, out, sizeof out), 1); /* the missing model */
    ASSERT_NULL(strstr(out, "chmod"));

    make_file(path, 0644);
    ASSERT_EQ_INT(run_router(path, out, sizeof out), 1);
    char *w = strstr(out, "readable by group or others");
    ASSERT_NOT_NULL(w);
    ASSERT_NOT_NULL(strstr(out, path));
    ASSERT_NOT_NULL(strstr(out, "chmod 600"));
    ASSERT_NULL(strstr(w + 1, "readable by group or others")); /* once */

    make_file(path, 0666);
    ASSERT_EQ_INT(run_router(path, out, sizeof out), 2);
    ASSERT_NOT_NULL(strstr(out, "writable by group or others"));
    ASSERT_NOT_NULL(strstr(out, path));
    ASSERT_NOT_NULL(strstr(out, "chmod 600"));
    ASSERT_NULL(strstr(out, "model.gguf")); /* refused before anything else was opened */

    ASSERT_OK(unlink(path));
    ASSERT_OK(rmdir(dir));
}

static const struct kvf_test_case cases[] = {
    KVF_CASE(test_modes),
    KVF_CASE(test_binary),
};

int main(int argc, char **argv)
{
    kvf_test__argc = argc;
    kvf_test__argv = argv;
    kvfence_bin = kvf_test_arg("--kvfence");
    if (!kvfence_bin) {
        fprintf(stderr, "usage: test_cli_secret_file --kvfence PATH/TO/kvfence\n");
        return 1;
    }
    return KVF_TEST_MAIN(argc, argv, cases);
}
