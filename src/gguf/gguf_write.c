/* The GGUF writer: key/values are serialized into one growing buffer as they are added (so
 * write is a copy of it), tensors are described up front and their data streamed at write
 * time, row by row when a callback produces it. Output is GGUF version 3, little endian. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf_internal.h"
#include "kvfence/common.h"
#include "kvfence/gguf.h"

#define GGUF_MAGIC 0x46554747u

struct wtensor {
    char *name;
    uint32_t type, n_dims;
    uint64_t ne[KVF_GGUF_MAX_DIMS];
    uint64_t row_bytes, n_rows, n_bytes;
    const void *data; /* borrowed, or NULL when fn produces the rows */
    kvf_gguf_row_fn fn;
    void *fn_ctx;
};

struct kvf_gguf_writer {
    uint32_t alignment;
    uint8_t *meta; /* the serialized key/values */
    size_t meta_len, meta_cap;
    uint64_t n_kv;
    char **keys; /* [n_kv], to refuse duplicates */
    struct wtensor *tensors;
    uint64_t n_tensors;
    size_t tensors_cap;
};

/* Appends n bytes to the metadata buffer; on failure nothing changes. */
static int put(kvf_gguf_writer_t *w, const void *p, size_t n)
{
    if (n > SIZE_MAX - w->meta_len) return -ENOMEM;
    if (w->meta_len + n > w->meta_cap) {
        size_t cap = w->meta_cap ? w->meta_cap : 4096;
        while (cap < w->meta_len + n) {
            if (cap > SIZE_MAX / 2) return -ENOMEM;
            cap *= 2;
        }
        uint8_t *m = realloc(w->meta, cap);
        if (!m) return -ENOMEM;
        w->meta = m;
        w->meta_cap = cap;
    }
    memcpy(w->meta + w->meta_len, p, n);
    w->meta_len += n;
    return 0;
}

static int put_u32(kvf_gguf_writer_t *w, uint32_t v)
{
    return put(w, &v, 4);
}

static int put_u64(kvf_gguf_writer_t *w, uint64_t v)
{
    return put(w, &v, 8);
}

static int put_str(kvf_gguf_writer_t *w, const char *s, size_t n)
{
    int rc = put_u64(w, n);
    return rc < 0 ? rc : put(w, s, n);
}

/* Starts a key/value: checks the key, records it and writes it with its type. The caller then
 * appends the value; if that fails, end_kv() rolls the buffer back to `mark`. */
static int begin_kv(kvf_gguf_writer_t *w, const char *key, uint32_t type, size_t *mark)
{
    if (!w || !key || !key[0]) return -EINVAL;
    for (uint64_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->keys[i], key) == 0) return -EEXIST;
    *mark = w->meta_len;
    int rc = put_str(w, key, strlen(key));
    if (rc == 0) rc = put_u32(w, type);
    if (rc < 0) w->meta_len = *mark;
    return rc;
}

static int end_kv(kvf_gguf_writer_t *w, const char *key, size_t mark, int rc)
{
    char *copy = NULL, **keys = NULL;
    if (rc == 0) {
        copy = strdup(key);
        keys = copy ? realloc(w->keys, (size_t)(w->n_kv + 1) * sizeof *keys) : NULL;
        if (!keys) rc = -ENOMEM;
    }
    if (rc < 0) {
        free(copy);
        w->meta_len = mark;
        return rc;
    }
    w->keys = keys;
    w->keys[w->n_kv++] = copy;
    return 0;
}

static int add_scalar(kvf_gguf_writer_t *w, const char *key, uint32_t type, const void *v, size_t n)
{
    size_t mark;
    int rc = begin_kv(w, key, type, &mark);
    if (rc < 0) return rc;
    return end_kv(w, key, mark, put(w, v, n));
}

int kvf_gguf_writer_add_u32(kvf_gguf_writer_t *w, const char *key, uint32_t v)
{
    return add_scalar(w, key, KVF_GGUF_U32, &v, 4);
}

