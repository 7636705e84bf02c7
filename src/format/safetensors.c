/* safetensors.c - validating zero-copy reader, atomic streaming writer and
 * sharded sets. See safetensors.h for the contract.
 *
 * Reader: the whole file is mapped read-only; every offset from the header is
 * checked against the mapping before a pointer into it is formed, so a
 * malformed file can only produce an error, never an out-of-bounds read.
 * JSON numbers arrive as doubles (cJSON); integers are accepted only when
 * exact (<= 2^53), which is far beyond any real shape or offset. */
#include "format/safetensors.h"
#include "base/base.h"
#include "tensor/dtype.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ST_ALIGN 64
/* Largest integer a double holds exactly: the bound for JSON integers. */
#define ST_MAX_EXACT 9007199254740992.0 /* 2^53 */

struct st_file {
    char *path;
    kb_map map;
    size_t n;
    st_tensor *tensors;         /* header order */
    const st_tensor **by_name;  /* sorted by name, for st_find */
    size_t n_meta;
    const char **meta;          /* key, value pairs, into strings */
    char *strings;              /* one block for all names, keys and values */
};

/* ---- small helpers ---------------------------------------------------------- */

static int st_cmp_tensor_ptr(const void *a, const void *b) {
    const st_tensor *x = *(const st_tensor *const *)a, *y = *(const st_tensor *const *)b;
    return strcmp(x->name, y->name);
}

static int st_cmp_name_key(const void *key, const void *elem) {
    return strcmp((const char *)key, (*(const st_tensor *const *)elem)->name);
}

static int st_cmp_str_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A JSON value that is an exact non-negative integer (cJSON stores doubles). */
static int st_json_uint(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v)) return 0;
    double d = v->valuedouble;
    if (!(d >= 0.0) || d > ST_MAX_EXACT) return 0; /* also rejects NaN */
    uint64_t u = (uint64_t)d;
    if ((double)u != d) return 0; /* fractional */
    *out = u;
    return 1;
}

/* "[2, 3]" into buf (truncated if tiny). */
static const char *st_shape_str(const int64_t *shape, int ndim, char *buf, size_t cap) {
    size_t used = 0;
    int w = snprintf(buf, cap, "[");
    used = w > 0 ? (size_t)w : 0;
    for (int i = 0; i < ndim && used < cap; i++) {
        w = snprintf(buf + used, cap - used, "%s%" PRId64, i ? ", " : "", shape[i]);
        if (w < 0) break;
        used += (size_t)w;
    }
    if (used < cap) snprintf(buf + used, cap - used, "]");
    return buf;
}

/* numel * dtype size with overflow check; 0 on overflow. */
static int st_nbytes_of(const int64_t *shape, int ndim, kiln_dtype dt, size_t *out) {
    size_t n = kiln_dtype_size(dt);
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0 || (uint64_t)shape[i] > SIZE_MAX) return 0;
        if (!kb_mul_ok(n, (size_t)shape[i], &n)) return 0;
    }
    *out = n;
    return 1;
}

int64_t st_numel(const st_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) {
        int64_t d = t->shape[i];
        if (d < 0) return -1;
        if (d && n > INT64_MAX / d) return -1;
        n *= d;
    }
    return n;
}

static int st_is_json_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* ---- reader ------------------------------------------------------------------ */

typedef struct st_range {
    uint64_t begin, end;
    size_t idx;
} st_range;

