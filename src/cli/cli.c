/* cli.c - option parsing and tensor-file helpers for the subcommands. */
#include "cli.h"

#include "base/base.h"
#include "cache/cache.h"
#include "model/model.h"
#include "tensor/dtype.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

int cli_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "kiln %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
}

int cli_usage_error(const char *cmd, const char *usage, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "kiln %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\nusage: %s\n(see kiln %s --help)\n", usage, cmd);
    va_end(ap);
    return 2;
}

int cli_fail(const char *cmd, kiln_status s) {
    return cli_error(cmd, "%s (%s error)", kiln_last_error(), kiln_status_name(s));
}

int cli_flag(char **argv, int i, const char *name) { return !strcmp(argv[i], name); }

/* An option given twice is refused (the later would silently win), except
 * those that take a list one value at a time. A process parses one command
 * line, so the options seen are kept here. */
static int seen_twice(const char *cmd, const char *name) {
    static const char *seen[128];
    static int nseen;
    static const char *const repeatable[] = {"--dim"};
    for (size_t k = 0; k < sizeof repeatable / sizeof *repeatable; k++)
        if (!strcmp(name, repeatable[k])) return 0;
    for (int k = 0; k < nseen; k++)
        if (!strcmp(seen[k], name)) {
            cli_error(cmd, "option %s is given twice: give it once", name);
            return 1;
        }
    if (nseen < 128) seen[nseen++] = name;
    return 0;
}

int cli_opt(const char *cmd, int argc, char **argv, int *i, const char *name, const char **val) {
    const char *a = argv[*i];
    size_t n = strlen(name);
    if (strncmp(a, name, n)) return 0;
    if (a[n] && a[n] != '=') return 0;
    if (seen_twice(cmd, name)) return -1;
    if (a[n] == '=') {
        *val = a + n + 1;
        return 1;
    }
    if (*i + 1 >= argc) {
        cli_error(cmd, "option %s needs a value", name);
        return -1;
    }
    *val = argv[++*i];
    return 1;
}

