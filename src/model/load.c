/* load.c - the load flow of kiln_load_model (docs/cache.md):
 *
 *   already loaded under the key         -> the same model again (refcount)
 *   no cache root, a source              -> convert every time, hint at KILN_CACHE_DIR
 *   no cache root, no source             -> error: the cache is required, how to set it
 *   complete cache                       -> map it (no conversion)
 *   no complete cache, no source         -> error "missing cache" with the path
 *   otherwise                            -> lock, convert, publish (unless asked not to), map
 *
 * A corrupt cache is reported, and rebuilt when a source is at hand. Several
 * processes missing one key: one converts under the key's file lock, the
 * others wait and then map what it published; if it dies, a waiter takes
 * over. Multi-process runs meet at a barrier after the check and after the
 * publish. */
#include "base/base.h"
#include "cache/cache.h"
#include "dist/dist.h"
#include "model/model.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LAYOUT_VERSION 6 /* bump when the conversion changes what a cache holds (2: AMX s8 and bf16 layouts;
                          * 3: linears a family keeps f32 in bf16 models, T5's q and k; 4: convolution
                          * weights packed for the fast convolution, ka_spec.conv; 5: the decoder's upsample
                          * convolutions in their sub-pixel form, ka_spec.up2; 6: the VAE's convolutions
                          * of the latent and the image kept f32, ka_spec.keep_f32) */

/* ---- loaded models: the documented process-wide registry ----------------------- */

static pthread_mutex_t g_reg_lock = PTHREAD_MUTEX_INITIALIZER;
static kiln_model **g_reg;
static size_t g_nreg;

static kiln_model *registry_get(const char *key) {
    kiln_model *m = NULL;
    pthread_mutex_lock(&g_reg_lock);
    for (size_t i = 0; i < g_nreg && !m; i++)
        if (!strcmp(g_reg[i]->registry_key, key)) {
            m = g_reg[i];
            m->refs++;
        }
    pthread_mutex_unlock(&g_reg_lock);
    return m;
}

static void registry_put(kiln_model *m, const char *key) {
    pthread_mutex_lock(&g_reg_lock);
    kiln_model **nr = realloc(g_reg, (g_nreg + 1) * sizeof *nr);
    if (nr && (m->registry_key = kb_strdup(key))) {
        g_reg = nr;
        g_reg[g_nreg++] = m;
    } else if (nr) {
        g_reg = nr;
    }
    pthread_mutex_unlock(&g_reg_lock);
}

void kiln_model_free(kiln_model *m) {
    if (!m) return;
    pthread_mutex_lock(&g_reg_lock);
    int last = --m->refs <= 0;
    if (last && m->registry_key)
        for (size_t i = 0; i < g_nreg; i++)
            if (g_reg[i] == m) {
                g_reg[i] = g_reg[--g_nreg];
                break;
            }
    pthread_mutex_unlock(&g_reg_lock);
    if (last) km_destroy(m);
}

/* ---- barrier ------------------------------------------------------------------------ */

static void (*g_barrier)(void *);
static void *g_barrier_user;

void kiln_set_barrier(void (*fn)(void *user), void *user) {
    g_barrier = fn;
    g_barrier_user = user;
}

/* a mesh meets at MPI_Barrier; otherwise the installed hook */
static void barrier(const kd_mesh *mesh) {
    if (mesh) kd_barrier(mesh);
    else if (g_barrier) g_barrier(g_barrier_user);
}

/* ---- the flow -------------------------------------------------------------------------- */

kiln_load_opts kiln_load_defaults(void) {
    kiln_load_opts o;
    memset(&o, 0, sizeof o);
    o.component = "transformer";
    o.mesh_rows = o.mesh_cols = 1;
    o.dtype = KILN_BF16;
    o.parallel.cfg.factor = o.parallel.tp.factor = o.parallel.sp.factor = 1;
    o.parallel.tp.axis = 1;
    o.parallel.sp.axis = 1;
    return o;
}

static int has_source(const kiln_load_opts *o) { return o->source || o->source_fn; }

/* A component of a file (its prefix) and a config given as text are part of
 * the source's identity: mixed into the file's hash */