int kvf_gguf_writer_add_i32(kvf_gguf_writer_t *w, const char *key, int32_t v)
{
    return add_scalar(w, key, KVF_GGUF_I32, &v, 4);
}

int kvf_gguf_writer_add_u64(kvf_gguf_writer_t *w, const char *key, uint64_t v)
{
    return add_scalar(w, key, KVF_GGUF_U64, &v, 8);
}

int kvf_gguf_writer_add_f32(kvf_gguf_writer_t *w, const char *key, float v)
{
    return add_scalar(w, key, KVF_GGUF_F32, &v, 4);
}

int kvf_gguf_writer_add_bool(kvf_gguf_writer_t *w, const char *key, bool v)
{
    uint8_t b = v ? 1 : 0;
    return add_scalar(w, key, KVF_GGUF_BOOL, &b, 1);
}

int kvf_gguf_writer_add_str(kvf_gguf_writer_t *w, const char *key, const char *s, size_t len)
{
    if (!s && len) return -EINVAL;
    size_t mark;
    int rc = begin_kv(w, key, KVF_GGUF_STRING, &mark);
    if (rc < 0) return rc;
    return end_kv(w, key, mark, put_str(w, s ? s : "", len));
}

static int add_array(kvf_gguf_writer_t *w, const char *key, uint32_t elem_type, const void *v,
                     size_t elem_size, uint64_t n)
{
    if ((!v && n) || n > SIZE_MAX / elem_size) return -EINVAL;
    size_t mark;
    int rc = begin_kv(w, key, KVF_GGUF_ARRAY, &mark);
    if (rc < 0) return rc;
    rc = put_u32(w, elem_type);
    if (rc == 0) rc = put_u64(w, n);
    if (rc == 0 && n) rc = put(w, v, (size_t)n * elem_size);
    return end_kv(w, key, mark, rc);
}

int kvf_gguf_writer_add_arr_f32(kvf_gguf_writer_t *w, const char *key, const float *v, uint64_t n)
{
    return add_array(w, key, KVF_GGUF_F32, v, sizeof *v, n);
}

int kvf_gguf_writer_add_arr_i32(kvf_gguf_writer_t *w, const char *key, const int32_t *v, uint64_t n)
{
    return add_array(w, key, KVF_GGUF_I32, v, sizeof *v, n);
}

int kvf_gguf_writer_add_arr_str(kvf_gguf_writer_t *w, const char *key, const char *const *strs,
                                const size_t *lens, uint64_t n)
{
    if (!strs && n) return -EINVAL;
    size_t mark;
    int rc = begin_kv(w, key, KVF_GGUF_ARRAY, &mark);
    if (rc < 0) return rc;
    rc = put_u32(w, KVF_GGUF_STRING);
    if (rc == 0) rc = put_u64(w, n);
    for (uint64_t i = 0; rc == 0 && i < n; i++) {
        if (!strs[i]) {
            rc = -EINVAL;
            break;
        }
        rc = put_str(w, strs[i], lens ? lens[i] : strlen(strs[i]));
    }
    return end_kv(w, key, mark, rc);
}

int kvf_gguf_writer_create(uint32_t alignment, kvf_gguf_writer_t **out)
{
    if (!out) return -EINVAL;
    if (alignment == 0) alignment = KVF_GGUF_DEFAULT_ALIGNMENT;
    if ((alignment & (alignment - 1)) != 0) return -EINVAL;
    kvf_gguf_writer_t *w = calloc(1, sizeof *w);
    if (!w) return -ENOMEM;
    w->alignment = alignment;
    if (alignment != KVF_GGUF_DEFAULT_ALIGNMENT) {
        int rc = kvf_gguf_writer_add_u32(w, "general.alignment", alignment);
        if (rc < 0) {
            kvf_gguf_writer_destroy(w);
            return rc;
        }
    }
    *out = w;
    return 0;
}