static int st_cmp_range(const void *a, const void *b) {
    const st_range *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

void st_close(st_file *f) {
    if (!f) return;
    kb_unmap(&f->map);
    free(f->tensors);
    free(f->by_name);
    free(f->meta);
    free(f->strings);
    free(f->path);
    free(f);
}

/* Validate "__metadata__" (an object of strings; null is taken as absent, as
 * the reference implementation does) and count its pairs and string bytes. */
static kiln_status st_check_metadata(const char *path, const cJSON *md, size_t *n_meta,
                                     size_t *bytes) {
    *n_meta = 0;
    if (cJSON_IsNull(md)) return KILN_OK;
    if (!cJSON_IsObject(md))
        return kb_fail(KILN_ERR_FORMAT, "%s: __metadata__ is not a JSON object", path);
    for (const cJSON *e = md->child; e; e = e->next) {
        if (!cJSON_IsString(e) || !e->valuestring)
            return kb_fail(KILN_ERR_FORMAT, "%s: __metadata__ value of '%s' is not a string",
                           path, e->string);
        *bytes += strlen(e->string) + strlen(e->valuestring) + 2;
        (*n_meta)++;
    }
    return KILN_OK;
}

/* Check one header entry and fill t (name and data filled by the caller).
 * data_size: bytes in the data section. */
static kiln_status st_parse_entry(const char *path, const cJSON *e, size_t data_size,
                                  st_tensor *t, st_range *r) {
    const char *name = e->string;
    if (!cJSON_IsObject(e))
        return kb_fail(KILN_ERR_FORMAT, "%s: tensor '%s': entry is not a JSON object", path, name);

    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    if (!cJSON_IsString(dt) || !dt->valuestring)
        return kb_fail(KILN_ERR_FORMAT, "%s: tensor '%s': dtype is missing or not a string", path,
                       name);
    t->dtype = kt_dtype_from_name(dt->valuestring);
    if (t->dtype == KILN_DTYPE_INVALID)
        return kb_fail(KILN_ERR_FORMAT, "%s: tensor '%s': unknown dtype '%.64s'", path, name,
                       dt->valuestring);

    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    if (!cJSON_IsArray(sh))
        return kb_fail(KILN_ERR_FORMAT, "%s: tensor '%s': shape is missing or not an array", path,
                       name);
    int nd = 0;
    for (const cJSON *d = sh->child; d; d = d->next, nd++) {
        uint64_t v;
        if (nd >= KILN_MAX_DIMS)
            return kb_fail(KILN_ERR_FORMAT, "%s: tensor '%s': shape has more than %d dimensions",
                           path, name, KILN_MAX_DIMS);
        if (!st_json_uint(d, &v)) {
            if (cJSON_IsNumber(d))
                return kb_fail(KILN_ERR_FORMAT,
                               "%s: tensor '%s': shape element %d (%.17g) is not a non-negative "
                               "integer",
                               path, name, nd, d->valuedouble);
            return kb_fail(KILN_ERR_FORMAT,
                           "%s: tensor '%s': shape element %d is not a non-negative integer", path,
                           name, nd);
        }
        t->shape[nd] = (int64_t)v;
    }
    t->ndim = nd;

    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    uint64_t b = 0, en = 0;
    if (!cJSON_IsArray(off) || !off->child || !off->child->next || off->child->next->next ||
        !st_json_uint(off->child, &b) || !st_json_uint(off->child->next, &en))
        return kb_fail(KILN_ERR_FORMAT,
                       "%s: tensor '%s': data_offsets must be an array of 2 non-negative integers",
                       path, name);
    if (b > en)
        return kb_fail(KILN_ERR_FORMAT,
                       "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] begin after end",
                       path, name, b, en);

    char shs[256];
    size_t need;
    if (!st_nbytes_of(t->shape, t->ndim, t->dtype, &need))
        return kb_fail(KILN_ERR_FORMAT, "%s: tensor '%s': shape %s of %s overflows the byte count",
                       path, name, st_shape_str(t->shape, t->ndim, shs, sizeof shs),
                       kiln_dtype_name(t->dtype));
    if ((uint64_t)need != en - b)
        return kb_fail(KILN_ERR_FORMAT,
                       "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] hold %" PRIu64
                       " bytes but shape %s of %s needs %zu",
                       path, name, b, en, en - b, st_shape_str(t->shape, t->ndim, shs, sizeof shs),
                       kiln_dtype_name(t->dtype), need);
    if (en > (uint64_t)data_size)
        return kb_fail(KILN_ERR_FORMAT,
                       "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                       "] run past the data section (%zu bytes)",
                       path, name, b, en, data_size);
    t->nbytes = need;
    r->begin = b;
    r->end = en;
    return KILN_OK;
}

/* Duplicate names and overlapping ranges, once every entry is known good. */
static kiln_status st_check_layout(st_file *f, st_range *r) {
    for (size_t i = 0; i < f->n; i++) f->by_name[i] = &f->tensors[i];
    qsort(f->by_name, f->n, sizeof *f->by_name, st_cmp_tensor_ptr);
    for (size_t i = 1; i < f->n; i++)
        if (!strcmp(f->by_name[i - 1]->name, f->by_name[i]->name))
            return kb_fail(KILN_ERR_FORMAT, "%s: tensor '%s' appears twice in the header", f->path,
                           f->by_name[i]->name);

    qsort(r, f->n, sizeof *r, st_cmp_range);
    const st_range *last = NULL; /* the non-empty range reaching furthest so far */
    for (size_t i = 0; i < f->n; i++) {
        if (r[i].begin == r[i].end) continue; /* empty ranges hold no bytes */
        if (last && r[i].begin < last->end)
            return kb_fail(KILN_ERR_FORMAT,
                           "%s: tensors '%s' [%" PRIu64 ", %" PRIu64 "] and '%s' [%" PRIu64
                           ", %" PRIu64 "] overlap",
                           f->path, f->tensors[last->idx].name, last->begin, last->end,
                           f->tensors[r[i].idx].name, r[i].begin, r[i].end);
        if (!last || r[i].end > last->end) last = &r[i];
    }
    return KILN_OK;
}

