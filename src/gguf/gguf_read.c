/* The GGUF reader: one pass over the header, the key/values and the tensor descriptions, with
 * every length checked against the bytes that remain before it is used.
 *
 * File layout (little endian):
 *   u32 magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
 *   n_kv × { string key | u32 type | value }          string = u64 length + bytes
 *                                                     array  = u32 elem type + u64 n + n values
 *   n_tensors × { string name | u32 n_dims | u64 ne[n_dims] | u32 type | u64 offset }
 *   padding to the alignment | data section (tensor offsets are relative to its start)
 *
 * The reader never trusts a count to size an allocation before checking that the file could
 * hold that many entries at their minimum size, so memory stays proportional to the file. */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf_internal.h"
#include "kvfence/common.h"
#include "kvfence/gguf.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the GGUF reader assumes a little-endian host"
#endif

#define GGUF_MAGIC     0x46554747u /* "GGUF" read as a little-endian u32 */
#define MAX_KEY_BYTES  65535u
#define MAX_NAME_BYTES 255u

/* One key/value. For a string, val points at its bytes and len is their count; for an array,
 * val points at the first element, len is the element count, and str_off (string arrays only)
 * holds each element's offset from val, so element i is found in O(1). */
struct kv {
    const char *key;
    size_t key_len;
    uint32_t type;
    uint32_t elem_type;
    const uint8_t *val;
    uint64_t len;
    uint64_t *str_off;
};

struct kvf_gguf {
    const uint8_t *base; /* the whole file */
    size_t size;
    bool mapped; /* base is our mmap (else the caller's buffer) */
    uint32_t version;
    uint32_t alignment;
    uint64_t n_kv, n_tensors;
    struct kv *kvs;                  /* [n_kv] */
    struct kvf_gguf_tensor *tensors; /* [n_tensors] */
    char *names;                     /* the tensors' NUL-terminated names, back to back */
    uint64_t *kv_table, *t_table;    /* open addressing: index + 1, 0 = empty */
    size_t kv_cap, t_cap;
};

/* A read cursor over the file. */
struct cur {
    const uint8_t *p;
    size_t size, off;
    char *err;
    size_t err_len;
};

static size_t left(const struct cur *c)
{
    return c->size - c->off;
}

static int need(struct cur *c, uint64_t n, const char *what)
{
    if (n > left(c))
        return kvf__gguf_fail(c->err, c->err_len, KVF_E_MODEL_TRUNCATED,
                              "offset %zu: %s needs %llu bytes, %zu remain", c->off, what,
                              (unsigned long long)n, left(c));
    return 0;
}

static int rd_u32(struct cur *c, uint32_t *v, const char *what)
{
    int rc = need(c, 4, what);
    if (rc < 0) return rc;
    memcpy(v, c->p + c->off, 4);
    c->off += 4;
    return 0;
}

static int rd_u64(struct cur *c, uint64_t *v, const char *what)
{
    int rc = need(c, 8, what);
    if (rc < 0) return rc;
    memcpy(v, c->p + c->off, 8);
    c->off += 8;
    return 0;
}

/* A string: a view of *len bytes at *s. */
static int rd_str(struct cur *c, const char **s, uint64_t *len, const char *what)
{
    int rc = rd_u64(c, len, what);
    if (rc < 0) return rc;
    if ((rc = need(c, *len, what)) < 0) return rc;
    *s = (const char *)c->p + c->off;
    c->off += (size_t)*len;
    return 0;
}

/* Size of a scalar value of metadata type t, or 0 for strings, arrays and unknown types. */
static size_t scalar_size(uint32_t t)
{
    switch (t) {
    case KVF_GGUF_U8:
    case KVF_GGUF_I8:
    case KVF_GGUF_BOOL:
        return 1;
    case KVF_GGUF_U16:
    case KVF_GGUF_I16:
        return 2;
    case KVF_GGUF_U32:
    case KVF_GGUF_I32:
    case KVF_GGUF_F32:
        return 4;
    case KVF_GGUF_U64:
    case KVF_GGUF_I64:
    case KVF_GGUF_F64:
        return 8;
    default:
        return 0;
    }
}