static uint64_t part_hash(const kiln_load_opts *o, uint64_t h) {
    if (o->source_prefix && *o->source_prefix) h = kcache_hash_bytes(o->source_prefix, strlen(o->source_prefix), h ^ 0x70726566);
    if (o->source_config_text) h = kcache_hash_bytes(o->source_config_text, strlen(o->source_config_text), h ^ 0x636f6e66);
    return h;
}

/* Convert from the source: a model with owned weights in the compute layout. */
static kiln_status convert(const kiln_load_opts *o, km_compute cp, kiln_model **out) {
    kc_checkpoint *c = NULL;
    kiln_status st = o->source ? kc_open_part(o->source, o->source_prefix, o->config_path, o->source_config_text,
                                              ka_renamers(), &c)
                               : kc_from_source(o->source_fn, o->source_user, o->source_config_json,
                                                o->source_id, ka_renamers(), &c);
    if (!st) st = km_from_checkpoint(c, o->config_path ? o->config_path : c->path, cp, out);
    kc_close(c);
    return st;
}

/* Every input of the key, as the manifest records it and a hit compares
 * it (kcache_check_key): source is the source's identity for people and for
 * superseding (its absolute path, or a callback's source_id), source_hash
 * the content identity the key folder's name is derived from. */
static char *key_json(const kiln_load_opts *o, km_compute cp, const kcache_key *k, const char *source,
                      uint64_t source_hash) {
    cJSON *j = cJSON_CreateObject();
    if (!j) return NULL;
    char par[96];
    kcache_parallel_id(&o->parallel, par, sizeof par);
    cJSON_AddStringToObject(j, "model", o->model_name);
    cJSON_AddStringToObject(j, "component", o->component);
    cJSON_AddStringToObject(j, "parallel", par);
    int rows = o->mesh_rows, cols = o->mesh_cols;
    kd_infer_mesh(&o->parallel, &rows, &cols);
    cJSON_AddNumberToObject(j, "mesh_rows", rows);
    cJSON_AddNumberToObject(j, "mesh_cols", cols);
    /* on a mesh: this rank's folder under the key ("/host_coords_.../shard_tp0of2") */
    cJSON_AddStringToObject(j, "part", k->path + strlen(k->dir));
    cJSON_AddStringToObject(j, "dtype", kiln_dtype_name(cp.dtype));
    cJSON_AddBoolToObject(j, "fsdp", o->fsdp);
    cJSON_AddStringToObject(j, "layout", kk_packs(cp.be) ? km_compute_layout(cp) : "rowmajor");
    char qt[64];
    km_quant_tag(&cp, qt, sizeof qt);
    cJSON_AddStringToObject(j, "quant", *qt ? qt : "none");
    if (*qt) cJSON_AddStringToObject(j, "quant_layers", cp.quant_default ? "default" : cp.quant_layers);
    cJSON_AddNumberToObject(j, "layout_version", LAYOUT_VERSION);
    if (o->host_coords) {
        cJSON *h = cJSON_AddArrayToObject(j, "host_coords");
        int v[4] = {o->host_r0, o->host_r1, o->host_c0, o->host_c1};
        for (int i = 0; i < 4; i++) cJSON_AddItemToArray(h, cJSON_CreateNumber(v[i]));
    }
    if (source) {
        char hx[20];
        snprintf(hx, sizeof hx, "%016llx", (unsigned long long)source_hash);
        cJSON_AddStringToObject(j, "source", source);
        cJSON_AddStringToObject(j, "source_hash", hx);
    }
    cJSON_AddStringToObject(j, "content", k->content);
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    return s;
}

/* Convert the source into the cache under the key (lock held), one tensor
 * at a time: read, shard, pack, write, free, and give the source's pages
 * back, so the peak memory is the largest tensor, not the model. */
typedef struct stream {
    const kc_checkpoint *c;
    const ka_spec *spec;
    const km_compute *cp;
    km_weight w;             /* the tensor being written */
    char fsdp_layout[32];
} stream;

