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
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

/* ---- helpers ------------------------------------------------------------------ */

static kiln_status write_all(int fd, const void *p, size_t n, const char *path) {
    const uint8_t *b = p;
    while (n) {
        ssize_t w = write(fd, b, n > (1u << 30) ? (1u << 30) : n);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EFBIG)
                return kb_fail(KILN_ERR_IO, "cannot write %s: %s (the process's file size limit, ulimit -f, is "
                               "smaller than the cache)", path, strerror(errno));
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

/* A write past the file size limit (ulimit -f) raises SIGXFSZ, which kills
 * the process without a word; ignored, the write fails with EFBIG and the
 * load reports it. Only where nobody installed a handler of their own. */
static void ignore_sigxfsz(void) {
    struct sigaction sa;
    if (sigaction(SIGXFSZ, NULL, &sa) == 0 && sa.sa_handler == SIG_DFL) signal(SIGXFSZ, SIG_IGN);
}

/* kcache_publish's producer over an array */
typedef struct array_src {
    const kcache_tensor *t;
} array_src;
static kiln_status array_produce(void *user, size_t i, kcache_tensor *out) {
    *out = ((array_src *)user)->t[i];
    return KILN_OK;
}

kiln_status kcache_publish(const kcache_key *key, const char *key_json, const char *config_json,
                           const kcache_tensor *t, size_t n) {
    array_src a = {t};
    return kcache_publish_stream(key, key_json, config_json, n, array_produce, NULL, &a);
}

kiln_status kcache_publish_stream(const kcache_key *key, const char *key_json, const char *config_json, size_t n,
                                  kcache_produce_fn produce, kcache_release_fn release, void *user) {
    static int counter;
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, ignore_sigxfsz);
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
        kcache_tensor cur;
        memset(&cur, 0, sizeof cur);
        if ((s = produce(user, i, &cur))) {
            if (release) release(user, i);
            break;
        }
        const kcache_tensor *t = &cur;
        uint64_t off = (pos + KCACHE_ALIGN - 1) & ~(uint64_t)(KCACHE_ALIGN - 1);
        if (!(s = write_all(fd, zeros, (size_t)(off - pos), data_path))) s = write_all(fd, t->data, t->nbytes, data_path);
        if (!s) {
            pos = off + t->nbytes;
            char hex[20];
            snprintf(hex, sizeof hex, "%016llx", (unsigned long long)XXH3_64bits(t->data, t->nbytes));
            cJSON *e = cJSON_CreateObject();
            cJSON_AddItemToArray(tensors, e);
            cJSON_AddStringToObject(e, "name", t->name);
            cJSON_AddStringToObject(e, "dtype", kiln_dtype_name(t->dtype));
            cJSON *sh = cJSON_AddArrayToObject(e, "shape");
            for (int d = 0; d < t->ndim; d++) cJSON_AddItemToArray(sh, json_u64((uint64_t)t->shape[d]));
            cJSON_AddStringToObject(e, "layout", t->layout ? t->layout : "rowmajor");
            cJSON_AddItemToObject(e, "offset", json_u64(off));
            cJSON_AddItemToObject(e, "bytes", json_u64(t->nbytes));
            cJSON_AddStringToObject(e, "xxh3", hex);
        }
        if (release) release(user, i); /* its bytes are written: the producer may free them */
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
    /* first line: magic, format, the checksum of everything after it (damage)
     * and its HMAC under this user's trust key (a cache somebody else made) */
    char sig[65];
    if ((s = kb_sign(body, strlen(body), sig))) {
        s = kb_wrap(s, "signing the manifest of %s", key->path);
        goto done;
    }
    manifest = kb_strfmt(KCACHE_MAGIC " %d xxh3:%016llx hmac:%s\n%s\n", KCACHE_FORMAT_VERSION,
                         (unsigned long long)XXH3_64bits(body, strlen(body)), sig, body);
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

kiln_status kcache_check_dir(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT || errno == ENOTDIR) return kb_fail(KILN_ERR_CACHE_MISSING, "no complete cache at %s", path);
        return kb_fail(KILN_ERR_IO, "cannot look at %s: %s", path, strerror(errno));
    }
    if (S_ISLNK(st.st_mode))
        return kb_fail(KILN_ERR_CORRUPT, "cache %s is a symbolic link (caches are never followed through links: "
                       "it could point at another model's cache)", path);
    if (!S_ISDIR(st.st_mode)) return kb_fail(KILN_ERR_CORRUPT, "cache %s is not a folder", path);
    return KILN_OK;
}