static bool valid_name(const char *s, uint64_t len, uint64_t max)
{
    return len > 0 && len <= max && memchr(s, '\0', (size_t)len) == NULL;
}

/* Open-addressing lookup of (s, n) among the entries whose name is fetched by `name_of`. */
typedef const char *(*name_fn)(const kvf_gguf_t *g, uint64_t i, size_t *len);

static const char *kv_name(const kvf_gguf_t *g, uint64_t i, size_t *len)
{
    *len = g->kvs[i].key_len;
    return g->kvs[i].key;
}

static const char *t_name(const kvf_gguf_t *g, uint64_t i, size_t *len)
{
    *len = strlen(g->tensors[i].name);
    return g->tensors[i].name;
}

/* Returns the slot holding (s, n), or the empty slot where it would go. The table is at most
 * half full, so the probe ends. */
static size_t probe(const kvf_gguf_t *g, const uint64_t *table, size_t cap, name_fn fn,
                    const char *s, size_t n)
{
    size_t i = (size_t)kvf__gguf_hash(s, n) & (cap - 1);
    for (;; i = (i + 1) & (cap - 1)) {
        if (table[i] == 0) return i;
        size_t len;
        const char *name = fn(g, table[i] - 1, &len);
        if (len == n && memcmp(name, s, n) == 0) return i;
    }
}

static int parse_kv(struct cur *c, struct kv *kv)
{
    uint64_t key_len;
    int rc = rd_str(c, &kv->key, &key_len, "key");
    if (rc < 0) return rc;
    if (!valid_name(kv->key, key_len, MAX_KEY_BYTES))
        return kvf__gguf_fail(c->err, c->err_len, KVF_E_MODEL_FORMAT,
                              "offset %zu: key of %llu bytes is empty, too long or holds NUL",
                              c->off, (unsigned long long)key_len);
    kv->key_len = (size_t)key_len;
    if ((rc = rd_u32(c, &kv->type, "value type")) < 0) return rc;
    if (kv->type == KVF_GGUF_STRING) {
        const char *s;
        if ((rc = rd_str(c, &s, &kv->len, "string value")) < 0) return rc;
        kv->val = (const uint8_t *)s;
        return 0;
    }
    if (kv->type != KVF_GGUF_ARRAY) {
        size_t sz = scalar_size(kv->type);
        if (sz == 0)
            return kvf__gguf_fail(c->err, c->err_len, KVF_E_MODEL_FORMAT,
                                  "key '%.*s': unknown value type %u", (int)kv->key_len, kv->key,
                                  kv->type);
        if ((rc = need(c, sz, "scalar value")) < 0) return rc;
        kv->val = c->p + c->off;
        c->off += sz;
        return 0;
    }
    if ((rc = rd_u32(c, &kv->elem_type, "array element type")) < 0) return rc;
    if ((rc = rd_u64(c, &kv->len, "array length")) < 0) return rc;
    kv->val = c->p + c->off;
    if (kv->elem_type == KVF_GGUF_ARRAY)
        return kvf__gguf_fail(c->err, c->err_len, KVF_E_MODEL_UNSUPPORTED,
                              "key '%.*s': nested arrays are not supported", (int)kv->key_len,
                              kv->key);
    if (kv->elem_type != KVF_GGUF_STRING) {
        size_t sz = scalar_size(kv->elem_type);
        if (sz == 0)
            return kvf__gguf_fail(c->err, c->err_len, KVF_E_MODEL_FORMAT,
                                  "key '%.*s': unknown array element type %u", (int)kv->key_len,
                                  kv->key, kv->elem_type);
        if (kv->len > left(c) / sz)
            return kvf__gguf_fail(c->err, c->err_len, KVF_E_MODEL_TRUNCATED,
                                  "key '%.*s': array of %llu elements runs past the end",
                                  (int)kv->key_len, kv->key, (unsigned long long)kv->len);
        c->off += (size_t)kv->len * sz;
        return 0;
    }
    /* A string array: each element is at least its 8-byte length, which bounds the index. */
    if (kv->len > left(c) / 8)
        return kvf__gguf_fail(c->err, c->err_len, KVF_E_MODEL_TRUNCATED,
                              "key '%.*s': array of %llu strings runs past the end",
                              (int)kv->key_len, kv->key, (unsigned long long)kv->len);
    kv->str_off = malloc(kv->len ? (size_t)kv->len * sizeof(uint64_t) : 1);
    if (!kv->str_off) return kvf__gguf_fail(c->err, c->err_len, -ENOMEM, "out of memory");
    for (uint64_t i = 0; i < kv->len; i++) {
        const char *s;
        uint64_t n;
        kv->str_off[i] = (uint64_t)(c->p + c->off - kv->val);
        if ((rc = rd_str(c, &s, &n, "array string")) < 0) return rc;
    }
    return 0;
}