static kiln_status stream_produce(void *user, size_t i, kcache_tensor *t) {
    stream *x = user;
    const ka_spec *s = &x->spec[i];
    kiln_status st = km_convert_tensor(x->c, s, x->cp, &x->w, NULL);
    if (st) return st;
    const km_weight *w = &x->w;
    size_t full = w->packed ? w->packed_bytes : sizeof(float) * ka_numel(w->ndim, w->shape);
    if (x->cp->fsdp > 1 && s->block >= 0) { /* FSDP: this rank's byte range only */
        size_t off, len;
        km_fsdp_range(full, x->cp->fsdp, x->cp->fsdp_index, &off, &len);
        snprintf(x->fsdp_layout, sizeof x->fsdp_layout, "fsdp%dof%d", x->cp->fsdp_index, x->cp->fsdp);
        *t = (kcache_tensor){.name = w->name, .dtype = KILN_U8, .ndim = 1, .shape = {(int64_t)len}, .layout = x->fsdp_layout,
                             .data = (const uint8_t *)(w->packed ? w->packed : (const void *)w->data) + off, .nbytes = len};
        return KILN_OK;
    }
    if (w->packed)
        *t = (kcache_tensor){.name = w->name, .dtype = w->packed_dtype, .ndim = w->ndim, .layout = w->layout,
                             .data = w->packed, .nbytes = w->packed_bytes};
    else
        *t = (kcache_tensor){.name = w->name, .dtype = KILN_F32, .ndim = w->ndim, .layout = "rowmajor", .data = w->data,
                             .nbytes = full};
    memcpy(t->shape, w->shape, sizeof t->shape);
    return KILN_OK;
}

static void stream_release(void *user, size_t i) {
    stream *x = user;
    km_weight_free(&x->w);
    kc_release(x->c, kc_find(x->c, x->spec[i].name));
}

static kiln_status convert_publish(const kiln_load_opts *o, km_compute cp, const kcache_key *k, const char *kj) {
    kc_checkpoint *c = NULL;
    kiln_status st = o->source ? kc_open_part(o->source, o->source_prefix, o->config_path, o->source_config_text,
                                              ka_renamers(), &c)
                               : kc_from_source(o->source_fn, o->source_user, o->source_config_json,
                                                o->source_id, ka_renamers(), &c);
    kiln_model *m = NULL;
    ka_spec *spec = NULL;
    size_t ns = 0;
    char *cfg = NULL;
    if (!st) st = km_prepare(c, o->config_path ? o->config_path : c->path, cp, &m, &spec, &ns);
    if (!st && !(cfg = m->arch->config_to_json(m->cfg))) st = kb_fail(KILN_ERR_NOMEM, "out of memory publishing");
    if (!st && !kj) st = kb_fail(KILN_ERR_NOMEM, "out of memory publishing");
    if (!st) {
        stream x = {.c = c, .spec = spec, .cp = &m->compute};
        st = kcache_publish_stream(k, kj, cfg, ns, stream_produce, stream_release, &x);
        km_weight_free(&x.w);
    }
    free(cfg);
    free(spec);
    km_destroy(m);
    kc_close(c);
    return st;
}

/* Without a source the content hash is unknown: find the key folder by its
 * prefix (superseded ones are removed on publish, so normally there is one;
 * otherwise the most recently used complete one). When none is complete,
 * whatever else is there (a file or a symlink in place of the folder, a
 * manifest that is not a file) is taken, so that the load says what is
 * wrong with it instead of "missing". */
