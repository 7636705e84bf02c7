/* root.c - the whole cache root: list key folders, garbage-collect. */
#define _GNU_SOURCE
#include "cache/cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_default_root[4096];
static pthread_once_t g_default_once = PTHREAD_ONCE_INIT;

/* $XDG_CACHE_HOME/kiln (an absolute XDG_CACHE_HOME only, as the XDG spec
 * says), else $HOME/.cache/kiln; "" when neither can be made */
static void default_root(void) {
    const char *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
    if (x && x[0] == '/') snprintf(g_default_root, sizeof g_default_root, "%s/kiln", x);
    else if (h && h[0] == '/') snprintf(g_default_root, sizeof g_default_root, "%s/.cache/kiln", h);
}

const char *kcache_root(const char *given) {
    if (given && *given) return given;
    const char *env = getenv("KILN_CACHE_DIR");
    if (env) return *env ? env : NULL; /* set and empty: no cache */
    pthread_once(&g_default_once, default_root);
    return g_default_root[0] ? g_default_root : NULL;
}

char *kcache_package_root(const char *given, const char *cache_root) {
    if (given && *given) return kb_strdup(given);
    const char *env = getenv("KILN_PACKAGE_DIR");
    if (env && *env) return kb_strdup(env);
    const char *root = kcache_root(cache_root);
    return root ? kb_path_join(root, "packages") : NULL;
}

/* <key>.staging.<pid>.<n>: a build's folder before its rename into place */
static int staging_name(const char *name) {
    const char *p = strstr(name, ".staging.");
    return p && p > name && !strstr(name, ".trash.") && !strstr(name, ".lock");
}

/* 1 when nobody holds the lock of the key whose staging folder this is
 * (group/<key>.lock, flock: released when its holder dies, so a build that
 * was killed holds nothing); a live build holds it from lock to publish */
static int staging_dead(const char *group, const char *name) {
    const char *p = strstr(name, ".staging.");
    char *lock = kb_strfmt("%s/%.*s.lock", group, (int)(p - name), name);
    if (!lock) return 0;
    int fd = open(lock, O_RDONLY | O_CLOEXEC), dead = 1;
    if (fd >= 0) {
        dead = flock(fd, LOCK_EX | LOCK_NB) == 0;
        close(fd); /* releases it */
    }
    free(lock);
    return dead;
}

static int skip(const char *name) {
    return name[0] == '.' || strstr(name, ".lock") || strstr(name, ".staging.") || strstr(name, ".trash.");
}

/* What a folder under a component is, by content (the manifest's first
 * word), not by name: 1 a weight cache with a manifest (in itself, or in its
 * host_coords_* / shard_* folders; source filled from the first), 0 no
 * manifest of any kind (an interrupted build, when named like a key), -1
 * something else (a compiled package, whose manifest says "kiln-package"). */
static int classify(const char *dir, int depth, char *source, size_t cap) {
    char *man = kb_path_join(dir, KCACHE_MANIFEST);
    int kind = 0;
    struct stat st;
    if (man && lstat(man, &st) == 0) {
        char head[16] = "";
        FILE *f = S_ISREG(st.st_mode) ? fopen(man, "rb") : NULL;
        size_t got = f ? fread(head, 1, sizeof head - 1, f) : 0;
        if (f) fclose(f);
        head[got] = 0;
        kind = !strncmp(head, KCACHE_MAGIC " ", strlen(KCACHE_MAGIC) + 1) ? 1 : -1;
        if (kind == 1 && !*source) {
            char *src = kcache_manifest_source(dir);
            if (src) snprintf(source, cap, "%s", src);
            free(src);
        }
    }
    free(man);
    if (kind || depth >= 2) return kind;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if ((strncmp(e->d_name, "host_coords_", 12) && strncmp(e->d_name, "shard_", 6)) || strchr(e->d_name, '.'))
            continue;
        char *sub = kb_path_join(dir, e->d_name);
        int k = sub && kb_is_dir(sub) ? classify(sub, depth + 1, source, cap) : 0;
        free(sub);
        if (k < 0) kind = -1;
        else if (k > 0 && kind == 0) kind = 1;
    }
    if (d) closedir(d);
    return kind;
}

/* <prefix>_c<12 lowercase hex digits>: what kcache_key_make names a key folder */
static int key_like(const char *name) {
    size_t l = strlen(name);
    if (l < 15 || strncmp(name + l - 14, "_c", 2)) return 0;
    for (size_t i = l - 12; i < l; i++)
        if (!((name[i] >= '0' && name[i] <= '9') || (name[i] >= 'a' && name[i] <= 'f'))) return 0;
    return 1;
}

static _Thread_local int64_t t_bytes;
static _Thread_local int t_complete;

static int size_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)ftw;
    if (flag == FTW_F) {
        t_bytes += (int64_t)sb->st_size;
        const char *b = strrchr(p, '/');
        if (b && !strcmp(b + 1, KCACHE_MANIFEST)) t_complete = 1;
    }
    return 0;
}

typedef struct {
    kcache_item *v;
    size_t n, cap;
} items;