/* The manifest's bytes: a regular file, not through a symlink, never a FIFO
 * to block on. KILN_ERR_CACHE_MISSING when there is none. */
static kiln_status read_manifest(const char *dir, char **text, size_t *len) {
    *text = NULL;
    *len = 0;
    char *path = kb_path_join(dir, KCACHE_MANIFEST);
    if (!path) return KILN_ERR_NOMEM;
    kiln_status s = KILN_OK;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    struct stat st;
    if (fd < 0) {
        if (errno == ENOENT) s = kb_fail(KILN_ERR_CACHE_MISSING, "no complete cache at %s", dir);
        else if (errno == ELOOP) s = kb_fail(KILN_ERR_CORRUPT, "cache %s is corrupt: " KCACHE_MANIFEST " is a symbolic link", dir);
        else if (errno == ENFILE || errno == EMFILE || errno == ENOMEM) s = kb_fail(KILN_ERR_NOMEM, "cannot open %s: %s", path, strerror(errno));
        else s = kb_fail(KILN_ERR_CORRUPT, "cache %s is corrupt: cannot open " KCACHE_MANIFEST ": %s", dir, strerror(errno));
    } else if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        s = kb_fail(KILN_ERR_CORRUPT, "cache %s is corrupt: " KCACHE_MANIFEST " is not a regular file", dir);
    } else if ((uint64_t)st.st_size > KCACHE_MANIFEST_MAX) {
        s = kb_fail(KILN_ERR_CORRUPT, "cache %s is corrupt: " KCACHE_MANIFEST " holds %lld bytes (at most %u)", dir,
                    (long long)st.st_size, KCACHE_MANIFEST_MAX);
    } else if (!(*text = kb_malloc((size_t)st.st_size + 1))) {
        s = KILN_ERR_NOMEM;
    } else {
        size_t n = 0;
        while (n < (size_t)st.st_size) {
            ssize_t got = read(fd, *text + n, (size_t)st.st_size - n);
            if (got < 0 && errno == EINTR) continue;
            if (got <= 0) break;
            n += (size_t)got;
        }
        (*text)[n] = 0;
        *len = n;
    }
    if (fd >= 0) close(fd);
    if (s) {
        free(*text);
        *text = NULL;
    }
    free(path);
    return s;
}

kiln_status kcache_open(const char *path, int verify, kcache_entry **out) {
    *out = NULL;
    kiln_status s = kcache_check_dir(path);
    if (s) return s;
    char *text = NULL;
    size_t len = 0;
    if ((s = read_manifest(path, &text, &len))) return s;
    kcache_entry *e = kb_calloc(1, sizeof *e);
    if (!e) {
        free(text);
        return KILN_ERR_NOMEM;
    }
#define CORRUPT(...)                                                              \
    do {                                                                          \
        char why_[512];                                                           \
        snprintf(why_, sizeof why_, __VA_ARGS__);                                 \
        s = kb_fail(KILN_ERR_CORRUPT, "cache %s is corrupt: %s", path, why_);     \
        goto done;                                                                \
    } while (0)
    int version;
    char sig[65];
    const char *body;
    size_t body_len;
    if ((s = kcache_manifest_split(text, len, path, &version, sig, &body, &body_len))) goto done;
    /* the signature before anything in the body is believed: a manifest this
     * user's key did not sign (copied from another user, edited by hand) is
     * refused; one the key cannot be read to check says nothing about the cache */
    if ((s = kb_verify_sig(body, body_len, sig))) {
        if (s == KILN_ERR_CORRUPT)
            s = kb_fail(KILN_ERR_CORRUPT, "cache %s is not trusted: its manifest's signature does not verify under "
                        "this user's trust key (copied from another user or machine, or edited by hand)", path);
        else
            s = kb_wrap(s, "checking the signature of cache %s", path);
        goto done;
    }
    if ((s = kcache_manifest_parse(body, body_len, path, e))) goto done;
    if (!(e->path = kb_strdup(path))) {
        s = KILN_ERR_NOMEM;
        goto done;
    }
    char *data_path = kb_path_join(path, KCACHE_DATA);
    if (!data_path) {
        s = KILN_ERR_NOMEM;
        goto done;
    }
    struct stat dst;
    if (lstat(data_path, &dst) == 0 && !S_ISREG(dst.st_mode)) {
        free(data_path);
        CORRUPT("%s is not a regular file%s", KCACHE_DATA, S_ISLNK(dst.st_mode) ? " (a symbolic link)" : "");
    }
    s = kb_map_file(data_path, &e->data);
    free(data_path);
    if (s == KILN_ERR_NOMEM) goto done; /* out of memory says nothing about the cache: keep it */
    if (s) CORRUPT("%s", kiln_last_error());
    if (e->data.size != e->data_bytes)
        CORRUPT("%s holds %zu bytes, the manifest says %llu (truncated or overwritten)", KCACHE_DATA, e->data.size,
                (unsigned long long)e->data_bytes);
    for (size_t i = 0; i < e->n; i++) { /* ranges checked by the parse against data_bytes */
        kcache_tensor *t = &e->t[i];
        t->data = e->data.data ? e->data.data + t->offset : NULL;
        if (verify && XXH3_64bits(t->data, t->nbytes) != t->xxh3)
            CORRUPT("tensor %s fails its xxh3 check (the data file was modified)", t->name);
    }
#undef CORRUPT
done:
    free(text);
    if (s) {
        kcache_close(e);
        return s;
    }
    *out = e;
    return KILN_OK;
}