void kvf_gguf_writer_destroy(kvf_gguf_writer_t *w)
{
    if (!w) return;
    for (uint64_t i = 0; i < w->n_kv; i++)
        free(w->keys[i]);
    for (uint64_t i = 0; i < w->n_tensors; i++)
        free(w->tensors[i].name);
    free(w->keys);
    free(w->tensors);
    free(w->meta);
    free(w);
}

int kvf_gguf_writer_add_tensor(kvf_gguf_writer_t *w, const char *name, uint32_t type,
                               uint32_t n_dims, const uint64_t *ne, const void *data,
                               kvf_gguf_row_fn fn, void *fn_ctx)
{
    if (!w || !name || !name[0] || strlen(name) > 255 || !ne || n_dims == 0 ||
        n_dims > KVF_GGUF_MAX_DIMS || (data == NULL) == (fn == NULL))
        return -EINVAL;
    for (uint64_t i = 0; i < w->n_tensors; i++)
        if (strcmp(w->tensors[i].name, name) == 0) return -EEXIST;
    struct wtensor t = {.type = type, .n_dims = n_dims, .data = data, .fn = fn, .fn_ctx = fn_ctx};
    uint64_t rows = 1;
    for (uint32_t d = 0; d < KVF_GGUF_MAX_DIMS; d++) {
        t.ne[d] = d < n_dims ? ne[d] : 1;
        if (t.ne[d] == 0 || t.ne[d] > (uint64_t)INT64_MAX / rows) return -EINVAL;
        if (d > 0) rows *= t.ne[d];
    }
    int rc = kvf_quant_row_bytes(type, t.ne[0], &t.row_bytes);
    if (rc < 0) return rc;
    if (t.row_bytes > SIZE_MAX || rows > UINT64_MAX / t.row_bytes) return -EOVERFLOW;
    t.n_rows = rows;
    t.n_bytes = rows * t.row_bytes;
    if (w->n_tensors == w->tensors_cap) {
        size_t cap = w->tensors_cap ? w->tensors_cap * 2 : 64;
        struct wtensor *ts = realloc(w->tensors, cap * sizeof *ts);
        if (!ts) return -ENOMEM;
        w->tensors = ts;
        w->tensors_cap = cap;
    }
    if (!(t.name = strdup(name))) return -ENOMEM;
    w->tensors[w->n_tensors++] = t;
    return 0;
}

static uint64_t align_up(uint64_t x, uint32_t a)
{
    return (x + a - 1) / a * a;
}

static int wr(FILE *f, const void *p, size_t n)
{
    if (n == 0) return 0; /* p may be NULL then (an empty metadata buffer) */
    return fwrite(p, 1, n, f) == n ? 0 : -EIO;
}

static int pad(FILE *f, uint64_t from, uint64_t to)
{
    static const uint8_t zeros[256];
    while (from < to) {
        size_t n = to - from < sizeof zeros ? (size_t)(to - from) : sizeof zeros;
        if (wr(f, zeros, n) < 0) return -EIO;
        from += n;
    }
    return 0;
}