static int parse_kvs(kvf_gguf_t *g, struct cur *c)
{
    /* The smallest key/value is a 1-byte key and a 1-byte value: 8 + 1 + 4 + 1 bytes. */
    if (g->n_kv > left(c) / 14)
        return kvf__gguf_fail(c->err, c->err_len, KVF_E_MODEL_TRUNCATED,
                              "%llu key/values cannot fit in the %zu bytes that remain",
                              (unsigned long long)g->n_kv, left(c));
    g->kv_cap = kvf__gguf_table_cap(g->n_kv);
    g->kvs = calloc(g->n_kv ? (size_t)g->n_kv : 1, sizeof *g->kvs);
    g->kv_table = g->kv_cap ? calloc(g->kv_cap, sizeof *g->kv_table) : NULL;
    if (!g->kvs || !g->kv_table)
        return kvf__gguf_fail(c->err, c->err_len, -ENOMEM, "out of memory");
    for (uint64_t i = 0; i < g->n_kv; i++) {
        struct kv *kv = &g->kvs[i];
        int rc = parse_kv(c, kv);
        if (rc < 0) return rc;
        size_t slot = probe(g, g->kv_table, g->kv_cap, kv_name, kv->key, kv->key_len);
        if (g->kv_table[slot] != 0)
            return kvf__gguf_fail(c->err, c->err_len, KVF_E_MODEL_FORMAT, "duplicate key '%.*s'",
                                  (int)kv->key_len, kv->key);
        g->kv_table[slot] = i + 1;
    }
    return 0;
}

static const struct kv *find_kv(const kvf_gguf_t *g, const char *key)
{
    if (!g || !key) return NULL;
    size_t n = strlen(key);
    uint64_t e = g->kv_table[probe(g, g->kv_table, g->kv_cap, kv_name, key, n)];
    return e ? &g->kvs[e - 1] : NULL;
}

static int read_alignment(kvf_gguf_t *g, struct cur *c)
{
    g->alignment = KVF_GGUF_DEFAULT_ALIGNMENT;
    const struct kv *kv = find_kv(g, "general.alignment");
    if (!kv) return 0;
    uint32_t a;
    if (kv->type != KVF_GGUF_U32)
        return kvf__gguf_fail(c->err, c->err_len, KVF_E_MODEL_FORMAT,
                              "general.alignment has type %u, not u32", kv->type);
    memcpy(&a, kv->val, 4);
    if (a == 0 || (a & (a - 1)) != 0)
        return kvf__gguf_fail(c->err, c->err_len, KVF_E_MODEL_FORMAT,
                              "general.alignment %u is not a power of two", a);
    g->alignment = a;
    return 0;
}