kiln_status kcache_check_place(const kcache_entry *e, const char *rel, const char *part) {
    char model[256] = "", comp[256] = "", name[400] = "";
    const char *a = strchr(rel, '/'), *b = a ? strchr(a + 1, '/') : NULL;
    if (!a || !b || a - rel >= (long)sizeof model || b - a - 1 >= (long)sizeof comp || strlen(b + 1) >= sizeof name)
        return kb_fail(KILN_ERR_INVALID_ARG, "%s is not model/component/key", rel);
    memcpy(model, rel, (size_t)(a - rel));
    memcpy(comp, a + 1, (size_t)(b - a - 1));
    snprintf(name, sizeof name, "%s", b + 1);
    size_t nl = strlen(name);
    const char *content = nl > 12 ? name + nl - 12 : name;
    cJSON *k = cJSON_Parse(e->key_json ? e->key_json : "");
    const char *fields[4][2] = {{"model", model}, {"component", comp}, {"content", content}, {"part", part ? part : ""}};
    kiln_status s = KILN_OK;
    for (int i = 0; i < 4 && !s; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(k, fields[i][0]);
        if (!cJSON_IsString(v) || strcmp(v->valuestring, fields[i][1]))
            s = kb_fail(KILN_ERR_CORRUPT, "cache %s is not what its folder says: its %s is \"%.200s\", the folder "
                        "says \"%s\" (another cache copied or linked here?)", e->path, fields[i][0],
                        cJSON_IsString(v) ? v->valuestring : "(absent)", fields[i][1]);
    }
    cJSON_Delete(k);
    return s;
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

/* Whether the cache at dir was made from source: its manifest's "source"
 * (an absolute path, or a callback's source_id; format 1 kept the path as
 * given, so that is resolved too). Unknown counts as another source. */
static int same_source(const char *dir, const char *source) {
    char *old = kcache_manifest_source(dir);
    int same = 0;
    if (old) {
        char real[PATH_MAX];
        same = !strcmp(old, source) || (realpath(old, real) && !strcmp(real, source));
    }
    free(old);
    return same;
}

/* Remove entries of parent named base + mid + anything (or, with hex_tail,
 * base + mid + exactly 12 hex digits: another content hash of the key; with
 * source, only those whose manifest at <entry><part> names that source). */
static void remove_matching(const char *parent, const char *base, const char *mid, const char *keep,
                            int hex_tail, const char *source, const char *part) {
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
        if (source) {
            char *where = kb_strfmt("%s/%s%s", parent, e->d_name, part ? part : "");
            int mine = where && same_source(where, source);
            free(where);
            if (!mine) {
                kb_log(KILN_LOG_DEBUG, "keeping %s/%s: another source's cache under the same name", parent, e->d_name);
                continue;
            }
        }
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
    if (parent && base) remove_matching(parent, base + 1, ".staging.", NULL, 0, NULL, NULL);
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

void kcache_remove_superseded(const kcache_key *key, const char *source) {
    if (!source || !*source) return; /* nothing says which caches are this source's */
    remove_matching(key->group, key->prefix, "_c", key->name, 1, source, key->path + strlen(key->dir));
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