static kiln_status st_parse_header(st_file *f, const cJSON *root, size_t data_off) {
    const char *path = f->path;
    if (!cJSON_IsObject(root))
        return kb_fail(KILN_ERR_FORMAT, "%s: header is not a JSON object", path);

    /* First pass: count, validate metadata, size the string block. */
    const cJSON *md = NULL;
    size_t n = 0, bytes = 0;
    for (const cJSON *e = root->child; e; e = e->next) {
        if (!strcmp(e->string, "__metadata__")) {
            if (md) return kb_fail(KILN_ERR_FORMAT, "%s: __metadata__ appears twice", path);
            md = e;
            continue;
        }
        n++;
        bytes += strlen(e->string) + 1;
    }
    if (md) {
        kiln_status s = st_check_metadata(path, md, &f->n_meta, &bytes);
        if (s != KILN_OK) return s;
    }

    f->tensors = kb_calloc(n, sizeof *f->tensors);
    f->by_name = kb_calloc(n, sizeof *f->by_name);
    f->meta = kb_calloc(2 * f->n_meta, sizeof *f->meta);
    f->strings = kb_malloc(bytes);
    st_range *r = kb_calloc(n, sizeof *r);
    if (!f->tensors || !f->by_name || !f->meta || !f->strings || !r) {
        free(r);
        return KILN_ERR_NOMEM;
    }

    char *sp = f->strings;
    if (md && f->n_meta) {
        size_t k = 0;
        for (const cJSON *e = md->child; e; e = e->next) {
            size_t lk = strlen(e->string) + 1, lv = strlen(e->valuestring) + 1;
            memcpy(sp, e->string, lk);
            f->meta[k++] = sp;
            sp += lk;
            memcpy(sp, e->valuestring, lv);
            f->meta[k++] = sp;
            sp += lv;
        }
        /* duplicate keys would make st_metadata ambiguous; sort to find them */
        const char **keys = kb_calloc(f->n_meta, sizeof *keys);
        if (!keys) {
            free(r);
            return KILN_ERR_NOMEM;
        }
        for (size_t j = 0; j < f->n_meta; j++) keys[j] = f->meta[2 * j];
        qsort(keys, f->n_meta, sizeof *keys, st_cmp_str_ptr);
        for (size_t j = 1; j < f->n_meta; j++)
            if (!strcmp(keys[j - 1], keys[j])) {
                kiln_status s = kb_fail(KILN_ERR_FORMAT, "%s: __metadata__ key '%s' appears twice",
                                        path, keys[j]);
                free(keys);
                free(r);
                return s;
            }
        free(keys);
    }

    size_t data_size = f->map.size - data_off;
    size_t i = 0;
    for (const cJSON *e = root->child; e; e = e->next) {
        if (e == md) continue;
        st_tensor *t = &f->tensors[i];
        kiln_status s = st_parse_entry(path, e, data_size, t, &r[i]);
        if (s != KILN_OK) {
            free(r);
            return s;
        }
        size_t ln = strlen(e->string) + 1;
        memcpy(sp, e->string, ln);
        t->name = sp;
        sp += ln;
        /* in bounds: begin <= end <= data_size was checked above */
        t->data = f->map.data + data_off + r[i].begin;
        r[i].idx = i;
        i++;
    }
    f->n = n;
    kiln_status s = st_check_layout(f, r);
    free(r);
    return s;
}

/* What a file that is not safetensors looks like, from its first bytes
 * (NULL: it may be one after all, a damaged one: the checks after say how) */
static const char *st_sniff(const uint8_t *d, size_t n) {
    static const struct {
        const char *magic;
        size_t len;
        const char *what;
    } k[] = {{"\x89PNG\r\n\x1a\n", 8, "a PNG image"},
             {"\xff\xd8\xff", 3, "a JPEG image"},
             {"PK\x03\x04", 4, "a zip archive (a PyTorch .bin / .pt checkpoint is one)"},
             {"\x80\x02", 2, "a Python pickle (a PyTorch checkpoint)"},
             {"\x80\x04", 2, "a Python pickle (a PyTorch checkpoint)"},
             {"GGUF", 4, "a GGUF file"},
             {"\x7f" "ELF", 4, "an ELF binary"},
             {"\x1f\x8b", 2, "a gzip archive"}};
    for (size_t i = 0; i < sizeof k / sizeof *k; i++)
        if (n >= k[i].len && !memcmp(d, k[i].magic, k[i].len)) return k[i].what;
    size_t text = 0, look = n < 64 ? n : 64;
    for (size_t i = 0; i < look; i++) text += (d[i] >= 0x20 && d[i] < 0x7f) || d[i] == '\n' || d[i] == '\r' || d[i] == '\t';
    if (look >= 8 && text == look) return look && d[0] == '{' ? "JSON text (a config or an .index.json?)" : "a text file";
    return NULL;
}