static void resolve_without_source(kcache_key *k) {
    char host[200] = ""; /* [/host_coords_...][/shard_...] */
    snprintf(host, sizeof host, "%s", k->path + strlen(k->dir));
    DIR *d = opendir(k->group);
    if (!d) return;
    size_t pl = strlen(k->prefix);
    double best = -1, other = -1;
    char other_content[32] = "";
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *n = e->d_name;
        if (strncmp(n, k->prefix, pl) || strncmp(n + pl, "_c", 2) || strlen(n) != pl + 14) continue;
        char *man = kb_strfmt("%s/%s%s/" KCACHE_MANIFEST, k->group, n, host);
        char *dir = kb_strfmt("%s/%s", k->group, n);
        struct stat st;
        if (man && dir && lstat(dir, &st) == 0) {
            double t = (double)st.st_mtim.tv_sec + 1e-9 * (double)st.st_mtim.tv_nsec;
            if (S_ISDIR(st.st_mode) && kb_is_file(man)) {
                if (t > best) {
                    best = t;
                    snprintf(k->content, sizeof k->content, "%.12s", n + pl + 2);
                }
            } else if (t > other) {
                other = t;
                snprintf(other_content, sizeof other_content, "%.12s", n + pl + 2);
            }
        }
        free(man);
        free(dir);
    }
    closedir(d);
    if (best < 0 && other < 0) return;
    if (best < 0) snprintf(k->content, sizeof k->content, "%s", other_content);
    snprintf(k->name, sizeof k->name, "%s_c%s", k->prefix, k->content);
    snprintf(k->dir, sizeof k->dir, "%s/%s", k->group, k->name);
    snprintf(k->path, sizeof k->path, "%s%s", k->dir, host);
}

static kiln_status finish_hit(kcache_entry *e, km_compute cp, const char *origin, kiln_model **out) {
    kiln_model *m;
    kiln_status st = km_from_cache(e, cp, &m);
    if (st) {
        kcache_close(e);
        return st;
    }
    snprintf(m->origin, sizeof m->origin, "%s", origin);
    m->cache_path = kb_strdup(e->path);
    *out = m;
    return KILN_OK;
}

/* The source's config.json text when there is one to compare with (a
 * folder's config.json or --config, a callback's config); NULL otherwise
 * (a single-file checkpoint infers its config from the tensors). */
static char *source_config(const kiln_load_opts *o) {
    char *text = NULL;
    if (o->source_fn) return o->source_config_json ? kb_strdup(o->source_config_json) : NULL;
    if (!o->source) return NULL;
    if (o->source_config_text) return kb_strdup(o->source_config_text);
    char *path = o->config_path ? kb_strdup(o->config_path)
                 : kb_is_dir(o->source) ? kb_path_join(o->source, "config.json") : NULL;
    if (path && kb_is_file(path) && kb_read_file(path, &text, NULL)) text = NULL;
    free(path);
    return text;
}

/* The config a cache was made from must be the source's: both parsed and
 * written back the one way, then compared. */
static kiln_status check_config(const kiln_load_opts *o, const kcache_entry *e) {
    char *src = source_config(o);
    if (!src) return KILN_OK;
    const ka_arch *fa = NULL, *fb = NULL;
    void *a = NULL, *b = NULL;
    char *ja = NULL, *jb = NULL;
    kiln_status st = KILN_OK;
    if (km_config_parse(src, NULL, &fa, &a) || !(ja = fa->config_to_json(a))) {
        free(src);
        free(a);
        return KILN_OK; /* the conversion will say what is wrong with it */
    }
    if (km_config_parse(e->config_json ? e->config_json : "", NULL, &fb, &b) || !(jb = fb->config_to_json(b)))
        st = kb_fail(KILN_ERR_CORRUPT, "cache %s is corrupt: its config does not parse", e->path);
    else if (strcmp(ja, jb))
        st = kb_fail(KILN_ERR_CORRUPT, "cache %s was made from another config: it has %s, the source has %s", e->path,
                     jb, ja);
    free(src);
    free(a);
    free(b);
    free(ja);
    free(jb);
    return st;
}

/* A hit: a real folder (the key folder too, where this rank's part is a
 * sub-folder), a manifest signed by this user with the key asked for
 * (without a source: all but the source), the source's config, tensors
 * the config needs. KILN_ERR_CACHE_MISSING or KILN_ERR_CORRUPT (with the
 * reason) when it is not one. */
static kiln_status open_hit(const kiln_load_opts *o, km_compute cp, const kcache_key *k, const char *kj,
                            const char *origin, kiln_model **out) {
    static const char *const no_source[] = {"source", "source_hash", NULL};
    kcache_entry *e = NULL;
    kiln_status st = strcmp(k->dir, k->path) ? kcache_check_dir(k->dir) : KILN_OK;
    if (!st) st = kcache_open(k->path, o->verify, &e);
    if (!st) st = kcache_check_key(e, kj, has_source(o) ? NULL : no_source);
    if (!st && has_source(o)) st = check_config(o, e);
    if (st) {
        kcache_close(e);
        return st;
    }
    return finish_hit(e, cp, origin, out);
}

