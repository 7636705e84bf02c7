/* store.c - one cache entry on disk: publish atomically, open with checks,
 * lock, and remove. */
#define _GNU_SOURCE
#include "cache/cache.h"
#include "tensor/dtype.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#define MANIFEST_MAGIC "kiln-cache"

/* ---- helpers ------------------------------------------------------------------ */

static kiln_status write_all(int fd, const void *p, size_t n, const char *path) {
    const uint8_t *b = p;
    while (n) {
        ssize_t w = write(fd, b, n > (1u << 30) ? (1u << 30) : n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return kb_fail(KILN_ERR_IO, "cannot write %s: %s", path, strerror(errno));
        }
        b += w;
        n -= (size_t)w;
    }
    return KILN_OK;
}

static void fsync_path(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

static int rm_rf(const char *dir) { return kb_remove_tree(dir) ? -1 : 0; }

kiln_status kcache_remove(const char *dir) { return kb_remove_dir(dir); }

/* ---- publish -------------------------------------------------------------------- */

static cJSON *json_u64(uint64_t v) { return cJSON_CreateNumber((double)v); }

kiln_status kcache_publish(const kcache_key *key, const char *key_json, const char *config_json,
                           const kcache_tensor *t, size_t n) {
    static int counter;
    char *parent = kb_dirname(key->path);
    char *staging = kb_strfmt("%s.staging.%ld.%d", key->path, (long)getpid(),
                              __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED));
    char *data_path = staging ? kb_path_join(staging, KCACHE_DATA) : NULL;
    char *man_path = staging ? kb_path_join(staging, KCACHE_MANIFEST) : NULL;
    cJSON *root = cJSON_CreateObject(), *tensors = NULL;
    char *body = NULL, *manifest = NULL;
    int fd = -1;
    kiln_status s = KILN_OK;
    if (!parent || !staging || !data_path || !man_path || !root) {
        s = kb_fail(KILN_ERR_NOMEM, "out of memory publishing a cache");
        goto done;
    }
    if ((s = kb_mkdir_p(parent))) goto done;
    if (mkdir(staging, 0755) != 0) {
        s = kb_fail(KILN_ERR_IO, "cannot create %s: %s", staging, strerror(errno));
        goto done;
    }
    fd = open(data_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        s = kb_fail(KILN_ERR_IO, "cannot create %s: %s", data_path, strerror(errno));
        goto done;
    }
    cJSON_AddNumberToObject(root, "format_version", KCACHE_FORMAT_VERSION);
    cJSON_AddStringToObject(root, "kiln_version", KILN_VERSION);
    cJSON *kj = key_json ? cJSON_Parse(key_json) : NULL;
    cJSON_AddItemToObject(root, "key", kj ? kj : cJSON_CreateObject());
    cJSON *cj = config_json ? cJSON_Parse(config_json) : NULL;
    cJSON_AddItemToObject(root, "config", cj ? cj : cJSON_CreateObject());
    cJSON_AddStringToObject(root, "data_file", KCACHE_DATA);
    tensors = cJSON_AddArrayToObject(root, "tensors");
    static const uint8_t zeros[KCACHE_ALIGN];
    uint64_t pos = 0;
    for (size_t i = 0; i < n && !s; i++) {
        uint64_t off = (pos + KCACHE_ALIGN - 1) & ~(uint64_t)(KCACHE_ALIGN - 1);
        if ((s = write_all(fd, zeros, (size_t)(off - pos), data_path))) break;
        if ((s = write_all(fd, t[i].data, t[i].nbytes, data_path))) break;
        pos = off + t[i].nbytes;
        char hex[20];
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)XXH3_64bits(t[i].data, t[i].nbytes));
        cJSON *e = cJSON_CreateObject();
        cJSON_AddItemToArray(tensors, e);
        cJSON_AddStringToObject(e, "name", t[i].name);
        cJSON_AddStringToObject(e, "dtype", kiln_dtype_name(t[i].dtype));
        cJSON *sh = cJSON_AddArrayToObject(e, "shape");
        for (int d = 0; d < t[i].ndim; d++) cJSON_AddItemToArray(sh, json_u64((uint64_t)t[i].shape[d]));
        cJSON_AddStringToObject(e, "layout", t[i].layout ? t[i].layout : "rowmajor");
        cJSON_AddItemToObject(e, "offset", json_u64(off));
        cJSON_AddItemToObject(e, "bytes", json_u64(t[i].nbytes));
        cJSON_AddStringToObject(e, "xxh3", hex);
    }
    if (s) goto done;
    if (fsync(fd) != 0) {
        s = kb_fail(KILN_ERR_IO, "cannot flush %s: %s", data_path, strerror(errno));
        goto done;
    }
    close(fd);
    fd = -1;
    cJSON_AddItemToObject(root, "data_bytes", json_u64(pos));
    body = cJSON_Print(root);
    if (!body) {
        s = kb_fail(KILN_ERR_NOMEM, "out of memory writing the manifest");
        goto done;
    }
    /* first line: magic, format, and the checksum of everything after it */
    manifest = kb_strfmt(MANIFEST_MAGIC " %d xxh3:%016llx\n%s\n", KCACHE_FORMAT_VERSION,
                         (unsigned long long)XXH3_64bits(body, strlen(body)), body);
    if (!manifest) {
        s = KILN_ERR_NOMEM;
        goto done;
    }
    /* the manifest is the commit marker: written last, then the folder is renamed in */
    if ((s = kb_write_file_atomic(man_path, manifest, strlen(manifest)))) goto done;
    fsync_path(staging);
    if (rename(staging, key->path) != 0) {
        if (errno == ENOTEMPTY || errno == EEXIST)
            s = kb_fail(KILN_ERR_IO, "%s appeared while publishing (another writer without the lock?)", key->path);
        else
            s = kb_fail(KILN_ERR_IO, "cannot rename %s to %s: %s", staging, key->path, strerror(errno));
        goto done;
    }
    fsync_path(parent);