/* Parses one tensor description; its name is copied to *names (advanced past the NUL). */
static int parse_tensor(kvf_gguf_t *g, struct cur *c, struct kvf_gguf_tensor *t, uint64_t *offset,
                        char **names)
{
    const char *name;
    uint64_t name_len;
    int rc = rd_str(c, &name, &name_len, "tensor name");
    if (rc < 0) return rc;
    if (!valid_name(name, name_len, MAX_NAME_BYTES))
        return kvf__gguf_fail(c->err, c->err_len, KVF_E_MODEL_FORMAT,
                              "offset %zu: tensor name of %llu bytes is empty, too long or "
                              "holds NUL",
                              c->off, (unsigned long long)name_len);
    memcpy(*names, name, (size_t)name_len);
    (*names)[name_len] = '\0';
    t->name = *names;
    *names += name_len + 1;
    if ((rc = rd_u32(c, &t->n_dims, "tensor n_dims")) < 0) return rc;
    if (t->n_dims == 0 || t->n_dims > KVF_GGUF_MAX_DIMS)
        return kvf__gguf_fail(c->err, c->err_len, KVF_E_MODEL_FORMAT,
                              "tensor '%s': %u dimensions (1..4 allowed)", t->name, t->n_dims);
    uint64_t n_elems = 1;
    for (uint32_t d = 0; d < KVF_GGUF_MAX_DIMS; d++) {
        t->ne[d] = 1;
        if (d < t->n_dims && (rc = rd_u64(c, &t->ne[d], "tensor dimension")) < 0) return rc;
        if (t->ne[d] == 0 || t->ne[d] > (uint64_t)INT64_MAX / n_elems)
            return kvf__gguf_fail(c->err, c->err_len, KVF_E_MODEL_FORMAT,
                                  "tensor '%s': dimension %u of size %llu is zero or overflows",
                                  t->name, d, (unsigned long long)t->ne[d]);
        n_elems *= t->ne[d];
    }
    if ((rc = rd_u32(c, &t->type, "tensor type")) < 0) return rc;
    if ((rc = rd_u64(c, offset, "tensor offset")) < 0) return rc;
    if (!kvf_ggml_type_supported(t->type))
        return kvf__gguf_fail(c->err, c->err_len, KVF_E_MODEL_UNSUPPORTED,
                              "tensor '%s': type %s (%u) is not supported (F32, F16, BF16, "
                              "Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K are)",
                              t->name, kvf_ggml_type_name(t->type), t->type);
    uint64_t row_bytes;
    rc = kvf_quant_row_bytes(t->type, t->ne[0], &row_bytes);
    if (rc < 0)
        return kvf__gguf_fail(c->err, c->err_len, KVF_E_MODEL_FORMAT,
                              "tensor '%s': row of %llu is not whole blocks of %s", t->name,
                              (unsigned long long)t->ne[0], kvf_ggml_type_name(t->type));
    uint64_t rows = n_elems / t->ne[0];
    if (row_bytes != 0 && rows > UINT64_MAX / row_bytes)
        return kvf__gguf_fail(c->err, c->err_len, KVF_E_MODEL_FORMAT, "tensor '%s': size overflows",
                              t->name);
    t->n_bytes = rows * row_bytes;
    if (*offset % g->alignment != 0)
        return kvf__gguf_fail(c->err, c->err_len, KVF_E_MODEL_FORMAT,
                              "tensor '%s': offset %llu is not a multiple of the alignment %u",
                              t->name, (unsigned long long)*offset, g->alignment);
    return 0;
}