kiln_status st_open(const char *path, st_file **out) {
    *out = NULL;
    st_file *f = kb_calloc(1, sizeof *f);
    if (!f) return KILN_ERR_NOMEM;
    f->path = kb_strdup(path);
    if (!f->path) {
        free(f);
        return KILN_ERR_NOMEM;
    }
    kiln_status s = kb_map_file(path, &f->map);
    if (s != KILN_OK) goto fail;

    if (f->map.size < 8) {
        s = kb_fail(KILN_ERR_FORMAT, "%s: file is %zu bytes, too short for a safetensors header",
                    path, f->map.size);
        goto fail;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | f->map.data[i];
    /* a safetensors header is JSON that starts with '{' right after its
     * length: anything else is another kind of file, said as such (never
     * its first bytes read as a number) */
    if (f->map.size < 9 || f->map.data[8] != '{' || hlen > f->map.size - 8) {
        const char *what = st_sniff(f->map.data, f->map.size);
        /* a length no file can have, and no header after it */
        if (!what && (hlen > ST_MAX_HEADER || hlen > f->map.size - 8) && f->map.size >= 9 &&
            !strchr("{ \t\r\n", f->map.data[8]))
            what = "a file of another kind: its first 8 bytes are no header length and no '{' follows them";
        if (what) {
            s = kb_fail(KILN_ERR_FORMAT, "%s is not a safetensors file (it looks like %s); kiln reads safetensors "
                        "checkpoints (8 bytes that give the size of a JSON header, then the header)", path, what);
            goto fail;
        }
    }
    if (hlen > ST_MAX_HEADER) {
        s = kb_fail(KILN_ERR_FORMAT, "%s: header length %" PRIu64 " exceeds the limit of %u bytes",
                    path, hlen, (unsigned)ST_MAX_HEADER);
        goto fail;
    }
    if (hlen > f->map.size - 8) {
        s = kb_fail(KILN_ERR_FORMAT,
                    "%s: header length %" PRIu64 " runs past the end of the file (%zu bytes)", path,
                    hlen, f->map.size);
        goto fail;
    }

    /* The header is not NUL-terminated in the mapping. Parse a terminated copy
     * with an explicit length, so no parser path can run past it. */
    size_t n = (size_t)hlen;
    char *hdr = kb_malloc(n + 1);
    if (!hdr) {
        s = KILN_ERR_NOMEM;
        goto fail;
    }
    memcpy(hdr, f->map.data + 8, n);
    hdr[n] = 0;
    long items = kb_json_values(hdr, n);
    if (items > ST_MAX_HEADER_ITEMS) {
        free(hdr);
        s = kb_fail(KILN_ERR_FORMAT, "%s: its header holds about %ld JSON values; at most %ld (some 300,000 tensors) "
                    "are read", path, items, ST_MAX_HEADER_ITEMS);
        goto fail;
    }
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(hdr, n, &end, 0);
    if (!root) {
        size_t at = (end && end >= hdr && end <= hdr + n) ? (size_t)(end - hdr) : 0;
        free(hdr);
        s = kb_fail(KILN_ERR_FORMAT, "%s: header is not valid JSON (error near byte %zu)", path,
                    at);
        goto fail;
    }
    /* cJSON stops after the first value; only padding may follow it. */
    for (size_t at = end ? (size_t)(end - hdr) : n; at < n; at++) {
        if (!st_is_json_space(hdr[at])) {
            cJSON_Delete(root);
            free(hdr);
            s = kb_fail(KILN_ERR_FORMAT, "%s: header has trailing bytes after the JSON at byte %zu",
                        path, at);
            goto fail;
        }
    }
    s = st_parse_header(f, root, 8 + n);
    cJSON_Delete(root);
    free(hdr);
    if (s != KILN_OK) goto fail;
    *out = f;
    return KILN_OK;
fail:
    st_close(f);
    return s;
}

size_t st_count(const st_file *f) { return f->n; }

const st_tensor *st_at(const st_file *f, size_t i) { return i < f->n ? &f->tensors[i] : NULL; }

const st_tensor *st_find(const st_file *f, const char *name) {
    if (!f->n) return NULL;
    const st_tensor *const *p = bsearch(name, f->by_name, f->n, sizeof *f->by_name, st_cmp_name_key);
    return p ? *p : NULL;
}

const char *st_metadata(const st_file *f, const char *key) {
    for (size_t i = 0; i < f->n_meta; i++)
        if (!strcmp(f->meta[2 * i], key)) return f->meta[2 * i + 1];
    return NULL;
}

const char *st_path(const st_file *f) { return f->path; }

size_t st_file_size(const st_file *f) { return f->map.size; }

/* ---- writer ------------------------------------------------------------------ */

static kiln_status st_write_all(int fd, const void *data, size_t len, const char *tmp) {
    const uint8_t *p = data;
    while (len) {
        /* Linux moves at most ~2 GiB per call; keep chunks modest anyway. */
        size_t chunk = len < ((size_t)1 << 30) ? len : ((size_t)1 << 30);
        ssize_t w = write(fd, p, chunk);
        if (w < 0) {
            if (errno == EINTR) continue;
            return kb_fail(KILN_ERR_IO, "cannot write %s: %s", tmp, strerror(errno));
        }
        if (w == 0) return kb_fail(KILN_ERR_IO, "cannot write %s: no progress", tmp);
        p += w;
        len -= (size_t)w;
    }
    return KILN_OK;
}

static void st_fsync_dir(const char *path) {
    char *dir = kb_dirname(path);
    if (!dir) return;
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    free(dir);
    if (fd >= 0) {
        fsync(fd); /* best effort: the rename itself already happened */
        close(fd);
    }
}

/* Integers go in as raw JSON text: cJSON would print large doubles such as
 * 1e15 in exponent form, which strict readers refuse for integers. */
static cJSON *st_json_int(uint64_t v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%" PRIu64, v);
    return cJSON_CreateRaw(buf);
}

static kiln_status st_check_write_args(const char *path, const st_tensor *tensors, size_t n,
                                       const char *const *meta, size_t n_meta, int need_data) {
    for (size_t i = 0; i < n; i++) {
        const st_tensor *t = &tensors[i];
        if (!t->name)
            return kb_fail(KILN_ERR_INVALID_ARG, "%s: tensor %zu has no name", path, i);
        if (!strcmp(t->name, "__metadata__"))
            return kb_fail(KILN_ERR_INVALID_ARG, "%s: '__metadata__' is not a tensor name", path);
        if (kiln_dtype_size(t->dtype) == 0)
            return kb_fail(KILN_ERR_INVALID_ARG, "%s: tensor '%s': unknown dtype %d", path,
                           t->name, (int)t->dtype);
        if (t->ndim < 0 || t->ndim > KILN_MAX_DIMS)
            return kb_fail(KILN_ERR_INVALID_ARG, "%s: tensor '%s': %d dimensions (0..%d allowed)",
                           path, t->name, t->ndim, KILN_MAX_DIMS);
        char shs[256];
        for (int d = 0; d < t->ndim; d++)
            if (t->shape[d] < 0 || (double)t->shape[d] > ST_MAX_EXACT)
                return kb_fail(KILN_ERR_INVALID_ARG, "%s: tensor '%s': bad shape %s", path,
                               t->name, st_shape_str(t->shape, t->ndim, shs, sizeof shs));
        size_t need;
        if (!st_nbytes_of(t->shape, t->ndim, t->dtype, &need))
            return kb_fail(KILN_ERR_INVALID_ARG,
                           "%s: tensor '%s': shape %s of %s overflows the byte count", path,
                           t->name, st_shape_str(t->shape, t->ndim, shs, sizeof shs),
                           kiln_dtype_name(t->dtype));
        if (need != t->nbytes)
            return kb_fail(KILN_ERR_INVALID_ARG,
                           "%s: tensor '%s': nbytes is %zu but shape %s of %s needs %zu", path,
                           t->name, t->nbytes, st_shape_str(t->shape, t->ndim, shs, sizeof shs),
                           kiln_dtype_name(t->dtype), need);
        if (need && need_data && !t->data)
            return kb_fail(KILN_ERR_INVALID_ARG, "%s: tensor '%s' has no data", path, t->name);
    }
    for (size_t i = 0; i < 2 * n_meta; i++)
        if (!meta[i])
            return kb_fail(KILN_ERR_INVALID_ARG, "%s: metadata pair %zu has a NULL %s", path,
                           i / 2, i % 2 ? "value" : "key");

    /* unique tensor names and metadata keys */
    size_t m = n > n_meta ? n : n_meta;
    const char **names = kb_calloc(m ? m : 1, sizeof *names);
    if (!names) return KILN_ERR_NOMEM;
    kiln_status s = KILN_OK;
    for (size_t i = 0; i < n; i++) names[i] = tensors[i].name;
    qsort(names, n, sizeof *names, st_cmp_str_ptr);
    for (size_t i = 1; i < n && s == KILN_OK; i++)
        if (!strcmp(names[i - 1], names[i]))
            s = kb_fail(KILN_ERR_INVALID_ARG, "%s: tensor '%s' given twice", path, names[i]);
    for (size_t i = 0; i < n_meta; i++) names[i] = meta[2 * i];
    qsort(names, n_meta, sizeof *names, st_cmp_str_ptr);
    for (size_t i = 1; i < n_meta && s == KILN_OK; i++)
        if (!strcmp(names[i - 1], names[i]))
            s = kb_fail(KILN_ERR_INVALID_ARG, "%s: metadata key '%s' given twice", path, names[i]);
    free(names);
    return s;
}

/* The header (8-byte length + JSON + space padding) and each tensor's begin
 * offset in the data section. */
static kiln_status st_build_header(const char *path, const st_tensor *tensors, size_t n,
                                   const char *const *meta, size_t n_meta, uint64_t *begins,
                                   uint8_t **hdr_out, size_t *hdr_len) {
    cJSON *root = cJSON_CreateObject();
    int ok = root != NULL;
    if (ok && n_meta) {
        cJSON *md = cJSON_AddObjectToObject(root, "__metadata__");
        ok = md != NULL;
        for (size_t i = 0; ok && i < n_meta; i++)
            ok = cJSON_AddStringToObject(md, meta[2 * i], meta[2 * i + 1]) != NULL;
    }
    uint64_t pos = 0;
    for (size_t i = 0; ok && i < n; i++) {
        const st_tensor *t = &tensors[i];
        /* back to back from offset 0: the reference implementation rejects
         * files whose ranges leave gaps, so only the data section is aligned */
        uint64_t b = pos;
        if (t->nbytes > UINT64_MAX - b) {
            cJSON_Delete(root);
            return kb_fail(KILN_ERR_INVALID_ARG, "%s: total size overflows", path);
        }
        begins[i] = b;
        pos = b + t->nbytes;
        cJSON *e = cJSON_AddObjectToObject(root, t->name);
        cJSON *sh = e ? cJSON_AddArrayToObject(e, "shape") : NULL;
        cJSON *off = NULL;
        ok = e && cJSON_AddStringToObject(e, "dtype", kiln_dtype_name(t->dtype)) && sh;
        for (int d = 0; ok && d < t->ndim; d++) {
            cJSON *v = st_json_int((uint64_t)t->shape[d]);
            ok = v && cJSON_AddItemToArray(sh, v);
            if (!ok) cJSON_Delete(v);
        }
        if (ok) ok = (off = cJSON_AddArrayToObject(e, "data_offsets")) != NULL;
        for (int k = 0; ok && k < 2; k++) {
            cJSON *v = st_json_int(k ? pos : b);
            ok = v && cJSON_AddItemToArray(off, v);
            if (!ok) cJSON_Delete(v);
        }
    }
    char *json = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!json) return kb_fail(KILN_ERR_NOMEM, "%s: out of memory building the header", path);

    /* Pad with spaces (valid JSON whitespace) so the data section starts on a
     * 64-byte boundary of the file, hence of any page-aligned mapping. */
    size_t jl = strlen(json);
    size_t total = (8 + jl + (ST_ALIGN - 1)) & ~(size_t)(ST_ALIGN - 1);
    uint8_t *h = kb_malloc(total);
    if (!h) {
        cJSON_free(json);
        return KILN_ERR_NOMEM;
    }
    uint64_t N = total - 8;
    for (int i = 0; i < 8; i++) h[i] = (uint8_t)(N >> (8 * i));
    memcpy(h + 8, json, jl);
    memset(h + 8 + jl, ' ', total - 8 - jl);
    cJSON_free(json);
    *hdr_out = h;
    *hdr_len = total;
    return KILN_OK;
}