done:
    if (fd >= 0) close(fd);
    if (s && staging) rm_rf(staging);
    cJSON_Delete(root);
    free(body);
    free(manifest);
    free(parent);
    free(staging);
    free(data_path);
    free(man_path);
    return s;
}

/* ---- open ----------------------------------------------------------------------- */

void kcache_close(kcache_entry *e) {
    if (!e) return;
    kb_unmap(&e->data);
    for (size_t i = 0; i < e->n; i++) {
        free((char *)e->t[i].name);
        free((char *)e->t[i].layout);
    }
    free(e->t);
    free(e->config_json);
    free(e->key_json);
    free(e->path);
    free(e);
}

static int json_u64_get(const cJSON *o, const char *key, uint64_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 9007199254740992.0 ||
        v->valuedouble != (double)(uint64_t)v->valuedouble)
        return 0;
    *out = (uint64_t)v->valuedouble;
    return 1;
}

kiln_status kcache_open(const char *path, int verify, kcache_entry **out) {
    *out = NULL;
    char *man_path = kb_path_join(path, KCACHE_MANIFEST);
    if (!man_path) return KILN_ERR_NOMEM;
    if (!kb_is_file(man_path)) {
        free(man_path);
        return kb_fail(KILN_ERR_CACHE_MISSING, "no complete cache at %s", path);
    }
    char *text = NULL;
    size_t len = 0;
    kiln_status s = kb_read_file(man_path, &text, &len);
    free(man_path);
    if (s) return s;
    kcache_entry *e = kb_calloc(1, sizeof *e);
    cJSON *root = NULL;
    if (!e || !(e->path = kb_strdup(path))) {
        free(text);
        free(e);
        return KILN_ERR_NOMEM;
    }
#define CORRUPT(...)                                                              \
    do {                                                                          \
        char why_[512];                                                           \
        snprintf(why_, sizeof why_, __VA_ARGS__);                                 \
        s = kb_fail(KILN_ERR_CORRUPT, "cache %s is corrupt: %s", path, why_);     \
        goto done;                                                                \
    } while (0)
    int version = 0;
    unsigned long long want = 0;
    char *nl = memchr(text, '\n', len);
    if (!nl || sscanf(text, MANIFEST_MAGIC " %d xxh3:%16llx", &version, &want) != 2)
        CORRUPT("manifest has no kiln-cache header line");
    if (version != KCACHE_FORMAT_VERSION) CORRUPT("manifest format %d, this kiln reads %d", version, KCACHE_FORMAT_VERSION);
    size_t body_len = len - (size_t)(nl + 1 - text);
    if (body_len && nl[body_len] == '\n') body_len--; /* trailing newline */
    if (XXH3_64bits(nl + 1, body_len) != want) CORRUPT("manifest checksum mismatch");
    root = cJSON_ParseWithLength(nl + 1, body_len);
    if (!root) CORRUPT("manifest is not valid JSON");
    const cJSON *df = cJSON_GetObjectItemCaseSensitive(root, "data_file");
    const cJSON *tensors = cJSON_GetObjectItemCaseSensitive(root, "tensors");
    uint64_t data_bytes;
    if (!cJSON_IsString(df) || strcmp(df->valuestring, KCACHE_DATA) || !cJSON_IsArray(tensors) ||
        !json_u64_get(root, "data_bytes", &data_bytes))
        CORRUPT("manifest lacks data_file, data_bytes or tensors");
    e->config_json = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(root, "config"));
    e->key_json = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(root, "key"));
    char *data_path = kb_path_join(path, KCACHE_DATA);
    if (!data_path) {
        s = KILN_ERR_NOMEM;
        goto done;
    }
    s = kb_map_file(data_path, &e->data);
    free(data_path);
    if (s == KILN_ERR_NOMEM) goto done; /* out of memory says nothing about the cache: keep it */
    if (s) CORRUPT("%s", kiln_last_error());
    if (e->data.size != data_bytes)
        CORRUPT("%s holds %zu bytes, the manifest says %llu (truncated or overwritten)", KCACHE_DATA, e->data.size,
                (unsigned long long)data_bytes);
    int nt = cJSON_GetArraySize(tensors);
    e->t = kb_calloc((size_t)(nt > 0 ? nt : 1), sizeof *e->t);
    if (!e->t) {
        s = KILN_ERR_NOMEM;
        goto done;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, tensors) {
        kcache_tensor *t = &e->t[e->n];
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(it, "name");
        const cJSON *dt = cJSON_GetObjectItemCaseSensitive(it, "dtype");
        const cJSON *shape = cJSON_GetObjectItemCaseSensitive(it, "shape");
        const cJSON *layout = cJSON_GetObjectItemCaseSensitive(it, "layout");
        const cJSON *hash = cJSON_GetObjectItemCaseSensitive(it, "xxh3");
        uint64_t off, bytes;
        if (!cJSON_IsString(name) || !cJSON_IsString(dt) || !cJSON_IsArray(shape) || !cJSON_IsString(layout) ||
            !cJSON_IsString(hash) || !json_u64_get(it, "offset", &off) || !json_u64_get(it, "bytes", &bytes))
            CORRUPT("tensor entry %zu is malformed", e->n);
        t->name = kb_strdup(name->valuestring);
        t->layout = kb_strdup(layout->valuestring);
        e->n++;
        if (!t->name || !t->layout) {
            s = KILN_ERR_NOMEM;
            goto done;
        }
        t->dtype = kt_dtype_from_name(dt->valuestring);
        t->ndim = cJSON_GetArraySize(shape);
        if (t->dtype == KILN_DTYPE_INVALID || t->ndim > 4) CORRUPT("tensor %s: bad dtype or rank", t->name);
        uint64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            const cJSON *v = cJSON_GetArrayItem(shape, d);
            if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 1e12)
                CORRUPT("tensor %s: bad shape", t->name);
            t->shape[d] = (int64_t)v->valuedouble;
            numel *= (uint64_t)t->shape[d];
        }
        /* packed layouts may pad; the model checks their size against the layout */
        int rowmajor = !strcmp(t->layout, "rowmajor");
        if (rowmajor ? numel * kiln_dtype_size(t->dtype) != bytes : numel * kiln_dtype_size(t->dtype) > bytes)
            CORRUPT("tensor %s: %llu bytes do not match its shape", t->name, (unsigned long long)bytes);
        if (off % KCACHE_ALIGN || off > data_bytes || bytes > data_bytes - off)
            CORRUPT("tensor %s: range [%llu, +%llu) outside the data file or unaligned", t->name,
                    (unsigned long long)off, (unsigned long long)bytes);
        t->offset = off;
        t->nbytes = (size_t)bytes;
        t->data = e->data.data ? e->data.data + off : NULL;
        unsigned long long h = 0;
        if (sscanf(hash->valuestring, "%16llx", &h) != 1) CORRUPT("tensor %s: bad hash", t->name);
        t->xxh3 = h;
        if (verify && XXH3_64bits(t->data, t->nbytes) != t->xxh3)
            CORRUPT("tensor %s fails its xxh3 check (the data file was modified)", t->name);
    }