static int parse_tensors(kvf_gguf_t *g, struct cur *c)
{
    /* The smallest description: 1-byte name, one dimension, type and offset: 8+1+4+8+4+8. */
    if (g->n_tensors > left(c) / 33)
        return kvf__gguf_fail(c->err, c->err_len, KVF_E_MODEL_TRUNCATED,
                              "%llu tensors cannot fit in the %zu bytes that remain",
                              (unsigned long long)g->n_tensors, left(c));
    size_t n = g->n_tensors ? (size_t)g->n_tensors : 1;
    uint64_t *offsets = calloc(n, sizeof *offsets);
    g->tensors = calloc(n, sizeof *g->tensors);
    /* Names take no more than the bytes that remain, nor more than the longest name each,
     * plus one NUL each. */
    size_t name_bytes = left(c) < n * MAX_NAME_BYTES ? left(c) : n * MAX_NAME_BYTES;
    g->names = malloc(name_bytes + n);
    g->t_cap = kvf__gguf_table_cap(g->n_tensors);
    g->t_table = g->t_cap ? calloc(g->t_cap, sizeof *g->t_table) : NULL;
    int rc = 0;
    if (!offsets || !g->tensors || !g->names || !g->t_table) {
        rc = kvf__gguf_fail(c->err, c->err_len, -ENOMEM, "out of memory");
        goto free_offsets;
    }
    char *names = g->names;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        struct kvf_gguf_tensor *t = &g->tensors[i];
        if ((rc = parse_tensor(g, c, t, &offsets[i], &names)) < 0) goto free_offsets;
        size_t slot = probe(g, g->t_table, g->t_cap, t_name, t->name, strlen(t->name));
        if (g->t_table[slot] != 0) {
            rc = kvf__gguf_fail(c->err, c->err_len, KVF_E_MODEL_FORMAT, "duplicate tensor '%s'",
                                t->name);
            goto free_offsets;
        }
        g->t_table[slot] = i + 1;
    }
    /* The data section starts at the next multiple of the alignment. */
    uint64_t data = ((uint64_t)c->off + g->alignment - 1) / g->alignment * g->alignment;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        struct kvf_gguf_tensor *t = &g->tensors[i];
        if (data > c->size || offsets[i] > c->size - data ||
            t->n_bytes > c->size - data - offsets[i]) {
            rc = kvf__gguf_fail(c->err, c->err_len, KVF_E_MODEL_TRUNCATED,
                                "tensor '%s': %llu bytes at data offset %llu run past the end "
                                "of the file (%zu bytes)",
                                t->name, (unsigned long long)t->n_bytes,
                                (unsigned long long)offsets[i], c->size);
            goto free_offsets;
        }
        t->data = c->p + data + offsets[i];
        uintptr_t align = t->type == KVF_GGML_F32 ? 4 : 2;
        if ((uintptr_t)t->data % align != 0) {
            rc = kvf__gguf_fail(c->err, c->err_len, KVF_E_MODEL_UNSUPPORTED,
                                "tensor '%s': data is not %u-byte aligned in memory", t->name,
                                (unsigned)align);
            goto free_offsets;
        }
    }
free_offsets:
    free(offsets);
    return rc;
}

static int parse(kvf_gguf_t *g, char *err, size_t err_len)
{
    struct cur c = {g->base, g->size, 0, err, err_len};
    uint32_t magic;
    int rc;
    if ((rc = rd_u32(&c, &magic, "magic")) < 0) return rc;
    if (magic != GGUF_MAGIC)
        return kvf__gguf_fail(err, err_len, KVF_E_MODEL_FORMAT, "not a GGUF file (bad magic)");
    if ((rc = rd_u32(&c, &g->version, "version")) < 0) return rc;
    if (g->version != 2 && g->version != 3)
        return kvf__gguf_fail(err, err_len, KVF_E_MODEL_UNSUPPORTED,
                              "GGUF version %u is not supported (2 and 3 are)", g->version);
    if ((rc = rd_u64(&c, &g->n_tensors, "tensor count")) < 0) return rc;
    if ((rc = rd_u64(&c, &g->n_kv, "key/value count")) < 0) return rc;
    if ((rc = parse_kvs(g, &c)) < 0) return rc;
    if ((rc = read_alignment(g, &c)) < 0) return rc;
    return parse_tensors(g, &c);
}

static void free_parsed(kvf_gguf_t *g)
{
    if (g->kvs)
        for (uint64_t i = 0; i < g->n_kv; i++)
            free(g->kvs[i].str_off);
    free(g->kvs);
    free(g->tensors);
    free(g->names);
    free(g->kv_table);
    free(g->t_table);
}

