/* key.c - cache keys and the content hash of a source. */
#include "cache/cache.h"
#include "format/safetensors.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

uint64_t kcache_hash_bytes(const void *p, size_t n, uint64_t seed) { return XXH3_64bits_withSeed(p, n, seed); }

void kcache_parallel_id(const kiln_parallel *p, char *buf, size_t cap) {
    const struct {
        const char *tag;
        kiln_par_dim d;
    } f[3] = {{"CP", p->cfg}, {"TP", p->tp}, {"SP", p->sp}};
    size_t len = 0;
    buf[0] = 0;
    for (int i = 0; i < 3; i++)
        if (f[i].d.factor > 1 && len < cap) {
            snprintf(buf + len, cap - len, "%s%d_%d_", f[i].tag, f[i].d.factor, f[i].d.axis);
            len = strlen(buf);
        }
}

static int safe_name(const char *s) {
    if (!s || !*s || s[0] == '.' || strlen(s) > 100) return 0;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && *s != '-' && *s != '_' && *s != '.') return 0;
    return 1;
}

static void lower(char *s) {
    for (; *s; s++) *s = (char)tolower((unsigned char)*s);
}

kiln_status kcache_key_make(const char *root, const kcache_key_inputs *in, kcache_key *k) {
    memset(k, 0, sizeof *k);
    if (!root || !*root) return kb_fail(KILN_ERR_INVALID_ARG, "cache root is empty");
    if (in->model && strlen(in->model) > 100) /* safe_name's length limit: say so, not "characters" */
        return kb_fail(KILN_ERR_INVALID_ARG,
                       "model name \"%.40s...\" is %zu characters long; a cache folder name has at most 100 "
                       "(give a shorter --name)", in->model, strlen(in->model));
    if (!safe_name(in->model))
        return kb_fail(KILN_ERR_INVALID_ARG,
                       "model name \"%s\" cannot name a cache folder (letters, digits, '-', '_', '.'; "
                       "not starting with '.')", in->model ? in->model : "");
    if (!safe_name(in->component))
        return kb_fail(KILN_ERR_INVALID_ARG, "component \"%s\" cannot name a cache folder",
                       in->component ? in->component : "");
    if (in->layout && *in->layout && !safe_name(in->layout) )
        return kb_fail(KILN_ERR_INVALID_ARG, "layout \"%s\" cannot name a cache folder", in->layout);
    if (in->quant && *in->quant && !safe_name(in->quant))
        return kb_fail(KILN_ERR_INVALID_ARG, "quantization tag \"%s\" cannot name a cache folder", in->quant);
    if (in->mesh_rows < 1 || in->mesh_cols < 1 || in->mesh_rows > 4096 || in->mesh_cols > 4096)
        return kb_fail(KILN_ERR_INVALID_ARG, "mesh %dx%d: rows and columns must be at least 1",
                       in->mesh_rows, in->mesh_cols);
    const kiln_par_dim *dims[3] = {&in->parallel.cfg, &in->parallel.tp, &in->parallel.sp};
    const char *names[3] = {"cfg", "tensor", "sequence"};
    for (int i = 0; i < 3; i++) {
        int axis_len = dims[i]->axis == 0 ? in->mesh_rows : in->mesh_cols;
        if (dims[i]->factor < 1 || dims[i]->axis < 0 || dims[i]->axis > 1)
            return kb_fail(KILN_ERR_INVALID_ARG, "%s parallel: factor %d on axis %d (factor >= 1, axis 0 or 1)",
                           names[i], dims[i]->factor, dims[i]->axis);
        if (dims[i]->factor > 1 && axis_len % dims[i]->factor)
            return kb_fail(KILN_ERR_INVALID_ARG,
                           "%s parallel factor %d does not divide mesh axis %d of size %d", names[i],
                           dims[i]->factor, dims[i]->axis, axis_len);
    }
    if (in->host_coords &&
        (in->host_r0 < 0 || in->host_r1 < in->host_r0 || in->host_r1 >= in->mesh_rows ||
         in->host_c0 < 0 || in->host_c1 < in->host_c0 || in->host_c1 >= in->mesh_cols))
        return kb_fail(KILN_ERR_INVALID_ARG, "host coordinates rows %d-%d, columns %d-%d lie outside the %dx%d mesh",
                       in->host_r0, in->host_r1, in->host_c0, in->host_c1, in->mesh_rows, in->mesh_cols);

    char par[96], dtype[16];
    kcache_parallel_id(&in->parallel, par, sizeof par);
    snprintf(dtype, sizeof dtype, "%s", kiln_dtype_name(in->dtype));
    lower(dtype);
    /* content: the source's identity, kiln's cache format and the layout version */
    uint64_t parts[3] = {in->source_hash, KCACHE_FORMAT_VERSION, (uint64_t)in->layout_version};
    uint64_t content = kcache_hash_bytes(parts, sizeof parts, 0x6b696c6e);
    snprintf(k->content, sizeof k->content, "%012llx", (unsigned long long)(content >> 16));
    int q = in->quant && *in->quant;
    snprintf(k->prefix, sizeof k->prefix, "%smesh%dx%d_%s%s%s%s%s%s", par, in->mesh_rows, in->mesh_cols,
             dtype, in->fsdp ? "_FSDP" : "", in->layout && *in->layout ? "_" : "",
             in->layout ? in->layout : "", q ? "_q-" : "", q ? in->quant : "");
    snprintf(k->name, sizeof k->name, "%s_c%s", k->prefix, k->content);
    size_t rl = strlen(root);
    while (rl > 1 && root[rl - 1] == '/') rl--;
    if ((size_t)snprintf(k->group, sizeof k->group, "%.*s/%s/%s", (int)rl, root, in->model, in->component) >=
        sizeof k->group)
        return kb_fail(KILN_ERR_INVALID_ARG, "cache root path is too long");
    snprintf(k->dir, sizeof k->dir, "%s/%s", k->group, k->name);
    if (in->shard && *in->shard && !safe_name(in->shard))
        return kb_fail(KILN_ERR_INVALID_ARG, "shard \"%s\" cannot name a cache folder", in->shard);
    if (in->host_coords)
        snprintf(k->path, sizeof k->path, "%s/host_coords_r%d-%d_c%d-%d", k->dir, in->host_r0, in->host_r1,
                 in->host_c0, in->host_c1);
    else
        snprintf(k->path, sizeof k->path, "%s", k->dir);
    if (in->shard && *in->shard) {
        size_t l = strlen(k->path);
        snprintf(k->path + l, sizeof k->path - l, "/shard_%s", in->shard);
    }
    return KILN_OK;
}