/* Writes the whole file to f; returns 0 or a negative code with err filled in. */
static int write_all(kvf_gguf_writer_t *w, FILE *f, char *err, size_t err_len)
{
    uint32_t head32[2] = {GGUF_MAGIC, 3};
    uint64_t counts[2] = {w->n_tensors, w->n_kv};
    uint64_t pos = sizeof head32 + sizeof counts + w->meta_len;
    int rc = wr(f, head32, sizeof head32);
    if (rc == 0) rc = wr(f, counts, sizeof counts);
    if (rc == 0) rc = wr(f, w->meta, w->meta_len);
    /* Tensor descriptions, with offsets laid out at the alignment. */
    uint64_t off = 0;
    for (uint64_t i = 0; rc == 0 && i < w->n_tensors; i++) {
        const struct wtensor *t = &w->tensors[i];
        uint64_t len = strlen(t->name);
        rc = wr(f, &len, 8);
        if (rc == 0) rc = wr(f, t->name, (size_t)len);
        if (rc == 0) rc = wr(f, &t->n_dims, 4);
        if (rc == 0) rc = wr(f, t->ne, 8 * (size_t)t->n_dims);
        if (rc == 0) rc = wr(f, &t->type, 4);
        if (rc == 0) rc = wr(f, &off, 8);
        pos += 8 + len + 4 + 8 * t->n_dims + 4 + 8;
        off = align_up(off + t->n_bytes, w->alignment);
    }
    if (rc < 0) return kvf__gguf_fail(err, err_len, rc, "write failed");
    uint64_t data = align_up(pos, w->alignment);
    if ((rc = pad(f, pos, data)) < 0) return kvf__gguf_fail(err, err_len, rc, "write failed");
    /* Data, tensor by tensor; memory is one row at a time. Every tensor, the last included, is
     * padded to the alignment, as some readers expect the data section to be whole blocks. */
    off = 0;
    void *row = NULL;
    size_t row_cap = 0;
    for (uint64_t i = 0; rc == 0 && i < w->n_tensors; i++) {
        const struct wtensor *t = &w->tensors[i];
        if (t->data) {
            rc = wr(f, t->data, (size_t)t->n_bytes);
        } else {
            if (t->row_bytes > row_cap) {
                void *r = realloc(row, (size_t)t->row_bytes);
                if (!r) {
                    rc = kvf__gguf_fail(err, err_len, -ENOMEM, "out of memory");
                    break;
                }
                row = r;
                row_cap = (size_t)t->row_bytes;
            }
            for (uint64_t r = 0; rc == 0 && r < t->n_rows; r++) {
                rc = t->fn(t->fn_ctx, r, row, (size_t)t->row_bytes);
                if (rc < 0) {
                    kvf__gguf_fail(err, err_len, rc, "tensor '%s' row %llu: %s", t->name,
                                   (unsigned long long)r, kvf_strerror(rc));
                    break;
                }
                rc = wr(f, row, (size_t)t->row_bytes);
            }
        }
        uint64_t end = off + t->n_bytes;
        off = align_up(end, w->alignment);
        if (rc == 0) rc = pad(f, end, off);
    }
    free(row);
    if (rc < 0 && err && err_len && !err[0]) kvf__gguf_fail(err, err_len, rc, "write failed");
    return rc;
}

int kvf_gguf_writer_write(kvf_gguf_writer_t *w, const char *path, char *err, size_t err_len)
{
    if (err && err_len) err[0] = '\0';
    if (!w || !path) return kvf__gguf_fail(err, err_len, -EINVAL, "invalid argument");
    size_t n = strlen(path);
    char *tmp = malloc(n + 5);
    if (!tmp) return kvf__gguf_fail(err, err_len, -ENOMEM, "out of memory");
    memcpy(tmp, path, n);
    memcpy(tmp + n, ".tmp", 5);
    int rc = 0;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (!f) {
        rc = -errno;
        if (fd >= 0) close(fd);
        kvf__gguf_fail(err, err_len, rc, "%s: %s", tmp, kvf_strerror(rc));
        goto free_tmp;
    }
    /* A large buffer: the data is written in rows of a few KiB. */
    setvbuf(f, NULL, _IOFBF, 1 << 20);
    rc = write_all(w, f, err, err_len);
    if (fclose(f) != 0 && rc == 0) {
        rc = -EIO;
        kvf__gguf_fail(err, err_len, rc, "%s: write failed", tmp);
    }
    if (rc == 0 && rename(tmp, path) != 0) {
        rc = -errno;
        kvf__gguf_fail(err, err_len, rc, "rename to %s: %s", path, kvf_strerror(rc));
    }
    if (rc < 0) unlink(tmp);
free_tmp:
    free(tmp);
    return rc;
}