int kvf_gguf_open_mem(const void *buf, size_t len, kvf_gguf_t **out, char *err, size_t err_len)
{
    if (err && err_len) err[0] = '\0';
    if (!out || (!buf && len)) return kvf__gguf_fail(err, err_len, -EINVAL, "invalid argument");
    kvf_gguf_t *g = calloc(1, sizeof *g);
    if (!g) return kvf__gguf_fail(err, err_len, -ENOMEM, "out of memory");
    static const uint8_t empty[1];
    g->base = buf ? buf : empty;
    g->size = len;
    int rc = parse(g, err, err_len);
    if (rc < 0) {
        free_parsed(g);
        free(g);
        return rc;
    }
    *out = g;
    return 0;
}

int kvf_gguf_open(const char *path, kvf_gguf_t **out, char *err, size_t err_len)
{
    if (err && err_len) err[0] = '\0';
    if (!path || !out) return kvf__gguf_fail(err, err_len, -EINVAL, "invalid argument");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = -errno;
        return kvf__gguf_fail(err, err_len, e, "%s: %s", path, kvf_strerror(e));
    }
    struct stat st;
    int rc;
    if (fstat(fd, &st) != 0) {
        rc = -errno;
        kvf__gguf_fail(err, err_len, rc, "%s: %s", path, kvf_strerror(rc));
        goto close_fd;
    }
    if (!S_ISREG(st.st_mode) || st.st_size <= 0 || (uint64_t)st.st_size > SIZE_MAX) {
        rc = kvf__gguf_fail(err, err_len, KVF_E_MODEL_FORMAT, "%s: not a regular, non-empty file",
                            path);
        goto close_fd;
    }
    size_t size = (size_t)st.st_size;
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
        rc = -errno;
        kvf__gguf_fail(err, err_len, rc, "%s: mmap: %s", path, kvf_strerror(rc));
        goto close_fd;
    }
    kvf_gguf_t *g;
    rc = kvf_gguf_open_mem(map, size, &g, err, err_len);
    if (rc < 0) {
        munmap(map, size);
        goto close_fd;
    }
    g->mapped = true;
    *out = g;
close_fd:
    close(fd);
    return rc;
}

void kvf_gguf_close(kvf_gguf_t *g)
{
    if (!g) return;
    if (g->mapped) munmap((void *)g->base, g->size);
    free_parsed(g);
    free(g);
}

uint32_t kvf_gguf_version(const kvf_gguf_t *g)
{
    return g->version;
}

uint64_t kvf_gguf_n_tensors(const kvf_gguf_t *g)
{
    return g->n_tensors;
}

const struct kvf_gguf_tensor *kvf_gguf_tensor_at(const kvf_gguf_t *g, uint64_t i)
{
    return i < g->n_tensors ? &g->tensors[i] : NULL;
}

const struct kvf_gguf_tensor *kvf_gguf_find_tensor(const kvf_gguf_t *g, const char *name)
{
    if (!g || !name) return NULL;
    uint64_t e = g->t_table[probe(g, g->t_table, g->t_cap, t_name, name, strlen(name))];
    return e ? &g->tensors[e - 1] : NULL;
}

uint64_t kvf_gguf_n_kv(const kvf_gguf_t *g)
{
    return g->n_kv;
}

int kvf_gguf_kv_at(const kvf_gguf_t *g, uint64_t i, const char **key, size_t *key_len,
                   uint32_t *type)
{
    if (i >= g->n_kv) return -ERANGE;
    *key = g->kvs[i].key;
    *key_len = g->kvs[i].key_len;
    *type = g->kvs[i].type;
    return 0;
}

int kvf_gguf_get_type(const kvf_gguf_t *g, const char *key, uint32_t *type)
{
    const struct kv *kv = find_kv(g, key);
    if (!kv) return KVF_E_MODEL_MISSING;
    *type = kv->type;
    return 0;
}