/* ---- source identity --------------------------------------------------------- */

typedef struct {
    XXH3_state_t *st;
} hasher;

static void hash_u64(hasher *h, uint64_t v) { XXH3_64bits_update(h->st, &v, sizeof v); }

/* name, size, mtime, and the header bytes (config/index whole, safetensors
 * length prefix + JSON header) of one file */
static kiln_status hash_file(hasher *h, const char *path) {
    struct stat st;
    /* regular files only, opened without blocking: a FIFO named config.json
     * fails here at once instead of hanging the load */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return kb_fail(KILN_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return kb_fail(KILN_ERR_IO, "%s is not a regular file (a checkpoint's files and its config must be)", path);
    }
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    XXH3_64bits_update(h->st, base, strlen(base) + 1);
    hash_u64(h, (uint64_t)st.st_size);
    hash_u64(h, (uint64_t)st.st_mtim.tv_sec);
    hash_u64(h, (uint64_t)st.st_mtim.tv_nsec);
    size_t len = strlen(path);
    int is_st = len > 12 && !strcmp(path + len - 12, ".safetensors");
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return kb_fail(KILN_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    }
    size_t want = (size_t)st.st_size;
    if (is_st) {
        uint8_t n8[8];
        uint64_t n = 0;
        if (fread(n8, 1, 8, f) == 8)
            for (int i = 7; i >= 0; i--) n = n << 8 | n8[i];
        want = n <= ST_MAX_HEADER ? (size_t)n : 0;
        XXH3_64bits_update(h->st, n8, 8);
    } else if (want > (64u << 20)) {
        want = 64u << 20;
    }
    uint8_t buf[65536];
    while (want) {
        size_t got = fread(buf, 1, want < sizeof buf ? want : sizeof buf, f);
        if (!got) break;
        XXH3_64bits_update(h->st, buf, got);
        want -= got;
    }
    fclose(f);
    return KILN_OK;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

kiln_status kcache_source_hash_path(const char *path, const char *config_path, uint64_t *out) {
    struct stat pst;
    if (stat(path, &pst) == 0 && !S_ISDIR(pst.st_mode) && !S_ISREG(pst.st_mode))
        return kb_fail(KILN_ERR_IO, "%s is not a regular file or a folder", path);
    if (!kb_is_dir(path) && !kb_is_file(path)) return kb_fail(KILN_ERR_IO, "%s: no such file or folder", path);
    hasher h = {XXH3_createState()};
    if (!h.st) return kb_fail(KILN_ERR_NOMEM, "out of memory");
    XXH3_64bits_reset(h.st);
    kiln_status s = KILN_OK;
    if (kb_is_dir(path)) {
        /* every json and safetensors file of the folder, in name order */
        DIR *d = opendir(path);
        if (!d) {
            XXH3_freeState(h.st);
            return kb_fail(KILN_ERR_IO, "cannot list %s", path);
        }
        char **names = NULL;
        size_t n = 0, cap = 0;
        struct dirent *e;
        while ((e = readdir(d))) {
            size_t l = strlen(e->d_name);
            if (!((l > 5 && !strcmp(e->d_name + l - 5, ".json")) ||
                  (l > 12 && !strcmp(e->d_name + l - 12, ".safetensors"))))
                continue;
            if (n == cap) {
                cap = cap ? cap * 2 : 16;
                char **nn = realloc(names, cap * sizeof *nn);
                if (!nn) break;
                names = nn;
            }
            names[n++] = kb_strdup(e->d_name);
        }
        closedir(d);
        if (n) qsort(names, n, sizeof *names, cmp_str);
        for (size_t i = 0; i < n; i++) {
            char *p = names[i] ? kb_path_join(path, names[i]) : NULL;
            if (!s) s = p ? hash_file(&h, p) : KILN_ERR_NOMEM;
            free(p);
            free(names[i]);
        }
        free(names);
    } else {
        s = hash_file(&h, path);
    }
    if (!s && config_path) s = hash_file(&h, config_path);
    *out = XXH3_64bits_digest(h.st);
    XXH3_freeState(h.st);
    return s;
}