#undef CORRUPT
done:
    cJSON_Delete(root);
    free(text);
    if (s) {
        kcache_close(e);
        return s;
    }
    *out = e;
    return KILN_OK;
}

/* ---- locks and cleanup ------------------------------------------------------------- */

kiln_status kcache_lock(const kcache_key *key, int *fd) {
    char *parent = kb_dirname(key->path), *lock = kb_strfmt("%s.lock", key->path);
    kiln_status s = parent && lock ? kb_mkdir_p(parent) : KILN_ERR_NOMEM;
    *fd = -1;
    if (!s) {
        int f = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (f < 0) {
            s = kb_fail(KILN_ERR_IO, "cannot open lock %s: %s", lock, strerror(errno));
        } else if (flock(f, LOCK_EX | LOCK_NB) != 0) {
            kb_log(KILN_LOG_INFO, "waiting for another process converting %s", key->path);
            int r;
            while ((r = flock(f, LOCK_EX)) != 0 && errno == EINTR) {
            }
            if (r != 0) {
                s = kb_fail(KILN_ERR_IO, "cannot lock %s: %s", lock, strerror(errno));
                close(f);
            } else {
                *fd = f;
            }
        } else {
            *fd = f;
        }
    }
    free(parent);
    free(lock);
    return s;
}