/* An integer of metadata type t at p as sign and magnitude; false if t is not an integer. */
static bool read_int(uint32_t t, const uint8_t *p, bool *neg, uint64_t *mag)
{
    union {
        uint8_t u8;
        int8_t i8;
        uint16_t u16;
        int16_t i16;
        uint32_t u32;
        int32_t i32;
        uint64_t u64;
        int64_t i64;
    } v;
    int64_t s;
    switch (t) {
    case KVF_GGUF_U8:
        memcpy(&v.u8, p, 1);
        *neg = false, *mag = v.u8;
        return true;
    case KVF_GGUF_U16:
        memcpy(&v.u16, p, 2);
        *neg = false, *mag = v.u16;
        return true;
    case KVF_GGUF_U32:
        memcpy(&v.u32, p, 4);
        *neg = false, *mag = v.u32;
        return true;
    case KVF_GGUF_U64:
        memcpy(&v.u64, p, 8);
        *neg = false, *mag = v.u64;
        return true;
    case KVF_GGUF_I8:
        memcpy(&v.i8, p, 1);
        s = v.i8;
        break;
    case KVF_GGUF_I16:
        memcpy(&v.i16, p, 2);
        s = v.i16;
        break;
    case KVF_GGUF_I32:
        memcpy(&v.i32, p, 4);
        s = v.i32;
        break;
    case KVF_GGUF_I64:
        memcpy(&v.i64, p, 8);
        s = v.i64;
        break;
    default:
        return false;
    }
    *neg = s < 0;
    /* The magnitude of INT64_MIN does not fit in int64; compute it in unsigned arithmetic. */
    *mag = s < 0 ? (uint64_t)0 - (uint64_t)s : (uint64_t)s;
    return true;
}

static int int_at(uint32_t t, const uint8_t *p, uint64_t max_pos, uint64_t max_neg, bool *neg,
                  uint64_t *mag)
{
    if (!read_int(t, p, neg, mag)) return KVF_E_MODEL_FORMAT;
    if (*neg ? *mag > max_neg : *mag > max_pos) return KVF_E_MODEL_FORMAT;
    return 0;
}

int kvf_gguf_get_u32(const kvf_gguf_t *g, const char *key, uint32_t *out)
{
    const struct kv *kv = find_kv(g, key);
    bool neg;
    uint64_t mag;
    if (!kv) return KVF_E_MODEL_MISSING;
    if (kv->type == KVF_GGUF_ARRAY || kv->type == KVF_GGUF_STRING) return KVF_E_MODEL_FORMAT;
    int rc = int_at(kv->type, kv->val, UINT32_MAX, 0, &neg, &mag);
    if (rc < 0) return rc;
    *out = (uint32_t)mag;
    return 0;
}

int kvf_gguf_get_u64(const kvf_gguf_t *g, const char *key, uint64_t *out)
{
    const struct kv *kv = find_kv(g, key);
    bool neg;
    uint64_t mag;
    if (!kv) return KVF_E_MODEL_MISSING;
    if (kv->type == KVF_GGUF_ARRAY || kv->type == KVF_GGUF_STRING) return KVF_E_MODEL_FORMAT;
    int rc = int_at(kv->type, kv->val, UINT64_MAX, 0, &neg, &mag);
    if (rc < 0) return rc;
    *out = mag;
    return 0;
}

static int32_t to_i32(bool neg, uint64_t mag)
{
    return neg ? (int32_t)(-(int64_t)mag) : (int32_t)mag;
}

int kvf_gguf_get_i32(const kvf_gguf_t *g, const char *key, int32_t *out)
{
    const struct kv *kv = find_kv(g, key);
    bool neg;
    uint64_t mag;
    if (!kv) return KVF_E_MODEL_MISSING;
    if (kv->type == KVF_GGUF_ARRAY || kv->type == KVF_GGUF_STRING) return KVF_E_MODEL_FORMAT;
    int rc = int_at(kv->type, kv->val, INT32_MAX, (uint64_t)INT32_MAX + 1, &neg, &mag);
    if (rc < 0) return rc;
    *out = to_i32(neg, mag);
    return 0;
}