/* st_write, each tensor's bytes from fill (NULL: from its data) */
static kiln_status st_write_any(const char *path, const st_tensor *tensors, size_t n, const char *const *meta,
                                size_t n_meta, st_fill_fn fill, void *user) {
    if (!path || (n && !tensors) || (n_meta && !meta))
        return kb_fail(KILN_ERR_INVALID_ARG, "st_write: NULL path, tensors or metadata");
    kiln_status s = st_check_write_args(path, tensors, n, meta, n_meta, !fill);
    if (s != KILN_OK) return s;

    uint64_t *begins = kb_calloc(n ? n : 1, sizeof *begins);
    if (!begins) return KILN_ERR_NOMEM;
    uint8_t *hdr = NULL;
    size_t hdr_len = 0;
    s = st_build_header(path, tensors, n, meta, n_meta, begins, &hdr, &hdr_len);
    if (s != KILN_OK) {
        free(begins);
        return s;
    }

    char *tmp = kb_strfmt("%s.tmp.%ld", path, (long)getpid());
    if (!tmp) {
        free(hdr);
        free(begins);
        return KILN_ERR_NOMEM;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        s = kb_fail(KILN_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
        goto out;
    }

    /* Stream: header, then the tensors back to back. */
    s = st_write_all(fd, hdr, hdr_len, tmp);
    for (size_t i = 0; s == KILN_OK && i < n; i++) {
        if (!fill) {
            s = st_write_all(fd, tensors[i].data, tensors[i].nbytes, tmp);
            continue;
        }
        void *buf = kb_malloc(tensors[i].nbytes ? tensors[i].nbytes : 1); /* one tensor's bytes at a time */
        if (!buf) s = kb_fail(KILN_ERR_NOMEM, "%s: out of memory for tensor '%s'", path, tensors[i].name);
        else if (!(s = fill(user, i, buf))) s = st_write_all(fd, buf, tensors[i].nbytes, tmp);
        free(buf);
    }
    if (s == KILN_OK && fsync(fd) != 0)
        s = kb_fail(KILN_ERR_IO, "cannot flush %s: %s", tmp, strerror(errno));
    if (close(fd) != 0 && s == KILN_OK)
        s = kb_fail(KILN_ERR_IO, "cannot close %s: %s", tmp, strerror(errno));
    if (s == KILN_OK && rename(tmp, path) != 0)
        s = kb_fail(KILN_ERR_IO, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
    if (s != KILN_OK) unlink(tmp);
    else st_fsync_dir(path);
out:
    free(tmp);
    free(hdr);
    free(begins);
    return s;
}

kiln_status st_write(const char *path, const st_tensor *tensors, size_t n, const char *const *meta, size_t n_meta) {
    return st_write_any(path, tensors, n, meta, n_meta, NULL, NULL);
}

kiln_status st_write_stream(const char *path, const st_tensor *tensors, size_t n, const char *const *meta,
                            size_t n_meta, st_fill_fn fill, void *user) {
    if (!fill) return kb_fail(KILN_ERR_INVALID_ARG, "st_write_stream: a fill function is required");
    return st_write_any(path, tensors, n, meta, n_meta, fill, user);
}

/* ---- sets ---------------------------------------------------------------------- */

typedef struct st_set_entry {
    const st_tensor *t;
    size_t file;
} st_set_entry;

struct st_set {
    st_file **files;
    size_t nfiles;
    const st_tensor **all;  /* file order, then header order */
    st_set_entry *by_name;  /* sorted by name */
    size_t n;
};

static int st_cmp_entry(const void *a, const void *b) {
    return strcmp(((const st_set_entry *)a)->t->name, ((const st_set_entry *)b)->t->name);
}

static int st_cmp_entry_key(const void *key, const void *elem) {
    return strcmp((const char *)key, ((const st_set_entry *)elem)->t->name);
}

void st_set_close(st_set *s) {
    if (!s) return;
    for (size_t i = 0; i < s->nfiles; i++) st_close(s->files[i]);
    free(s->files);
    free(s->all);
    free(s->by_name);
    free(s);
}

/* Gather every tensor of every file; a name in two files is an error. */
static kiln_status st_set_index(st_set *s, const char *path) {
    size_t n = 0;
    for (size_t i = 0; i < s->nfiles; i++) n += st_count(s->files[i]);
    s->all = kb_calloc(n, sizeof *s->all);
    s->by_name = kb_calloc(n, sizeof *s->by_name);
    if (!s->all || !s->by_name) return KILN_ERR_NOMEM;
    size_t k = 0;
    for (size_t i = 0; i < s->nfiles; i++)
        for (size_t j = 0; j < st_count(s->files[i]); j++, k++) {
            s->all[k] = st_at(s->files[i], j);
            s->by_name[k].t = s->all[k];
            s->by_name[k].file = i;
        }
    s->n = n;
    qsort(s->by_name, n, sizeof *s->by_name, st_cmp_entry);
    for (size_t i = 1; i < n; i++)
        if (!strcmp(s->by_name[i - 1].t->name, s->by_name[i].t->name))
            return kb_fail(KILN_ERR_FORMAT, "%s: tensor '%s' is in both %s and %s", path,
                           s->by_name[i].t->name, st_path(s->files[s->by_name[i - 1].file]),
                           st_path(s->files[s->by_name[i].file]));
    return KILN_OK;
}

static int st_ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

/* A shard an index names is a file beside the index, by a plain name: no
 * '/', not "." or "..", ending in .safetensors, and not a symbolic link
 * that leads out of the index's folder (an index may not open
 * /etc/passwd, nor another user's checkpoint). */
static kiln_status st_check_shard(const char *path, const char *dir, const char *shard) {
    size_t n = strlen(shard);
    if (!n || strchr(shard, '/') || !strcmp(shard, ".") || !strcmp(shard, "..") || n <= 12 ||
        strcmp(shard + n - 12, ".safetensors"))
        return kb_fail(KILN_ERR_FORMAT, "%s: shard \"%.200s\" is not the name of a .safetensors file beside the "
                       "index (a shard is named like model-00001-of-00002.safetensors, in the index's folder)",
                       path, shard);
    char *sp = kb_path_join(dir, shard);
    if (!sp) return KILN_ERR_NOMEM;
    struct stat lsb;
    kiln_status st = KILN_OK;
    if (lstat(sp, &lsb) == 0 && S_ISLNK(lsb.st_mode)) {
        char rd[PATH_MAX], rs[PATH_MAX];
        size_t dl = realpath(dir, rd) ? strlen(rd) : 0;
        if (!dl || !realpath(sp, rs) || strncmp(rs, rd, dl) || rs[dl] != '/' || strchr(rs + dl + 1, '/'))
            st = kb_fail(KILN_ERR_FORMAT, "%s: shard \"%s\" is a symbolic link that leads out of the index's folder; "
                         "refused", path, shard);
    }
    free(sp);
    return st;
}

#define ST_INDEX_MAX (64u << 20) /* bytes of an index: a weight map of a few thousand names is ~1 MB */

/* Open the shards of an index; the weight map is checked against them. */
static kiln_status st_set_open_index(st_set *s, const char *path) {
    char *txt = NULL;
    size_t len = 0;
    struct stat isb;
    if (stat(path, &isb) == 0 && (uint64_t)isb.st_size > ST_INDEX_MAX)
        return kb_fail(KILN_ERR_FORMAT, "%s: %lld bytes; an index is at most %u", path, (long long)isb.st_size,
                       (unsigned)ST_INDEX_MAX);
    kiln_status st = kb_read_file(path, &txt, &len);
    if (st != KILN_OK) return st;
    cJSON *root = cJSON_ParseWithLength(txt, len);
    free(txt);
    if (!root) return kb_fail(KILN_ERR_FORMAT, "%s: not valid JSON", path);

    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    const char **shards = NULL, **names = NULL;
    char *dir = NULL;
    size_t nw = 0, ns = 0;
    if (!cJSON_IsObject(root) || !cJSON_IsObject(wm)) {
        st = kb_fail(KILN_ERR_FORMAT, "%s: no \"weight_map\" object", path);
        goto out;
    }
    for (const cJSON *e = wm->child; e; e = e->next, nw++)
        if (!cJSON_IsString(e) || !e->valuestring) {
            st = kb_fail(KILN_ERR_FORMAT, "%s: weight_map entry '%s' is not a string", path,
                         e->string);
            goto out;
        }

    /* distinct shard names, sorted: files open in a stable order, once each */
    shards = kb_calloc(nw ? nw : 1, sizeof *shards);
    names = kb_calloc(nw ? nw : 1, sizeof *names);
    dir = kb_dirname(path);
    if (!shards || !names || !dir) {
        st = KILN_ERR_NOMEM;
        goto out;
    }
    size_t k = 0;
    for (const cJSON *e = wm->child; e; e = e->next, k++) {
        shards[k] = e->valuestring;
        names[k] = e->string;
    }
    qsort(names, nw, sizeof *names, st_cmp_str_ptr);
    for (size_t i = 1; i < nw; i++)
        if (!strcmp(names[i - 1], names[i])) {
            st = kb_fail(KILN_ERR_FORMAT, "%s: tensor '%s' appears twice in the weight map", path,
                         names[i]);
            goto out;
        }
    qsort(shards, nw, sizeof *shards, st_cmp_str_ptr);
    for (size_t i = 0; i < nw; i++)
        if (!ns || strcmp(shards[ns - 1], shards[i])) shards[ns++] = shards[i];
    for (size_t i = 0; i < ns; i++) /* every name before any file opens */
        if ((st = st_check_shard(path, dir, shards[i]))) goto out;

    s->files = kb_calloc(ns ? ns : 1, sizeof *s->files);
    if (!s->files) {
        st = KILN_ERR_NOMEM;
        goto out;
    }
    for (size_t i = 0; i < ns; i++) {
        char *sp = kb_path_join(dir, shards[i]);
        if (!sp) {
            st = KILN_ERR_NOMEM;
            goto out;
        }
        st = st_open(sp, &s->files[i]);
        free(sp);
        if (st != KILN_OK) {
            kb_wrap(st, "%s", path);
            goto out;
        }
        s->nfiles = i + 1;
    }

    /* every weight-map name must be in the shard it names */
    char list[1024];
    size_t used = 0, missing = 0;
    list[0] = 0;
    for (const cJSON *e = wm->child; e; e = e->next) {
        const char **sh = bsearch(&e->valuestring, shards, ns, sizeof *shards, st_cmp_str_ptr);
        if (sh && st_find(s->files[sh - shards], e->string)) continue;
        if (missing++ < 8 && used < sizeof list) {
            int w = snprintf(list + used, sizeof list - used, "%s'%s' (%s)", used ? ", " : "",
                             e->string, e->valuestring);
            if (w > 0) used += (size_t)w;
        } else if (missing == 9 && used < sizeof list) {
            snprintf(list + used, sizeof list - used, ", ...");
            used = sizeof list;
        }
    }
    if (missing) {
        st = kb_fail(KILN_ERR_MISSING,
                     "%s: %zu tensor%s named in the weight map missing from %s shard: %s", path,
                     missing, missing == 1 ? " is" : "s are", missing == 1 ? "its" : "their",
                     list);
        goto out;
    }
    st = st_set_index(s, path);
out:
    free(shards);
    free(names);
    free(dir);
    cJSON_Delete(root);
    return st;
}

kiln_status st_set_open(const char *path, st_set **out) {
    *out = NULL;
    st_set *s = kb_calloc(1, sizeof *s);
    if (!s) return KILN_ERR_NOMEM;
    kiln_status st;
    if (st_ends_with(path, ".json")) {
        st = st_set_open_index(s, path);
    } else {
        s->files = kb_calloc(1, sizeof *s->files);
        st = s->files ? st_open(path, &s->files[0]) : KILN_ERR_NOMEM;
        if (st == KILN_OK) {
            s->nfiles = 1;
            st = st_set_index(s, path);
        }
    }
    if (st != KILN_OK) {
        st_set_close(s);
        return st;
    }
    *out = s;
    return KILN_OK;
}

size_t st_set_count(const st_set *s) { return s->n; }

const st_tensor *st_set_at(const st_set *s, size_t i) { return i < s->n ? s->all[i] : NULL; }

const st_tensor *st_set_find(const st_set *s, const char *name) {
    if (!s->n) return NULL;
    const st_set_entry *e = bsearch(name, s->by_name, s->n, sizeof *s->by_name, st_cmp_entry_key);
    return e ? e->t : NULL;
}

size_t st_set_nfiles(const st_set *s) { return s->nfiles; }

const st_file *st_set_file(const st_set *s, size_t i) { return i < s->nfiles ? s->files[i] : NULL; }

int64_t st_set_bytes(const st_set *s) {
    int64_t b = 0;
    for (size_t i = 0; i < s->nfiles; i++) b += (int64_t)st_file_size(s->files[i]);
    return b;
}