static kiln_status add_item(items *it, const char *root, const char *m, const char *c, const char *k, int staging) {
    if (it->n == it->cap) {
        size_t cap = it->cap ? it->cap * 2 : 32;
        kcache_item *nv = realloc(it->v, cap * sizeof *nv);
        if (!nv) return kb_fail(KILN_ERR_NOMEM, "out of memory listing the cache");
        it->v = nv;
        it->cap = cap;
    }
    kcache_item *x = &it->v[it->n];
    memset(x, 0, sizeof *x);
    snprintf(x->rel, sizeof x->rel, "%s/%s/%s", m, c, k);
    snprintf(x->dir, sizeof x->dir, "%s/%s", root, x->rel);
    struct stat st;
    if (lstat(x->dir, &st) != 0 || !S_ISDIR(st.st_mode)) return KILN_OK;
    int kind = staging ? 0 : classify(x->dir, 0, x->source, sizeof x->source);
    if (!staging && (kind < 0 || (kind == 0 && !key_like(k)))) return KILN_OK; /* not a weight cache: not ours */
    x->interrupted = staging;
    t_bytes = 0;
    t_complete = 0;
    nftw(x->dir, size_cb, 16, FTW_PHYS);
    x->bytes = t_bytes;
    x->complete = t_complete && !staging;
    x->last_used = (double)st.st_mtim.tv_sec + 1e-9 * (double)st.st_mtim.tv_nsec;
    it->n++;
    return KILN_OK;
}

/* names of the sub-folders of dir, sorted; with staging, only the
 * staging folders of dead builds (staging_name, staging_dead) */
static char **subdirs_of(const char *dir, size_t *n, int staging) {
    DIR *d = opendir(dir);
    *n = 0;
    if (!d) return NULL;
    char **v = NULL;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (staging ? !staging_name(e->d_name) || !staging_dead(dir, e->d_name) : skip(e->d_name)) continue;
        char *p = kb_path_join(dir, e->d_name);
        int ok = p && kb_is_dir(p);
        free(p);
        if (!ok) continue;
        char **nv = realloc(v, (*n + 1) * sizeof *nv);
        if (!nv) break;
        v = nv;
        v[(*n)++] = kb_strdup(e->d_name);
    }
    closedir(d);
    for (size_t i = 1; i < *n; i++) /* insertion sort: folders are few */
        for (size_t j = i; j > 0 && strcmp(v[j - 1], v[j]) > 0; j--) {
            char *t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return v;
}

static char **subdirs(const char *dir, size_t *n) { return subdirs_of(dir, n, 0); }

static void free_names(char **v, size_t n) {
    for (size_t i = 0; i < n; i++) free(v[i]);
    free(v);
}

kiln_status kcache_list(const char *root, kcache_item **out, size_t *n) {
    *out = NULL;
    *n = 0;
    struct stat rs;
    if (stat(root, &rs) != 0) return KILN_OK; /* not made yet (the first publish makes it): no caches */
    if (!S_ISDIR(rs.st_mode)) return kb_fail(KILN_ERR_IO, "cache root %s is not a folder", root);
    items it = {0};
    kiln_status s = KILN_OK;
    size_t nm, nc, nk;
    char **models = subdirs(root, &nm);
    for (size_t i = 0; i < nm && !s; i++) {
        /* <root>/packages is the compiled packages' default folder
         * (docs/package.md), not a model: `kiln package` lists and verifies
         * those, and `cache verify` would call every one corrupt */
        if (!strcmp(models[i], "packages")) continue;
        char *md = kb_path_join(root, models[i]);
        char **comps = md ? subdirs(md, &nc) : NULL;
        for (size_t j = 0; md && j < nc && !s; j++) {
            char *cd = kb_path_join(md, comps[j]);
            char **keys = cd ? subdirs(cd, &nk) : NULL;
            for (size_t k = 0; cd && k < nk && !s; k++) s = add_item(&it, root, models[i], comps[j], keys[k], 0);
            if (cd) free_names(keys, nk);
            keys = cd ? subdirs_of(cd, &nk, 1) : NULL;
            for (size_t k = 0; cd && k < nk && !s; k++) s = add_item(&it, root, models[i], comps[j], keys[k], 1);
            if (cd) free_names(keys, nk);
            free(cd);
        }
        if (md) free_names(comps, nc);
        free(md);
    }
    free_names(models, nm);
    if (s) {
        free(it.v);
        return s;
    }
    *out = it.v;
    *n = it.n;
    return KILN_OK;
}

/* dead builds' staging first (never of use), then least recently used */
static int by_last_used(const void *a, const void *b) {
    const kcache_item *p = a, *q = b;
    if (p->interrupted != q->interrupted) return p->interrupted ? -1 : 1;
    double x = p->last_used, y = q->last_used;
    return x < y ? -1 : x > y;
}

int64_t kcache_dir_bytes(const char *dir) {
    t_bytes = 0;
    nftw(dir, size_cb, 16, FTW_PHYS);
    return t_bytes;
}

kiln_status kcache_gc(const char *root, int64_t max_bytes, int *removed, int64_t *freed,
                      void (*on_removed)(void *user, const kcache_item *it), void *user) {
    kcache_item *v;
    size_t n;
    *removed = 0;
    *freed = 0;
    kiln_status s = kcache_list(root, &v, &n);
    if (s) return s;
    int64_t total = 0;
    for (size_t i = 0; i < n; i++) total += v[i].bytes;
    qsort(v, n, sizeof *v, by_last_used);
    for (size_t i = 0; i < n && (total > max_bytes || v[i].interrupted) && !s; i++) {
        if ((s = kcache_remove(v[i].dir))) break;
        if (on_removed) on_removed(user, &v[i]);
        total -= v[i].bytes;
        *freed += v[i].bytes;
        ++*removed;
    }
    free(v);
    return s;
}