int cli_parse_int(const char *cmd, const char *opt, const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        cli_error(cmd, "%s %s: expected an integer in %ld..%ld", opt, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_parse_double(const char *cmd, const char *opt, const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v)) {
        cli_error(cmd, "%s %s: expected a number", opt, s);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_parse_u64(const char *cmd, const char *opt, const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || end == s || *end || s[0] == '-') {
        cli_error(cmd, "%s %s: expected a non-negative integer", opt, s);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_parse_hw(const char *cmd, const char *opt, const char *s, int *h, int *w) {
    char *x, *end;
    long hv = strtol(s, &x, 10);
    if (x == s || (*x != 'x' && *x != 'X')) goto bad;
    long wv = strtol(x + 1, &end, 10);
    if (end == x + 1 || *end || hv < 1 || wv < 1 || hv > 1 << 16 || wv > 1 << 16) goto bad;
    *h = (int)hv;
    *w = (int)wv;
    return 0;
bad:
    cli_error(cmd, "%s %s: expected HEIGHTxWIDTH, e.g. 128x128", opt, s);
    return -1;
}

const char cli_common_help[] =
    "common options:\n"
    "  --config FILE       config.json for a single-file checkpoint\n"
    "  --threads N         kernel threads (default: KILN_THREADS or all cores; at most 4 per\n"
    "                      online core: more only makes the kernels wait on each other)\n"
    "  --timings           print the timing ledger at exit (or KILN_TIMINGS=1)\n"
    "  --log LEVEL         quiet, error, warn, info or debug (or KILN_LOG)\n"
    "  --quiet             no progress lines and no warnings: errors only\n"
    "  --dtype bf16|f32    GEMM and attention precision (default bf16; f32 matches diffusers to 1e-5)\n"
    "  --reference         the reference kernels (plain loops, f32; the test oracle)\n"
    "  --backend NAME      cpu (default, or KILN_BACKEND), reference or check (the reference\n"
    "                      kernels on memory the host cannot touch: proves the backend boundary)\n"
    "  --quant SCHEME      none (default), int8 or fp8: quantize the model's block linear\n"
    "                      weights at conversion (int8: per-channel weights, per-token activations,\n"
    "                      int32 GEMM; fp8: e4m3 weights computed as bf16); see docs/cli.md\n"
    "  --quant-layers P    which layers: comma-separated name patterns, '!' excludes (default:\n"
    "                      the model family's; `kiln info` shows them)\n"
    "weight cache (see docs/cache.md):\n"
    "  --cache-dir DIR     cache root (default: KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln or\n"
    "                      ~/.cache/kiln; KILN_CACHE_DIR set empty: no cache, convert every time)\n"
    "  --name NAME         the model's folder in the cache (default: from MODEL)\n"
    "  --component NAME    the diffusers component (default: transformer)\n"
    "  --tokenizers DIR    an all-in-one single file's tokenizers, laid out as a diffusers pipeline\n"
    "                      folder (tokenizer/, tokenizer_2/, tokenizer_3/; optional scheduler/,\n"
    "                      model_index.json and <component>/config.json; docs/cli.md)\n"
    "  --no-create-cache   on a miss, convert but do not publish\n"
    "  --verify            check every tensor's hash on a hit\n"
    "  --mesh RxC --tp N --sp N --cfgp N --fsdp   the parallel part of the key\n"
    "execution (see docs/package.md):\n"
    "  --exec CHAIN        the steps to try, in order (default: KILN_EXEC or\n"
    "                      dynamic,fixed,planned,eager; `eager` alone runs op by op)\n"
    "  --no-package        skip compiled packages (same as --exec planned,eager)\n"
    "  --package-dir DIR   compiled packages (default: KILN_PACKAGE_DIR, else CACHE/packages)\n";

cli_common cli_common_defaults(void) {
    cli_common c;
    memset(&c, 0, sizeof c);
    kiln_load_opts d = kiln_load_defaults();
    c.mesh_rows = d.mesh_rows;
    c.mesh_cols = d.mesh_cols;
    c.parallel = d.parallel;
    c.dtype = KILN_DTYPE_INVALID; /* the backend's default: bf16 on the cpu one, else f32 */
    return c;
}

static int par_opt(const char *cmd, int argc, char **argv, int *i, const char *name, kiln_par_dim *d) {
    const char *v;
    int r = cli_opt(cmd, argc, argv, i, name, &v);
    if (r <= 0) return r;
    long n;
    if (cli_parse_int(cmd, name, v, 1, 4096, &n)) return -1;
    d->factor = (int)n;
    return 1;
}

int cli_common_opt(const char *cmd, int argc, char **argv, int *i, cli_common *c) {
    const char *v;
    int r;
    if ((r = cli_opt(cmd, argc, argv, i, "--cache-dir", &c->cache_dir)) ||
        (r = cli_opt(cmd, argc, argv, i, "--name", &c->name)) ||
        (r = cli_opt(cmd, argc, argv, i, "--component", &c->component)) ||
        (r = cli_opt(cmd, argc, argv, i, "--tokenizers", &c->tokenizers)) ||
        (r = par_opt(cmd, argc, argv, i, "--tp", &c->parallel.tp)) ||
        (r = par_opt(cmd, argc, argv, i, "--sp", &c->parallel.sp)) ||
        (r = par_opt(cmd, argc, argv, i, "--cfgp", &c->parallel.cfg)))
        return r;
    if ((r = cli_opt(cmd, argc, argv, i, "--mesh", &v)))
        return r < 0 || cli_parse_hw(cmd, "--mesh", v, &c->mesh_rows, &c->mesh_cols) ? -1 : 1;
    if ((r = cli_opt(cmd, argc, argv, i, "--dtype", &v))) {
        if (r < 0) return -1;
        if (!strcmp(v, "bf16") || !strcmp(v, "BF16")) c->dtype = KILN_BF16;
        else if (!strcmp(v, "f32") || !strcmp(v, "F32")) c->dtype = KILN_F32;
        else {
            cli_error(cmd, "--dtype %s: expected bf16 or f32", v);
            return -1;
        }
        return 1;
    }
    if ((r = cli_opt(cmd, argc, argv, i, "--quant", &v)))
        return r < 0 || cli_parse_quant(cmd, v, &c->quant) ? -1 : 1;
    if ((r = cli_opt(cmd, argc, argv, i, "--quant-layers", &c->quant_layers))) return r;
    if (cli_flag(argv, *i, "--reference")) {
        c->reference = 1;
        c->dtype = KILN_F32;
        return 1;
    }
    if ((r = cli_opt(cmd, argc, argv, i, "--backend", &c->backend))) {
        if (r > 0 && !kiln_backend_known(c->backend)) {
            cli_error(cmd, "--backend %s: unknown (the backends: %s)", c->backend, kiln_backends());
            return -1;
        }
        return r;
    }
    if (cli_flag(argv, *i, "--no-create-cache")) return c->no_create_cache = 1;
    if (cli_flag(argv, *i, "--no-package")) {
        c->exec = "planned,eager";
        return 1;
    }
    if ((r = cli_opt(cmd, argc, argv, i, "--exec", &c->exec))) return r;
    if ((r = cli_opt(cmd, argc, argv, i, "--package-dir", &c->package_dir))) return r;
    if (cli_flag(argv, *i, "--verify")) return c->verify = 1;
    if (cli_flag(argv, *i, "--fsdp")) return c->fsdp = 1;
    if ((r = cli_opt(cmd, argc, argv, i, "--config", &c->config))) return r;
    if ((r = cli_opt(cmd, argc, argv, i, "--threads", &v))) {
        long n;
        if (r < 0 || cli_parse_int(cmd, "--threads", v, 1, 4096, &n)) return -1;
        /* oversubscribed OpenMP threads spin against each other: 4096 on a few
         * cores ran 100x slower. Cap at CLI_THREADS_PER_CORE per online core. */
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        if (cores < 1) cores = 1;
        if (n > CLI_THREADS_PER_CORE * cores) {
            fprintf(stderr, "kiln %s: warning: --threads %ld is more than %d per online core (%ld cores); using %ld\n",
                    cmd, n, CLI_THREADS_PER_CORE, cores, CLI_THREADS_PER_CORE * cores);
            n = CLI_THREADS_PER_CORE * cores;
        }
        kiln_set_threads((int)n);
        return 1;
    }
    if ((r = cli_opt(cmd, argc, argv, i, "--log", &v))) {
        static const char *names[] = {"quiet", "error", "warn", "info", "debug"};
        if (r < 0) return -1;
        for (int k = 0; k < 5; k++)
            if (!strcmp(v, names[k])) {
                kiln_set_log_level((kiln_log_level)k);
                return 1;
            }
        cli_error(cmd, "--log %s: expected quiet, error, warn, info or debug", v);
        return -1;
    }
    if (cli_flag(argv, *i, "--timings")) {
        c->timings = 1;
        return 1;
    }
    if (cli_flag(argv, *i, "--quiet")) { /* errors only: no progress, no warnings (a later --log wins) */
        c->quiet = 1;
        kiln_set_log_level(KILN_LOG_ERROR);
        return 1;
    }
    return 0;
}

void cli_common_finish(const cli_common *c) {
    const char *e = getenv("KILN_TIMINGS");
    if (c->timings || (e && *e && strcmp(e, "0"))) {
        fprintf(stderr, "\ntimings:\n");
        kiln_timings_print(stderr);
    }
}

float *cli_tensor(const char *cmd, const st_file *f, const char *name, int ndim, int64_t *shape) {
    const st_tensor *t = st_find(f, name);
    if (!t) {
        cli_error(cmd, "%s: no tensor named %s", st_path(f), name);
        return NULL;
    }
    if (t->ndim != ndim) {
        cli_error(cmd, "%s: tensor %s has %d dims, expected %d", st_path(f), name, t->ndim, ndim);
        return NULL;
    }
    if (!kt_dtype_is_float_source(t->dtype)) {
        cli_error(cmd, "%s: tensor %s is %s; expected F32, F16 or BF16", st_path(f), name,
                  kiln_dtype_name(t->dtype));
        return NULL;
    }
    size_t n = (size_t)st_numel(t);
    float *out = malloc(sizeof(float) * (n ? n : 1));
    if (!out) {
        cli_error(cmd, "out of memory reading %s", name);
        return NULL;
    }
    kt_to_f32(t->dtype, t->data, out, n);
    size_t bad = kt_find_nonfinite(out, n); /* NaN or Inf in, error out: not NaN latents */
    if (bad < n) {
        cli_error(cmd, "%s: tensor %s holds %s at index %zu (inputs must be finite)", st_path(f), name,
                  kt_nonfinite_name(out[bad]), bad);
        free(out);
        return NULL;
    }
    memcpy(shape, t->shape, sizeof(int64_t) * (size_t)ndim);
    return out;
}

kiln_status cli_write_f32(const char *path, const char *name, const float *data, int ndim,
                          const int64_t *shape) {
    st_tensor t = {.name = name, .dtype = KILN_F32, .ndim = ndim, .data = data};
    size_t n = 1;
    for (int i = 0; i < ndim; i++) {
        t.shape[i] = shape[i];
        n *= (size_t)shape[i];
    }
    t.nbytes = n * sizeof(float);
    const char *meta[] = {"producer", "kiln " KILN_VERSION};
    return st_write(path, &t, 1, meta, 1);
}

/* path without a final ".safetensors" or ".png" (its length) */
static int stem_len(const char *path) {
    size_t n = strlen(path);
    const char *ext[] = {".safetensors", ".png"};
    for (int i = 0; i < 2; i++) {
        size_t e = strlen(ext[i]);
        if (n > e && !strcmp(path + n - e, ext[i]) && path[n - e - 1] != '/') return (int)(n - e);
    }
    return (int)n;
}

char *cli_preview_path(const char *path) { return kb_strfmt("%.*s.png", stem_len(path), path); }


char *cli_latents_path(const char *output) {
    size_t n = strlen(output);
    if ((size_t)stem_len(output) + 4 == n) return kb_strfmt("%.*s.safetensors", stem_len(output), output);
    return kb_strdup(output);
}

/* --output must end in ext (any case), what the command writes said in the message */
static int check_ext(const char *cmd, const char *path, const char *ext, const char *what) {
    size_t n = strlen(path), e = strlen(ext);
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    if (strlen(base) <= e || strcasecmp(path + n - e, ext))
        return cli_error(cmd, "--output %s: expected a file name ending in %s (%s)", path, ext, what);
    return cli_check_output(cmd, path);
}

int cli_check_png_output(const char *cmd, const char *path) {
    return check_ext(cmd, path, ".png", "kiln writes PNG images; several images are numbered: out.png gives out-0.png, "
                     "out-1.png ...");
}

int cli_check_st_output(const char *cmd, const char *path) {
    char what[96];
    snprintf(what, sizeof what, "kiln %s writes tensors in the safetensors format", cmd);
    return check_ext(cmd, path, ".safetensors", what);
}

int cli_check_output(const char *cmd, const char *path) {
    if (!*path) return cli_error(cmd, "--output is empty");
    if (kb_is_dir(path)) return cli_error(cmd, "--output %s is a folder; expected a file name", path);
    char *dir = kb_dirname(path);
    if (!dir) return cli_error(cmd, "out of memory");
    int rc = 0;
    if (!kb_is_dir(dir))
        rc = cli_error(cmd, "--output %s: the folder %s does not exist (checked before any work; create it first)",
                       path, dir);
    else if (access(dir, W_OK | X_OK))
        rc = cli_error(cmd, "--output %s: cannot write in %s: %s (checked before any work)", path, dir,
                       strerror(errno));
    free(dir);
    return rc;
}

/* Launchers tell each rank how many there are; kiln's MPI is started only by
 * a load on a mesh, so a plain `mpirun -np 2 kiln generate` never asks MPI. */
static int launcher_ranks(void) {
    const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS"};
    for (int i = 0; i < 4; i++) {
        const char *v = getenv(vars[i]);
        if (v && atoi(v) > 1) return atoi(v);
    }
    return 1;
}

kiln_status cli_check_ranks(const cli_common *c) {
    int n = launcher_ranks();
    int par = c->mesh_rows * c->mesh_cols > 1 || c->parallel.tp.factor > 1 || c->parallel.sp.factor > 1 ||
              c->parallel.cfg.factor > 1;
    if (n > 1 && !par)
        return kb_fail(KILN_ERR_INVALID_ARG,
                       "this is one of %d MPI ranks (mpirun -np %d) but no parallel mode is set: every rank would run "
                       "the whole job and write the same files; pass --tp N, --sp N, --cfgp N or --mesh RxC "
                       "(docs/distributed.md), or run kiln without mpirun",
                       n, n);
    return KILN_OK;
}

const char *cli_pipeline_component(const char *path, char *parent, size_t cap) {
    static const char *const comps[] = {"transformer", "text_encoder", "text_encoder_2", "text_encoder_3", "vae"};
    char tmp[1024];
    if (!path || snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp) return NULL;
    size_t n = strlen(tmp);
    while (n > 1 && tmp[n - 1] == '/') tmp[--n] = 0;
    char *base = strrchr(tmp, '/');
    const char *comp = NULL;
    for (size_t i = 0; i < sizeof comps / sizeof *comps; i++)
        if (!strcmp(base ? base + 1 : tmp, comps[i])) comp = comps[i];
    if (!comp || !kb_is_dir(path)) return NULL;
    if (base) *base = 0;
    else snprintf(tmp, sizeof tmp, ".");
    char *index = kb_path_join(base == tmp ? "/" : tmp, "model_index.json");
    int yes = index && kb_is_file(index);
    free(index);
    if (!yes) return NULL;
    snprintf(parent, cap, "%s", base == tmp ? "/" : tmp);
    return comp;
}

void cli_model_name(const char *path, char *buf, size_t cap) {
    /* a pipeline's component folder: the pipeline's name, so that `kiln cache
     * build PIPELINE/vae` makes the cache `kiln generate PIPELINE` maps */
    char parent[1024];
    if (cli_pipeline_component(path, parent, sizeof parent)) {
        cli_model_name(parent, buf, cap);
        return;
    }
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s", path);
    size_t n = strlen(tmp);
    while (n > 1 && tmp[n - 1] == '/') tmp[--n] = 0;
    char *base = strrchr(tmp, '/');
    base = base ? base + 1 : tmp;
    const char *ext = ".safetensors";
    size_t bl = strlen(base), el = strlen(ext);
    if (bl > el && !strcmp(base + bl - el, ext)) base[bl - el] = 0;
    /* a pipeline's component folder: name it after the pipeline */
    if (!strcmp(base, "transformer") && base > tmp) {
        base[-1] = 0;
        char *up = strrchr(tmp, '/');
        base = up ? up + 1 : tmp;
        if (!*base) base = "transformer";
    }
    size_t j = 0;
    for (const char *p = base; *p && j + 1 < cap; p++, j++) {
        int ok = isalnum((unsigned char)*p) || *p == '-' || *p == '_' || (*p == '.' && j > 0);
        buf[j] = ok ? *p : '-';
    }
    buf[j] = 0;
    if (!j || buf[0] == '.') snprintf(buf, cap, "model");
    /* two checkpoints in folders of one name (/a/m, /b/m, or names that
     * sanitize alike) must not share a name, or each would take the other's
     * caches for superseded ones: a short hash of the absolute path, m-3f2a91 */
    char real[PATH_MAX];
    const char *abs = realpath(path, real) ? real : path;
    unsigned h = (unsigned)(kcache_hash_bytes(abs, strlen(abs), 0x6e616d65) & 0xffffff);
    size_t l = strlen(buf);
    if (l > 90) l = 90; /* a key folder's name is at most 100 characters */
    if (cap > 8) snprintf(buf + (l + 8 < cap ? l : cap - 8), 8, "-%06x", h);
}

int cli_parse_quant(const char *cmd, const char *s, kiln_quant *q) {
    if (!strcmp(s, "none")) *q = KILN_QUANT_NONE;
    else if (!strcmp(s, "int8")) *q = KILN_QUANT_INT8;
    else if (!strcmp(s, "fp8")) *q = KILN_QUANT_FP8;
    else {
        cli_error(cmd, "--quant %s: expected none, int8 or fp8", s);
        return -1;
    }
    return 0;
}

int cli_is_pipeline(const char *path, const cli_common *c) {
    if (!path) return 0;
    if (kb_is_dir(path)) {
        char *index = kb_path_join(path, "model_index.json");
        int yes = index && kb_is_file(index);
        free(index);
        return yes;
    }
    return kiln_is_single_file(path) || (c && c->tokenizers && kb_is_file(path));
}

kiln_load_opts cli_load_opts(const char *model, const cli_common *c, char *name, size_t cap) {
    kiln_load_opts o = kiln_load_defaults();
    cli_model_name(model, name, cap);
    o.model_name = c->name ? c->name : name;
    char parent[1024];
    const char *pc = cli_pipeline_component(model, parent, sizeof parent);
    if (c->component) o.component = c->component;
    else if (pc) o.component = pc; /* PIPELINE/vae: component vae, as the pipeline keys it */
    o.cache_root = c->cache_dir;
    o.no_create_cache = c->no_create_cache;
    o.verify = c->verify;
    o.fsdp = c->fsdp;
    o.mesh_rows = c->mesh_rows;
    o.mesh_cols = c->mesh_cols;
    o.parallel = c->parallel;
    o.source = model;
    o.config_path = c->config;
    o.dtype = c->dtype;
    o.reference = c->reference;
    o.backend = c->backend;
    o.quant = c->quant;
    o.quant_layers = c->quant_layers;
    o.package_dir = c->package_dir;
    return o;
}

kiln_status cli_load_model(const char *model, const cli_common *c, kiln_model **out) {
    char name[128];
    kiln_load_opts o = cli_load_opts(model, c, name, sizeof name);
    kiln_status st = cli_check_ranks(c);
    if (st) return st;
    st = kiln_load_model(&o, out);
    /* a cache root this user cannot write (the README's /var/cache/kiln as a
     * non-root user): say what to do */
    const char *root = o.cache_root ? o.cache_root : getenv("KILN_CACHE_DIR");
    if (st == KILN_ERR_IO && root && *root && strstr(kiln_last_error(), strerror(EACCES))) {
        char why[1536];
        snprintf(why, sizeof why, "%s", kiln_last_error());
        st = kb_fail(st, "%s (the cache root %s is not writable by this user: choose one that is, e.g. "
                         "KILN_CACHE_DIR=$HOME/.cache/kiln, or --no-create-cache to only read it)", why, root);
    }
    if (!st && c->exec) st = kiln_model_set_exec(*out, c->exec);
    if (!st && c->package_dir) st = kiln_model_set_package_dir(*out, c->package_dir);
    if (st && *out) {
        kiln_model_free(*out);
        *out = NULL;
    }
    return st;
}

/* the family a model's config.json (or --config) names; NULL when there is
 * none to read or no family claims it (the load then says what is wrong) */
static const char *config_family(const char *model, const cli_common *c) {
    char *path = c->config ? kb_strdup(c->config) : model && kb_is_dir(model) ? kb_path_join(model, "config.json") : NULL;
    char *json = NULL;
    const char *f = NULL;
    if (path && kb_is_file(path) && !kb_read_file(path, &json, NULL)) f = kiln_config_family(json);
    kb_clear_error();
    free(path);
    free(json);
    return f;
}

const char *cli_config_family(const char *model, const cli_common *c) { return config_family(model, c); }

static kiln_status wrong_family(const char *model, const char *got, const char *family, const char *needs) {
    const char *t = kiln_family_title(got);
    return kb_fail(KILN_ERR_INVALID_ARG, "%s is a %s model (%s); this command needs %s (family %s)", model, got,
                   t ? t : "?", needs, family);
}

kiln_status cli_load_model_of(const char *model, const cli_common *c, const char *family, const char *needs,
                              kiln_model **out) {
    const char *f = config_family(model, c);
    if (f && strcmp(f, family)) return wrong_family(model, f, family, needs); /* before any conversion */
    kiln_status st = cli_load_model(model, c, out);
    if (!st && strcmp(kiln_model_family(*out), family)) {
        st = wrong_family(model, kiln_model_family(*out), family, needs);
        kiln_model_free(*out);
        *out = NULL;
    }
    return st;
}

/* seeded conditioning under diffusers' pipeline names */
kiln_status cli_write_seeded_cond(const char *path, const kiln_config *c, int T, uint64_t seed) {
    size_t ne = (size_t)T * (size_t)c->joint_attention_dim, np = (size_t)c->pooled_projection_dim;
    float *buf = malloc(sizeof(float) * 2 * (ne + np));
    if (!buf) return kb_fail(KILN_ERR_NOMEM, "out of memory");
    kiln_noise(seed, buf, ne);
    kiln_noise(seed + 1, buf + ne, np);
    kiln_noise(seed + 2, buf + ne + np, ne);
    kiln_noise(seed + 3, buf + 2 * ne + np, np);
    st_tensor t[4] = {
        {.name = "prompt_embeds", .dtype = KILN_F32, .ndim = 3, .shape = {1, T, c->joint_attention_dim},
         .data = buf, .nbytes = ne * 4},
        {.name = "pooled_prompt_embeds", .dtype = KILN_F32, .ndim = 2, .shape = {1, c->pooled_projection_dim},
         .data = buf + ne, .nbytes = np * 4},
        {.name = "negative_prompt_embeds", .dtype = KILN_F32, .ndim = 3,
         .shape = {1, T, c->joint_attention_dim}, .data = buf + ne + np, .nbytes = ne * 4},
        {.name = "negative_pooled_prompt_embeds", .dtype = KILN_F32, .ndim = 2,
         .shape = {1, c->pooled_projection_dim}, .data = buf + 2 * ne + np, .nbytes = np * 4},
    };
    kiln_status s = st_write(path, t, 4, NULL, 0);
    free(buf);
    return s;
}

void cli_step_progress(void *user, int step, int steps, double sigma, const float *latent) {
    (void)latent;
    cli_progress *p = user;
    double now = kb_now();
    if (!p->quiet) fprintf(stderr, "  step %d/%d  sigma %.4f  %.2f s\n", step, steps, sigma, now - p->last);
    p->last = now;
}

void cli_on_component(void *user, const char *component, const char *origin, double seconds) {
    const cli_load_progress *p = user;
    if (p->quiet) return;
    if (seconds < 0) fprintf(stderr, "%s: loading %s ...\n", p->cmd, component);
    else fprintf(stderr, "%s: %-15s %s, %.2f s\n", p->cmd, component, origin ? origin : "", seconds);
}