void kcache_unlock(int fd) {
    if (fd >= 0) {
        flock(fd, LOCK_UN);
        close(fd);
    }
}

/* true when s is exactly n lowercase hex digits */
static int is_hex(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    return s[n] == 0;
}

/* Remove entries of parent named base + mid + anything (or, with hex_tail,
 * base + mid + exactly 12 hex digits: another content hash of the key). */
static void remove_matching(const char *parent, const char *base, const char *mid, const char *keep,
                            int hex_tail) {
    DIR *d = opendir(parent);
    if (!d) return;
    size_t bl = strlen(base), ml = strlen(mid);
    struct dirent *e;
    char **victims = NULL;
    size_t n = 0;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, base, bl) || strncmp(e->d_name + bl, mid, ml)) continue;
        if (keep && !strcmp(e->d_name, keep)) continue;
        if (hex_tail && !is_hex(e->d_name + bl + ml, 12)) continue;
        if (strstr(e->d_name, ".lock") || strstr(e->d_name, ".trash.")) continue;
        char **nv = realloc(victims, (n + 1) * sizeof *nv);
        if (!nv) break;
        victims = nv;
        victims[n++] = kb_path_join(parent, e->d_name);
    }
    closedir(d);
    for (size_t i = 0; i < n; i++) {
        if (victims[i]) {
            kb_log(KILN_LOG_INFO, "removing %s", victims[i]);
            if (kb_is_dir(victims[i])) kcache_remove(victims[i]);
        }
        free(victims[i]);
    }
    free(victims);
}

void kcache_clean_staging(const kcache_key *key) {
    char *parent = kb_dirname(key->path);
    const char *base = strrchr(key->path, '/');
    if (parent && base) remove_matching(parent, base + 1, ".staging.", NULL, 0);
    /* trash of this key (<name>.trash.*, <name>.staging.*.trash.*) left by
     * processes killed while removing: all of it, and no other key's (whose
     * removal may be running now, under that key's lock) */
    if (parent && base) {
        size_t bl = strlen(base + 1);
        DIR *d = opendir(parent);
        struct dirent *e;
        char **victims = NULL;
        size_t n = 0;
        while (d && (e = readdir(d))) {
            if (strncmp(e->d_name, base + 1, bl) || e->d_name[bl] != '.' || !strstr(e->d_name + bl, ".trash."))
                continue;
            char **nv = realloc(victims, (n + 1) * sizeof *nv);
            if (!nv) break;
            victims = nv;
            victims[n++] = kb_path_join(parent, e->d_name);
        }
        if (d) closedir(d);
        for (size_t i = 0; i < n; i++) {
            if (victims[i]) rm_rf(victims[i]);
            free(victims[i]);
        }
        free(victims);
    }
    free(parent);
}

void kcache_remove_superseded(const kcache_key *key) {
    remove_matching(key->group, key->prefix, "_c", key->name, 1);
    /* staging and trash leftovers of superseded keys: only where nobody holds
     * that key's lock (a conversion of it may still be running) */
    DIR *d = opendir(key->group);
    if (!d) return;
    size_t pl = strlen(key->prefix);
    struct dirent *e;
    char **victims = NULL;
    size_t n = 0;
    while ((e = readdir(d))) {
        const char *nm = e->d_name;
        if (strncmp(nm, key->prefix, pl) || strncmp(nm + pl, "_c", 2) || !strncmp(nm, key->name, strlen(key->name)))
            continue;
        const char *tail = nm + pl + 2;
        if (strlen(tail) <= 12 || (strncmp(tail + 12, ".staging.", 9) && strncmp(tail + 12, ".trash.", 7))) continue;
        char **nv = realloc(victims, (n + 1) * sizeof *nv);
        if (!nv) break;
        victims = nv;
        victims[n++] = kb_strdup(nm);
    }
    closedir(d);
    for (size_t i = 0; i < n; i++) {
        char *lock = victims[i] ? kb_strfmt("%s/%.*s.lock", key->group, (int)(pl + 14), victims[i]) : NULL;
        int fd = lock ? open(lock, O_RDWR | O_CLOEXEC) : -1;
        if (fd < 0 || flock(fd, LOCK_EX | LOCK_NB) == 0) { /* no lock file, or nobody converting */
            char *p = kb_path_join(key->group, victims[i]);
            if (p) rm_rf(p);
            free(p);
        }
        if (fd >= 0) close(fd); /* releases the lock */
        free(lock);
        free(victims[i]);
    }
    free(victims);
}

void kcache_touch(const char *dir) { utimensat(AT_FDCWD, dir, NULL, 0); }