/* Whatever stands at p where a cache folder belongs (a file, a symlink, a
 * damaged folder) goes; the symlink itself, never what it points at. */
static kiln_status clear_path(const char *p) {
    struct stat st;
    if (lstat(p, &st) != 0) return KILN_OK;
    if (S_ISDIR(st.st_mode)) return kcache_remove(p);
    kb_log(KILN_LOG_WARN, "removing %s: a %s stands where a cache folder belongs", p,
           S_ISLNK(st.st_mode) ? "symbolic link" : "file");
    if (unlink(p) != 0 && errno != ENOENT) return kb_fail(KILN_ERR_IO, "cannot remove %s: %s", p, strerror(errno));
    return KILN_OK;
}

/* Whether this process may create files at path: its nearest existing
 * folder writable, on a file system mounted read-write. */
static int writable(const char *path) {
    char *p = kb_strdup(path);
    int ok = 1;
    while (p) {
        struct stat st;
        if (stat(p, &st) == 0) { /* the nearest existing folder on the path (a file there: nothing can be made) */
            struct statvfs vfs;
            ok = S_ISDIR(st.st_mode) && access(p, W_OK) == 0 && !(statvfs(p, &vfs) == 0 && (vfs.f_flag & ST_RDONLY));
            break;
        }
        char *up = strrchr(p, '/');
        if (!up || up == p) break;
        *up = 0;
    }
    free(p);
    return ok;
}

static kiln_status load_model(const kiln_load_opts *o, kiln_model **out);
/* The part of the model a rank holds, as a folder name: "tp1of2" (tensor
 * parallel shard 1 of 2), "full" (replicated: CFG or sequence parallel). */
static void shard_name(const kd_mesh *mesh, char *buf, size_t cap) {
    size_t l = 0;
    buf[0] = 0;
    if (mesh->size[KD_TP] > 1) l += (size_t)snprintf(buf, cap, "tp%dof%d", mesh->index[KD_TP], mesh->size[KD_TP]);
    if (mesh->size[KD_FSDP] > 1 && l < cap)
        snprintf(buf + l, cap - l, "%sfsdp%dof%d", l ? "_" : "", mesh->index[KD_FSDP], mesh->size[KD_FSDP]);
    if (!buf[0]) snprintf(buf, cap, "full");
}

static kiln_status load_flow(const kiln_load_opts *o, km_compute cp, const kd_mesh *mesh, int rows, int cols,
                             kiln_model **out);

kiln_status kiln_load_model(const kiln_load_opts *o, kiln_model **out) {
    kiln_status st = load_model(o, out);
    if (!st && o->package_dir && (st = kiln_model_set_package_dir(*out, o->package_dir))) {
        kiln_model_free(*out);
        *out = NULL;
    }
    if (st || (*out)->exec.cache_root) return st;
    /* packages live beside the weights by default */
    const char *root = kcache_root(o->cache_root);
    if (root && !((*out)->exec.cache_root = kb_strdup(root))) {
        kiln_model_free(*out);
        *out = NULL;
        return KILN_ERR_NOMEM;
    }
    return KILN_OK;
}