static bool float_at(uint32_t t, const uint8_t *p, float *out)
{
    if (t == KVF_GGUF_F32) {
        memcpy(out, p, 4);
        return true;
    }
    if (t == KVF_GGUF_F64) {
        double d;
        memcpy(&d, p, 8);
        *out = (float)d;
        return true;
    }
    return false;
}

int kvf_gguf_get_f32(const kvf_gguf_t *g, const char *key, float *out)
{
    const struct kv *kv = find_kv(g, key);
    if (!kv) return KVF_E_MODEL_MISSING;
    return float_at(kv->type, kv->val, out) ? 0 : KVF_E_MODEL_FORMAT;
}

int kvf_gguf_get_bool(const kvf_gguf_t *g, const char *key, bool *out)
{
    const struct kv *kv = find_kv(g, key);
    if (!kv) return KVF_E_MODEL_MISSING;
    if (kv->type != KVF_GGUF_BOOL) return KVF_E_MODEL_FORMAT;
    *out = kv->val[0] != 0;
    return 0;
}

int kvf_gguf_get_str(const kvf_gguf_t *g, const char *key, const char **s, size_t *len)
{
    const struct kv *kv = find_kv(g, key);
    if (!kv) return KVF_E_MODEL_MISSING;
    if (kv->type != KVF_GGUF_STRING) return KVF_E_MODEL_FORMAT;
    *s = (const char *)kv->val;
    *len = (size_t)kv->len;
    return 0;
}

int kvf_gguf_get_arr(const kvf_gguf_t *g, const char *key, uint32_t *elem_type, uint64_t *n)
{
    const struct kv *kv = find_kv(g, key);
    if (!kv) return KVF_E_MODEL_MISSING;
    if (kv->type != KVF_GGUF_ARRAY) return KVF_E_MODEL_FORMAT;
    *elem_type = kv->elem_type;
    *n = kv->len;
    return 0;
}

/* The array `key` with elements of a type accepted by `ok`, and index i in range. */
static int arr_elem(const kvf_gguf_t *g, const char *key, uint64_t i, const struct kv **out)
{
    const struct kv *kv = find_kv(g, key);
    if (!kv) return KVF_E_MODEL_MISSING;
    if (kv->type != KVF_GGUF_ARRAY) return KVF_E_MODEL_FORMAT;
    if (i >= kv->len) return -ERANGE;
    *out = kv;
    return 0;
}

int kvf_gguf_get_arr_str(const kvf_gguf_t *g, const char *key, uint64_t i, const char **s,
                         size_t *len)
{
    const struct kv *kv;
    int rc = arr_elem(g, key, i, &kv);
    if (rc < 0) return rc;
    if (kv->elem_type != KVF_GGUF_STRING) return KVF_E_MODEL_FORMAT;
    const uint8_t *p = kv->val + kv->str_off[i];
    uint64_t n;
    memcpy(&n, p, 8);
    *s = (const char *)p + 8;
    *len = (size_t)n;
    return 0;
}

int kvf_gguf_get_arr_f32(const kvf_gguf_t *g, const char *key, uint64_t i, float *out)
{
    const struct kv *kv;
    int rc = arr_elem(g, key, i, &kv);
    if (rc < 0) return rc;
    size_t sz = scalar_size(kv->elem_type);
    return float_at(kv->elem_type, kv->val + i * sz, out) ? 0 : KVF_E_MODEL_FORMAT;
}

int kvf_gguf_get_arr_i32(const kvf_gguf_t *g, const char *key, uint64_t i, int32_t *out)
{
    const struct kv *kv;
    bool neg;
    uint64_t mag;
    int rc = arr_elem(g, key, i, &kv);
    if (rc < 0) return rc;
    if (kv->elem_type == KVF_GGUF_STRING) return KVF_E_MODEL_FORMAT;
    size_t sz = scalar_size(kv->elem_type);
    rc = int_at(kv->elem_type, kv->val + i * sz, INT32_MAX, (uint64_t)INT32_MAX + 1, &neg, &mag);
    if (rc < 0) return rc;
    *out = to_i32(neg, mag);
    return 0;
}
