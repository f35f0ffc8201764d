/* cli_fabric.c — the cluster key of `router`, `prefill` and `decode`, and the rule that a fabric
 * listener beyond loopback needs one: --cluster-key FILE (KVF_CLI_FABRIC_OPTS, so also
 * KVFENCE_CLUSTER_KEY or KVFENCE_CLUSTER_KEY_FILE), or an explicit --insecure-fabric. Also
 * `kvfence keygen FILE`, which writes a key file. */
#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "kvfence/transport.h"

#define KEY_FILE_MAX 4096

static bool host_is_loopback(const char *h)
{
    return strcmp(h, "localhost") == 0 || strcmp(h, "::1") == 0 || strncmp(h, "127.", 4) == 0;
}

/* Reads the key file: its owner's only (group or others may not write it; reading it is
 * warned about), at least KVF_FABRIC_KEY_MIN_SECRET bytes once trailing whitespace is cut. */
static int load_key(const char *cmd, struct kvf_cli_fabric *f)
{
    char warn[256] = "", err[256] = "";
    if (kvf_cli_check_secret_file(f->key_path, "--cluster-key", warn, sizeof warn, err,
                                  sizeof err) < 0) {
        fprintf(stderr, "kvfence %s: %s\n", cmd, err);
        return -1;
    }
    if (warn[0]) fprintf(stderr, "kvfence %s: %s\n", cmd, warn);
    int fd = open(f->key_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "kvfence %s: --cluster-key %s: %s\n", cmd, f->key_path, strerror(errno));
        return -1;
    }
    unsigned char buf[KEY_FILE_MAX + 1];
    ssize_t n = 0, r;
    while (n < (ssize_t)sizeof(buf) && (r = read(fd, buf + n, sizeof(buf) - (size_t)n)) > 0)
        n += r;
    close(fd);
    if (n > KEY_FILE_MAX) {
        fprintf(stderr,
                "kvfence %s: --cluster-key %s: more than %d bytes; a key file holds one key\n", cmd,
                f->key_path, KEY_FILE_MAX);
        return -1;
    }
    while (n > 0 &&
           (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ' || buf[n - 1] == '\t'))
        n--;
    int rc = kvf_fabric_key_derive(buf, (size_t)n, f->key);
    memset(buf, 0, sizeof(buf));
    if (rc < 0) {
        fprintf(stderr,
                "kvfence %s: --cluster-key %s: %zd bytes, fewer than %d; write a key with "
                "`kvfence keygen FILE`\n",
                cmd, f->key_path, n, KVF_FABRIC_KEY_MIN_SECRET);
        return -1;
    }
    f->have_key = true;
    return 0;
}

int kvf_cli_fabric_prepare(const char *cmd, struct kvf_cli_fabric *f, const char *listen_host)
{
    if (f->key_path) return load_key(cmd, f) < 0 ? 2 : 0;
    if (listen_host && !host_is_loopback(listen_host) && !f->insecure) {
        fprintf(stderr,
                "kvfence %s: refusing to listen on %s without a cluster key: any host that reaches "
                "the port could join the service and read prompts. Give every router and worker "
                "the same --cluster-key FILE (`kvfence keygen FILE` writes one), or pass "
                "--insecure-fabric on a network where every host is trusted\n",
                cmd, listen_host);
        return 2;
    }
    if (listen_host && !host_is_loopback(listen_host))
        fprintf(stderr, "kvfence %s: warning: --insecure-fabric: the fabric on %s takes any peer\n",
                cmd, listen_host);
    return 0;
}

const uint8_t *kvf_cli_fabric_key(const struct kvf_cli_fabric *f)
{
    return f->have_key ? f->key : NULL;
}

struct keygen_opts {
    const char *path;
};

static const struct kvf_cli_spec keygen_spec = {
    .name = "keygen",
    .opts_size = sizeof(struct keygen_opts),
    .positional = "FILE",
    .positional_off = offsetof(struct keygen_opts, path),
    .positional_required = true,
    .about = "Writes a new cluster key (32 random bytes, as 64 hex digits) to FILE, which must\n"
             "not exist, readable by its owner only. Give the same file to every router,\n"
             "prefill and decode of one service with --cluster-key FILE.\n",
};

int kvf_cmd_keygen(int argc, char **argv)
{
    struct keygen_opts o = {0};
    int exit_status = 0;
    if (kvf_cli_parse(&keygen_spec, argc, argv, &o, &exit_status) < 0) return exit_status;
    uint8_t k[32];
    char hex[65];
    if (kvf_fabric_random(k, sizeof k) < 0) {
        fprintf(stderr, "kvfence keygen: no random source\n");
        return 1;
    }
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", k[i]);
    hex[64] = '\n';
    memset(k, 0, sizeof k);
    int fd = open(o.path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        fprintf(stderr, "kvfence keygen: %s: %s\n", o.path, strerror(errno));
        return 1;
    }
    bool ok = write(fd, hex, sizeof hex) == (ssize_t)sizeof hex;
    ok = close(fd) == 0 && ok;
    memset(hex, 0, sizeof hex);
    if (!ok) {
        fprintf(stderr, "kvfence keygen: %s: write failed\n", o.path);
        unlink(o.path);
        return 1;
    }
    fprintf(stderr, "kvfence keygen: wrote a cluster key to %s (mode 0600)\n", o.path);
    return 0;
}