static kiln_status load_model(const kiln_load_opts *o, kiln_model **out) {
    if (!o || !out) return kb_fail(KILN_ERR_INVALID_ARG, "kiln_load_model: options and out are required");
    *out = NULL;
    if (o->source && o->source_fn)
        return kb_fail(KILN_ERR_INVALID_ARG, "kiln_load_model: give a source path or a source callback, not both");
    if (o->source_fn && (!o->source_id || !*o->source_id))
        return kb_fail(KILN_ERR_INVALID_ARG, "kiln_load_model: a source callback needs a source_id (it keys the cache)");
    km_compute cp;
    kiln_status st = km_compute_resolve(o->dtype, o->reference, o->backend, &cp);
    if (!st) st = km_compute_set_quant(&cp, o->quant, o->quant_layers);
    if (!st) st = km_family_named(o->family, &cp.family);
    if (st) return st;
    /* a mesh: given, or the one the factors span (--tp 2 alone is a 1x2 mesh) */
    int rows = o->mesh_rows, cols = o->mesh_cols;
    kd_infer_mesh(&o->parallel, &rows, &cols);
    kd_mesh *mesh = NULL;
    if ((int64_t)rows * cols > 1) {
        if ((st = kd_mesh_create(rows, cols, &o->parallel, o->fsdp, &mesh))) return st;
        cp.tp = mesh->size[KD_TP];
        cp.tp_index = mesh->index[KD_TP];
        cp.fsdp = mesh->size[KD_FSDP];
        cp.fsdp_index = mesh->index[KD_FSDP];
        if (cp.fsdp > 1 && cp.quant) {
            kd_mesh_free(mesh);
            return kb_fail(KILN_ERR_UNSUPPORTED, "FSDP with a quantized backbone (--quant %s) is not supported yet",
                           kiln_quant_name(cp.quant));
        }
    }
    st = load_flow(o, cp, mesh, rows, cols, out);
    if (!st && mesh && !(*out)->mesh) (*out)->mesh = mesh; /* the model owns its mesh from here */
    else kd_mesh_free(mesh);
    return st;
}

static kiln_status load_flow(const kiln_load_opts *o, km_compute cp, const kd_mesh *mesh, int rows, int cols,
                             kiln_model **out) {
    char shard[32] = "";
    if (mesh) shard_name(mesh, shard, sizeof shard);
    char qtag[64];
    km_quant_tag(&cp, qtag, sizeof qtag);
    double t0 = kb_now();
    const char *root = kcache_root(o->cache_root);
    kiln_status st;

    if (!root && cp.fsdp > 1) /* every rank fails here alike: no barrier to match */
        return kb_fail(KILN_ERR_INVALID_ARG, "FSDP needs the weight cache (each rank maps only its part of every "
                       "block): set KILN_CACHE_DIR or pass --cache-dir / kiln_load_opts.cache_root");
    if (!root) {
        if (!has_source(o))
            return kb_fail(KILN_ERR_INVALID_ARG,
                           "the weight cache is required: there is no cache root (set KILN_CACHE_DIR, or "
                           "pass --cache-dir / kiln_load_opts.cache_root) and no source checkpoint to convert from");
        /* the advice once a process (a pipeline would give it for each of
         * its five components); each later conversion at the debug level */
        static int warned;
        int first = !__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED);
        kb_log(first ? KILN_LOG_WARN : KILN_LOG_DEBUG, "no cache root: converting %s on every start%s",
               o->source ? o->source : o->source_id,
               first ? "; set KILN_CACHE_DIR (or --cache-dir) to convert once and map the result afterwards" : "");
        uint64_t h = 0;
        if (o->source && (st = kcache_source_hash_path(o->source, o->config_path, &h))) return st;
        if (o->source) h = part_hash(o, h);
        if (!o->source) h = kcache_hash_bytes(o->source_id, strlen(o->source_id), 1);
        char rkey[200];
        snprintf(rkey, sizeof rkey, "no-cache:%016llx:%d:%s:%s:%s:%s", (unsigned long long)h, (int)cp.dtype, cp.be->name,
                 shard, qtag, cp.family ? cp.family->name : "");
        if ((*out = registry_get(rkey))) return KILN_OK;
        if ((st = convert(o, cp, out))) return st;
        snprintf((*out)->origin, sizeof (*out)->origin, "no-cache");
        registry_put(*out, rkey);
        kb_ledger_event("weight_load", kb_now() - t0, 0, "miss: no cache root, converted");
        return KILN_OK;
    }

    kcache_key_inputs in = {
        .model = o->model_name, .component = o->component ? o->component : "transformer",
        .parallel = o->parallel, .mesh_rows = rows, .mesh_cols = cols,
        .dtype = cp.dtype, .fsdp = o->fsdp, .layout = km_compute_layout(cp), .layout_version = LAYOUT_VERSION,
        .quant = qtag,
        .host_coords = o->host_coords, .host_r0 = o->host_r0, .host_r1 = o->host_r1,
        .host_c0 = o->host_c0, .host_c1 = o->host_c1, .shard = shard,
    };
    /* a run spanning several hosts: each publishes the mesh rows and columns it owns */
    if (mesh && !o->host_coords && mesh->host_coords) {
        in.host_coords = 1;
        in.host_r0 = mesh->host_r0, in.host_r1 = mesh->host_r1;
        in.host_c0 = mesh->host_c0, in.host_c1 = mesh->host_c1;
    }
    if (o->source && (st = kcache_source_hash_path(o->source, o->config_path, &in.source_hash))) return st;
    if (o->source) in.source_hash = part_hash(o, in.source_hash);
    if (o->source_fn) in.source_hash = kcache_hash_bytes(o->source_id, strlen(o->source_id), 1);
    kcache_key k;
    if ((st = kcache_key_make(root, &in, &k))) return st;
    if (!has_source(o)) resolve_without_source(&k);
    /* loaded models by cache folder, family (two families may read one cache)
     * and backend (the reference and check backends read one cache) */
    char regkey[sizeof k.path + 120];
    snprintf(regkey, sizeof regkey, "%s#%s#%s", k.path, cp.family ? cp.family->name : "", cp.be->name);
    /* the source's identity: its absolute path (a callback: its source_id) */
    char source[PATH_MAX + 1] = "";
    if (o->source && !realpath(o->source, source)) snprintf(source, sizeof source, "%s", o->source);
    if (o->source && o->source_prefix && *o->source_prefix) /* one component of the file: file#prefix */
        snprintf(source + strlen(source), sizeof source - strlen(source), "#%s", o->source_prefix);
    if (o->source_fn) snprintf(source, sizeof source, "%s", o->source_id);
    char *kj = key_json(o, cp, &k, has_source(o) ? source : NULL, in.source_hash);
    if (!kj) return kb_fail(KILN_ERR_NOMEM, "out of memory making the cache key");

    if ((*out = registry_get(regkey))) {
        free(kj);
        return KILN_OK;
    }

    kiln_model *m = NULL;
    /* a cache another user could have written is never served (docs/trust.md) */
    st = kcache_check_trust(root, k.path);
    if (!st) st = open_hit(o, cp, &k, kj, "hit", &m);
    barrier(mesh); /* every rank has looked before anyone writes */
    if (!st) {
        kcache_touch(k.dir);
        barrier(mesh);
        free(kj);
        registry_put(m, regkey);
        kb_ledger_event("weight_load", kb_now() - t0, 1, "hit");
        *out = m;
        return KILN_OK;
    }
    if (st != KILN_ERR_CACHE_MISSING && st != KILN_ERR_CORRUPT && st != KILN_ERR_UNTRUSTED) {
        barrier(mesh);
        free(kj);
        return st;
    }
    if (!has_source(o)) {
        barrier(mesh);
        free(kj);
        if (st == KILN_ERR_UNTRUSTED) return kb_wrap(st, "no source checkpoint to convert from instead");
        if (st == KILN_ERR_CACHE_MISSING)
            return kb_fail(KILN_ERR_CACHE_MISSING,
                           "missing cache: no complete cache at %s and no source checkpoint to build it from "
                           "(run `kiln cache build`, or pass the checkpoint)", k.path);
        return kb_wrap(st, "cannot rebuild without a source checkpoint");
    }
    char reason[600];
    snprintf(reason, sizeof reason, "miss: %s", kiln_last_error());
    int corrupt = st == KILN_ERR_CORRUPT, untrusted = st == KILN_ERR_UNTRUSTED;
    if (corrupt) kb_log(KILN_LOG_WARN, "%s; rebuilding it from %s", kiln_last_error(), o->source ? o->source : o->source_id);

    /* a read-only root (or one this user may not write): nothing can be
     * locked or published, so convert in memory, as without a root */
    int fd = -1, in_memory = 0;
    struct stat gst;
    if (untrusted) {
        /* nothing is locked, cleared or published where another user could write: in memory */
        static int warned;
        int first = !__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED);
        kb_log(first ? KILN_LOG_WARN : KILN_LOG_DEBUG, "%s; converting %s in memory, nothing is published there%s",
               reason + 6, o->source ? o->source : o->source_id,
               first ? " (use a cache root only this user and root can write: --cache-dir or KILN_CACHE_DIR)" : "");
        in_memory = 1;
    } else if (lstat(k.group, &gst) == 0 && !S_ISDIR(gst.st_mode)) {
        barrier(mesh);
        free(kj);
        return kb_fail(KILN_ERR_IO, "%s is not a folder: something else stands where the caches of %s/%s belong "
                       "(remove it, or pick another cache root)", k.group, in.model, in.component);
    }
    if (!in_memory && (st = kcache_lock(&k, &fd))) {
        if (!writable(k.group)) {
            /* once a process (a pipeline has five components); each later one at the debug level */
            static int warned;
            int first = !__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED);
            kb_log(first ? KILN_LOG_WARN : KILN_LOG_DEBUG, "cache root %s cannot be written (%s): converting %s in "
                   "memory, nothing is published%s", root, kiln_last_error(), o->source ? o->source : o->source_id,
                   first ? " (pick a root this user can write: --cache-dir or KILN_CACHE_DIR)" : "");
            in_memory = 1;
            fd = -1;
        } else {
            barrier(mesh);
            free(kj);
            return st;
        }
    }
    if (!in_memory && kcache_check_trust(root, k.path) == KILN_ERR_UNTRUSTED) {
        /* another user made a folder on the path while this process waited: not ours to use or clear */
        kb_log(KILN_LOG_WARN, "%s; converting in memory, nothing is published there", kiln_last_error());
        kcache_unlock(fd);
        fd = -1;
        in_memory = 1;
    }
    if (!in_memory) {
        /* someone may have published while we waited for the lock */
        kiln_status again = open_hit(o, cp, &k, kj, "hit", &m);
        if (!again) {
            kcache_unlock(fd);
            barrier(mesh);
            free(kj);
            registry_put(m, regkey);
            kb_ledger_event("weight_load", kb_now() - t0, 1, "hit: published by another process");
            *out = m;
            return KILN_OK;
        }
        if (again != KILN_ERR_CACHE_MISSING && again != KILN_ERR_CORRUPT) { /* out of memory, say: remove nothing */
            kcache_unlock(fd);
            barrier(mesh);
            free(kj);
            return again;
        }
        /* a corrupt or incomplete folder, or a file or symlink in its place:
         * the key folder itself when it is not a real folder (never anything
         * through it: a symlink may point at another model's cache), else
         * this rank's folder */
        struct stat dst;
        int dir_real = lstat(k.dir, &dst) != 0 || S_ISDIR(dst.st_mode);
        st = !dir_real || !strcmp(k.dir, k.path) ? clear_path(k.dir) : clear_path(k.path);
        if (!st) kcache_clean_staging(&k); /* leftovers of a converter that died */
        if (st) {
            kcache_unlock(fd);
            barrier(mesh);
            free(kj);
            return st;
        }
    }
    int publish_it = !o->no_create_cache && !in_memory;
    if (publish_it) { /* tensor by tensor into the cache, then map it: a hit and a miss run on the same bytes */
        st = convert_publish(o, cp, &k, kj);
        kcache_entry *e = NULL;
        if (!st) st = kcache_open(k.path, 0, &e);
        if (!st) st = finish_hit(e, cp, corrupt ? "rebuilt" : "miss", &m);
    } else {
        st = convert(o, cp, &m);
        if (!st) snprintf(m->origin, sizeof m->origin, "miss");
    }
    kcache_unlock(fd);
    if (!st && publish_it) kcache_remove_superseded(&k, source);
    barrier(mesh); /* published before anyone looks again */
    free(kj);
    if (st) {
        km_destroy(m);
        return st;
    }
    registry_put(m, regkey);
    kb_ledger_event("weight_load", kb_now() - t0, 0, corrupt ? "rebuilt: cache was corrupt" : reason);
    *out = m;
    return KILN_OK;
}
