/* package.c - weightless compiled packages: a folder holding the generated
 * C source, the shared object built from it, and manifest.json (format
 * version, kiln version, CPU features, compiler and flags, symbols and
 * ranges, guards, inputs, the memory plan, every weight's name, dtype,
 * shape and layout, the SHA-256 of the shared object) with its signature
 * under this user's key. Published atomically (a private staging folder,
 * then rename) with no group/other write whatever the umask; opened lazily,
 * and only through trusted folders (the trust section below). The manifest
 * parser is manifest.c. docs/package.md describes the format and the trust
 * model. */
#define _GNU_SOURCE
#include "base/base.h"
#include "compile/compile.h"
#include "compile/manifest.h"
#include "tensor/dtype.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <dlfcn.h>
#include <signal.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define PKG_MAGIC "kiln-package"
#define PKG_LIB "model.so"
#define PKG_SRC "model.c"
#define PKG_MANIFEST "manifest.json"
#define PKG_MANIFEST_MAX (64u << 20)
#define PKG_SIG "signature"
#define PKG_LOG "build.log"
#define PKG_CFLAGS "-O2 -fPIC -shared"

void kx_rt_init(kx_rt *rt, const kg_ctx *ctx) {
    memset(rt, 0, sizeof *rt);
    rt->abi = KX_ABI;
    rt->ctx = ctx;
    for (int i = 0; i < KG_OP_COUNT; i++) rt->run[i] = kg_runner(ctx->be, (kg_op)i);
}


/* ---- open, load, run ------------------------------------------------------------- */

struct kx_package {
    char *dir;
    kx_manifest *m; /* parsed only after its signature was verified */
    /* loaded on first use, in the process that uses it */
    int loaded;
    kiln_status load_st;
    char *load_err;
    void *dl;
    int (*fwd)(const kx_rt *, const int64_t *, void *const *);
    int (*consts)(const kx_rt *, const int64_t *, void *const *);
    kg_ctx ctx;
    kx_rt rt;
    void **P;
    void *arena;
    void *const_area;              /* the shape constants, computed for const_s */
    int64_t const_s[KX_MAX_SYMS];
    int consts_valid;
};

const char *kx_package_dir(const kx_package *p) { return p->dir; }
const char *kx_package_summary(const kx_package *p) { return p->m->summary; }

int kx_package_fixed(const kx_package *p) {
    for (int i = 0; i < p->m->nsym; i++)
        if (p->m->sym[i].lo != p->m->sym[i].hi) return 0;
    return 1;
}

void kx_package_close(kx_package *p) {
    if (!p) return;
    if (p->dl) dlclose(p->dl);
    kx_manifest_free(p->m);
    free(p->P);
    kk_buf_free(p->ctx.be, p->arena);
    kk_buf_free(p->ctx.be, p->const_area);
    free(p->load_err);
    free(p->dir);
    free(p);
}

/* ---- trust: who could have written this package ------------------------------ */
/* A package is code: it is opened only through folders and files that this
 * user or root owns and that neither group nor others may write (ssh's
 * StrictModes), from the package root down, with no symbolic link inside
 * the root; its manifest must carry this user's signature (kb_sign), and
 * the manifest holds model.so's SHA-256. Every check reads an open
 * descriptor, and the descriptor checked is the one hashed and loaded, so
 * nothing can be swapped between the check and the use. docs/package.md. */

static kiln_status check_owner(const char *dir, const char *what, const char *shown, const struct stat *sb) {
    if (sb->st_uid != geteuid() && sb->st_uid != 0)
        return kb_fail(KILN_ERR_CORRUPT, "package %s: %s %s is owned by uid %u, not by this user (%u) or root; refused", dir,
                       what, shown, (unsigned)sb->st_uid, (unsigned)geteuid());
    if (sb->st_mode & 022)
        return kb_fail(KILN_ERR_CORRUPT, "package %s: %s %s is writable by %s (mode 0%03o); refused", dir, what, shown,
                       sb->st_mode & 002 ? "others" : "its group", (unsigned)(sb->st_mode & 07777));
    return KILN_OK;
}

/* name in the folder at (its path shown in messages), as a folder
 * descriptor; follow: may be a symbolic link (the package root itself) */
static kiln_status open_folder(int at, const char *name, const char *dir, const char *what, const char *shown, int follow,
                               int *out) {
    int fd = openat(at, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC | (follow ? 0 : O_NOFOLLOW));
    struct stat sb;
    if (fd < 0) {
        int err = errno;
        if (!follow && fstatat(at, name, &sb, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(sb.st_mode))
            return kb_fail(KILN_ERR_CORRUPT, "package %s: %s %s is a symbolic link; refused", dir, what, shown);
        return kb_fail(err == ENOENT ? KILN_ERR_MISSING : KILN_ERR_IO, "package %s: cannot open %s %s: %s", dir, what, shown,
                       strerror(err));
    }
    kiln_status st = fstat(fd, &sb) != 0 ? kb_fail(KILN_ERR_IO, "package %s: cannot stat %s %s", dir, what, shown)
                                         : check_owner(dir, what, shown, &sb);
    if (st) close(fd);
    else *out = fd;
    return st;
}

/* The package folder dir = <root>/<family>/<name> (the layout kx_compile
 * publishes), opened through the trust checks of the root, the family
 * folder and the package folder; the path above the root is the user's
 * choice (it may sit under /tmp). */
static kiln_status open_trusted_dir(const char *dir, int *out) {
    char *copy = kb_strdup(dir);
    if (!copy) return KILN_ERR_NOMEM;
    size_t n = strlen(copy);
    while (n > 1 && copy[n - 1] == '/') copy[--n] = 0;
    char *slash = strrchr(copy, '/'), *name = slash ? slash + 1 : NULL, *fam = NULL;
    const char *root = NULL;
    if (slash) {
        while (slash > copy && slash[-1] == '/') slash--;
        *slash = 0;
        char *s2 = strrchr(copy, '/');
        fam = s2 ? s2 + 1 : copy;
        if (s2) {
            while (s2 > copy && s2[-1] == '/') s2--;
            *s2 = 0;
            root = *copy ? copy : "/";
        } else {
            root = ".";
        }
    }
    kiln_status st = KILN_OK;
    if (!name || !*name || !fam || !*fam || !strcmp(name, ".") || !strcmp(name, "..") || !strcmp(fam, ".") || !strcmp(fam, ".."))
        st = kb_fail(KILN_ERR_INVALID_ARG, "package %s: not a package folder <root>/<family>/<package>", dir);
    char *famdir = st ? NULL : kb_path_join(root, fam);
    if (!st && !famdir) st = KILN_ERR_NOMEM;
    int rfd = -1, ffd = -1, pfd = -1;
    if (!st) st = open_folder(AT_FDCWD, root, dir, "the package root", root, 1, &rfd);
    if (!st) st = open_folder(rfd, fam, dir, "folder", famdir, 0, &ffd);
    if (!st) st = open_folder(ffd, name, dir, "folder", dir, 0, &pfd);
    if (rfd >= 0) close(rfd);
    if (ffd >= 0) close(ffd);
    if (!st) *out = pfd;
    free(famdir);
    free(copy);
    return st;
}

/* a regular, trusted file in the package folder, as a descriptor */
static kiln_status open_trusted_file(int dfd, const char *dir, const char *name, int *out, struct stat *sb) {
    int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        int err = errno;
        if (err == ELOOP) return kb_fail(KILN_ERR_CORRUPT, "package %s: %s is a symbolic link; refused", dir, name);
        if (err == ENOENT) return kb_fail(KILN_ERR_MISSING, "package %s: no %s", dir, name);
        return kb_fail(KILN_ERR_IO, "package %s: cannot open %s: %s", dir, name, strerror(err));
    }
    kiln_status st = KILN_OK;
    if (fstat(fd, sb) != 0) st = kb_fail(KILN_ERR_IO, "package %s: cannot stat %s", dir, name);
    else if (!S_ISREG(sb->st_mode)) st = kb_fail(KILN_ERR_CORRUPT, "package %s: %s is not a regular file; refused", dir, name);
    else st = check_owner(dir, "file", name, sb);
    if (st) close(fd);
    else *out = fd;
    return st;
}

/* the whole of a trusted file (at most max bytes), NUL-terminated */
static kiln_status read_trusted(int dfd, const char *dir, const char *name, size_t max, char **text, size_t *len) {
    int fd;
    struct stat sb;
    kiln_status st = open_trusted_file(dfd, dir, name, &fd, &sb);
    if (st) return st;
    if ((uint64_t)sb.st_size > max) {
        close(fd);
        return kb_fail(KILN_ERR_CORRUPT, "package %s: %s holds %lld bytes (at most %zu)", dir, name, (long long)sb.st_size, max);
    }
    char *buf = kb_malloc((size_t)sb.st_size + 1);
    size_t n = 0;
    while (buf && n < (size_t)sb.st_size) {
        ssize_t r = read(fd, buf + n, (size_t)sb.st_size - n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        n += (size_t)r;
    }
    close(fd);
    if (!buf) return KILN_ERR_NOMEM;
    if (n != (size_t)sb.st_size) {
        free(buf);
        return kb_fail(KILN_ERR_IO, "package %s: cannot read %s", dir, name);
    }
    buf[n] = 0;
    *text = buf;
    *len = n;
    return KILN_OK;
}

/* the manifest's bytes, verified against the signature file */
static kiln_status read_signed_manifest(int dfd, const char *dir, char **text, size_t *len) {
    char *sig = NULL;
    size_t slen = 0;
    kiln_status st = read_trusted(dfd, dir, PKG_MANIFEST, PKG_MANIFEST_MAX, text, len);
    if (st == KILN_ERR_MISSING) return kb_fail(KILN_ERR_MISSING, "package %s: no manifest", dir);
    if (st) return st;
    st = read_trusted(dfd, dir, PKG_SIG, 256, &sig, &slen);
    if (st == KILN_ERR_MISSING)
        st = kb_fail(KILN_ERR_CORRUPT, "package %s: no %s (unsigned: built by an older kiln, or planted); refused", dir, PKG_SIG);
    if (!st) {
        while (slen && (sig[slen - 1] == '\n' || sig[slen - 1] == '\r' || sig[slen - 1] == ' ')) sig[--slen] = 0;
        if ((st = kb_verify_sig(*text, *len, sig)))
            st = kb_wrap(st == KILN_ERR_CORRUPT ? st : KILN_ERR_CORRUPT, "package %s: manifest.json's signature; refused", dir);
    }
    free(sig);
    if (st) {
        free(*text);
        *text = NULL;
    }
    return st;
}

kiln_status kx_package_open(const char *dir, kx_package **out) {
    *out = NULL;
    kx_package *p = kb_calloc(1, sizeof *p);
    char *text = NULL;
    size_t len = 0;
    int dfd = -1;
    kiln_status st = p ? KILN_OK : KILN_ERR_NOMEM;
    if (!st && !(p->dir = kb_strdup(dir))) st = KILN_ERR_NOMEM;
    if (!st) st = open_trusted_dir(dir, &dfd);
    /* nothing of the manifest is read before its signature is verified */
    if (!st) st = read_signed_manifest(dfd, dir, &text, &len);
    if (!st) st = kx_manifest_parse(text, len, dir, &p->m);
    if (dfd >= 0) close(dfd);
    free(text);
    if (st) {
        kx_package_close(p);
        return st;
    }
    *out = p;
    return KILN_OK;
}

kiln_status kx_package_check_io(const kx_package *p, int n_in, const char *const *in, int n_out, const char *const *out) {
    int same = n_in == p->m->n_in && n_out == p->m->n_out;
    /* inputs by slot: the manifest lists them with their slots */
    for (int i = 0; same && i < n_in; i++) {
        int k = 0;
        while (k < p->m->n_in && p->m->in_slot[k] != i) k++;
        same = k < p->m->n_in && !strcmp(p->m->in[k].name, in[i]);
    }
    for (int i = 0; same && i < n_out; i++) same = !strcmp(p->m->out_name[i], out[i]);
    if (same) return KILN_OK;
    char have[512] = "", want[512] = "";
    for (int i = 0; i < p->m->n_in; i++) snprintf(have + strlen(have), sizeof have - strlen(have), "%s%s", i ? ", " : "", p->m->in[i].name);
    snprintf(have + strlen(have), sizeof have - strlen(have), " -> ");
    for (int i = 0; i < p->m->n_out; i++) snprintf(have + strlen(have), sizeof have - strlen(have), "%s%s", i ? ", " : "", p->m->out_name[i]);
    for (int i = 0; i < n_in; i++) snprintf(want + strlen(want), sizeof want - strlen(want), "%s%s", i ? ", " : "", in[i]);
    snprintf(want + strlen(want), sizeof want - strlen(want), " -> ");
    for (int i = 0; i < n_out; i++) snprintf(want + strlen(want), sizeof want - strlen(want), "%s%s", i ? ", " : "", out[i]);
    return kb_fail(KILN_ERR_RANGE, "package %s computes %s, the model %s", p->dir, have, want);
}

kiln_status kx_package_solve(const kx_package *p, int n_in, const int64_t (*shape)[4], int64_t *s) {
    if (n_in != p->m->n_in)
        return kb_fail(KILN_ERR_SHAPE, "package %s takes %d inputs, not %d", p->dir, p->m->n_in, n_in);
    int64_t sh[KX_MAX_IN][4];
    for (int i = 0; i < n_in; i++) memcpy(sh[i], shape[p->m->in_slot[i]], sizeof sh[i]); /* in_slot < n_in (manifest.c) */
    return kx_solve(p->m->sym, p->m->nsym, p->m->in, p->m->n_in, (const int64_t(*)[4])sh, s);
}

/* model.so opened through the trust checks and hashed through that
 * descriptor against the signed manifest's SHA-256, then the features its
 * weights' layouts need on backend be (kk_has_feature). fd (may be NULL)
 * receives the descriptor, to load exactly what was hashed. */
static kiln_status open_library(const kx_package *p, const kk_backend *be, int *fd_out) {
    int dfd = -1, fd = -1;
    struct stat sb;
    kiln_status st = open_trusted_dir(p->dir, &dfd);
    if (!st) st = open_trusted_file(dfd, p->dir, PKG_LIB, &fd, &sb);
    if (dfd >= 0) close(dfd);
    if (st) return st == KILN_ERR_MISSING ? kb_wrap(st, "package %s: its shared object", p->dir) : st;
    kb_sha256_ctx c;
    kb_sha256_init(&c);
    static _Thread_local uint8_t buf[1 << 16];
    for (;;) {
        ssize_t r = read(fd, buf, sizeof buf);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) st = kb_fail(KILN_ERR_IO, "package %s: cannot read %s: %s", p->dir, PKG_LIB, strerror(errno));
        if (r <= 0) break;
        kb_sha256_update(&c, buf, (size_t)r);
    }
    uint8_t d[32];
    char hex[65];
    kb_sha256_final(&c, d);
    kb_hex(d, 32, hex);
    if (!st && strcmp(hex, p->m->so_sha))
        st = kb_fail(KILN_ERR_CORRUPT, "package %s: %s does not match its manifest's SHA-256 (tampered or damaged); refused",
                     p->dir, PKG_LIB);
    for (int i = 0; !st && i < p->m->n_cpu; i++)
        if (!kk_has_feature(be, p->m->cpu[i]))
            st = kb_fail(KILN_ERR_UNSUPPORTED, "package %s needs CPU feature %s, which this machine lacks", p->dir,
                         p->m->cpu[i]);
    if (st || !fd_out) close(fd);
    else *fd_out = fd;
    return st;
}

kiln_status kx_package_verify(const char *dir, const kk_backend *be) {
    kx_package *p;
    kiln_status st = kx_package_open(dir, &p);
    if (st) return st;
    st = open_library(p, be, NULL);
    kx_package_close(p);
    return st;
}

static kiln_status bind_weights(kx_package *p, kx_weight_fn weight, void *user) {
    char msg[2048] = "";
    size_t len = 0;
    int bad = 0;
    for (int i = 0; i < p->m->nw; i++) {
        const kx_pkg_weight *w = &p->m->w[i];
        kx_bound b = {0};
        const char *why = NULL;
        int same = 1;
        if (!weight(user, w->name, &b)) why = "missing";
        else {
            same = b.ndim == w->ndim;
            for (int d = 0; same && d < w->ndim; d++) same = b.shape[d] == w->shape[d];
            if (!same) why = "shape differs";
            else if (w->gemm && (!b.kw || b.dtype != w->dtype || !b.layout || strcmp(b.layout, w->layout)))
                why = "dtype or layout differs";
            else if (!w->gemm && !b.data) why = "no f32 data";
        }
        if (why) {
            if (bad < 12) {
                snprintf(msg + len, sizeof msg - len, "%s%s (%s)", bad ? ", " : "", w->name, why);
                len = strlen(msg);
            }
            bad++;
            continue;
        }
        p->P[w->node] = w->gemm ? (void *)b.kw : (void *)b.data;
    }
    if (bad)
        return kb_fail(KILN_ERR_MISSING, "package %s: %d weight%s cannot be bound: %s%s", p->dir, bad, bad == 1 ? "" : "s",
                       msg, bad > 12 ? " ..." : "");
    return KILN_OK;
}

/* dlopen the file open at *fd, as /proc/self/fd/N. The dynamic loader
 * takes a library whose name matches as already loaded, and N is reused
 * once closed: a library loaded earlier under this name (another package,
 * still loaded) is not ours unless it was built for this plan (digest), so
 * then the descriptor moves to another number first. Every library loaded
 * this way was verified when it was loaded; the probe runs none of its code
 * but kiln_pkg_digest. */
static void *dlopen_fd(int *fd, const char *digest) {
    char name[40];
    for (int tries = 0;; tries++) {
        snprintf(name, sizeof name, "/proc/self/fd/%d", *fd);
        void *old = dlopen(name, RTLD_LAZY | RTLD_LOCAL | RTLD_NOLOAD);
        if (!old) break;
        const char *(*dg)(void) = NULL;
        *(void **)&dg = dlsym(old, "kiln_pkg_digest");
        int same = dg && !strcmp(dg(), digest);
        dlclose(old);
        if (same || tries >= 16) break;
        int nfd = fcntl(*fd, F_DUPFD_CLOEXEC, *fd + 1);
        if (nfd < 0) break;
        close(*fd);
        *fd = nfd;
    }
    return dlopen(name, RTLD_NOW | RTLD_LOCAL);
}

kiln_status kx_package_load(kx_package *p, const kk_backend *be, const kg_dist *dist, kx_weight_fn weight, void *user) {
    if (p->loaded) return p->load_st ? kb_fail(p->load_st, "%s", p->load_err ? p->load_err : "package failed to load") : KILN_OK;
    p->ctx = (kg_ctx){be, dist}; /* the arena comes from this backend */
    /* load the descriptor that was checked and hashed: the path is never opened again */
    int fd = -1;
    char want[65];
    kx_manifest_digest(p->m, want);
    kiln_status st = open_library(p, be, &fd);
    if (!st && !(p->dl = dlopen_fd(&fd, want)))
        st = kb_fail(KILN_ERR_UNSUPPORTED, "package %s: cannot load %s: %s", p->dir, PKG_LIB, dlerror());
    if (fd >= 0) close(fd);
    int (*abi)(void) = NULL;
    const char *(*digest)(void) = NULL, *(*ops)(void) = NULL;
    if (!st) {
        *(void **)&abi = dlsym(p->dl, "kiln_pkg_abi");
        *(void **)&digest = dlsym(p->dl, "kiln_pkg_digest");
        *(void **)&ops = dlsym(p->dl, "kiln_pkg_ops");
        *(void **)&p->fwd = dlsym(p->dl, "kiln_pkg_forward");
        *(void **)&p->consts = dlsym(p->dl, "kiln_pkg_consts");
        if (!abi || !digest || !ops || !p->fwd || !p->consts || abi() != KX_ABI)
            st = kb_fail(KILN_ERR_UNSUPPORTED, "package %s: %s does not export the kiln ABI %d", p->dir, PKG_LIB, KX_ABI);
        else if (strcmp(ops(), kg_op_table_names()))
            st = kb_fail(KILN_ERR_UNSUPPORTED, "package %s: built against another op table (ops.def) than this kiln's", p->dir);
    }
    if (!st) {
        if (strcmp(want, digest()))
            st = kb_fail(KILN_ERR_CORRUPT, "package %s: the manifest's plan does not match the one %s was built for "
                                           "(edited after the build); refused", p->dir, PKG_LIB);
    }
    if (!st && !(p->P = calloc((size_t)p->m->n_nodes + 1, sizeof *p->P)))
        st = kb_fail(KILN_ERR_NOMEM, "package %s: out of memory", p->dir);
    if (!st) st = bind_weights(p, weight, user);
    if (!st && p->m->arena_bytes && !(p->arena = kk_buf_alloc(be, p->m->arena_bytes)))
        st = kb_fail(KILN_ERR_NOMEM, "package %s: cannot allocate its %zu-byte arena", p->dir, p->m->arena_bytes);
    if (!st && p->m->const_bytes && !(p->const_area = kk_buf_alloc(be, p->m->const_bytes)))
        st = kb_fail(KILN_ERR_NOMEM, "package %s: cannot allocate its %zu bytes of shape constants", p->dir,
                     p->m->const_bytes);
    if (!st) {
        kx_rt_init(&p->rt, &p->ctx);
        for (int i = 0; i < p->m->n_nodes; i++) {
            if (p->m->place[i].kind == KX_ARENA) p->P[i] = (char *)p->arena + p->m->place[i].at;
            if (p->m->place[i].kind == KX_CONST) p->P[i] = (char *)p->const_area + p->m->place[i].at;
        }
    }
    if (st) { /* nothing of a failed load stays: a NOMEM load is tried again */
        if (p->dl) dlclose(p->dl);
        p->dl = NULL;
        kk_buf_free(be, p->arena);
        kk_buf_free(be, p->const_area);
        p->arena = p->const_area = NULL;
    }
    if (st == KILN_ERR_NOMEM) { /* passing: the next forward tries again */
        free(p->P);
        p->P = NULL;
        return st;
    }
    p->loaded = 1; /* a package that cannot load stays refused, with its reason */
    p->load_st = st;
    if (st) p->load_err = kb_strdup(kiln_last_error());
    return st;
}

kiln_status kx_package_run(kx_package *p, const int64_t *s, const float *const *inputs, float *const *outputs) {
    if (!p->loaded || p->load_st) return kb_fail(KILN_ERR_INVALID_ARG, "package %s is not loaded", p->dir);
    for (int i = 0; i < p->m->n_nodes; i++) {
        if (p->m->place[i].kind == KX_INPUT) p->P[i] = (void *)inputs[p->m->place[i].at];
        else if (p->m->place[i].kind == KX_OUTPUT) p->P[i] = outputs[p->m->place[i].at];
    }
    /* the shape constants, once per shape (the weights are bound for good) */
    if (!p->consts_valid || memcmp(p->const_s, s, sizeof(int64_t) * (size_t)p->m->nsym)) {
        p->consts_valid = 0;
        if (p->consts(&p->rt, s, p->P))
            return kb_fail(KILN_ERR_INVALID_ARG, "package %s: the compiled shape constants failed", p->dir);
        memcpy(p->const_s, s, sizeof(int64_t) * (size_t)p->m->nsym);
        p->consts_valid = 1;
    }
    if (p->fwd(&p->rt, s, p->P)) return kb_fail(KILN_ERR_INVALID_ARG, "package %s: the compiled forward failed", p->dir);
    return KILN_OK;
}

/* ---- compile ------------------------------------------------------------------- */

static const char *cc_cmd(void) {
    const char *cc = getenv("KILN_CC");
    return cc && *cc ? cc : "cc";
}

/* Run argv (split on spaces from cmd, then extra) with stdout+stderr into
 * log; returns the exit status, 127 when it could not start. */
static int run_tool(const char *cmd, const char *const *extra, const char *log) {
    char *copy = kb_strdup(cmd);
    if (!copy) return -1;
    const char *argv[64];
    int argc = 0;
    for (char *t = strtok(copy, " \t"); t && argc < 40; t = strtok(NULL, " \t")) argv[argc++] = t;
    for (int i = 0; extra[i] && argc < 63; i++) argv[argc++] = extra[i];
    argv[argc] = NULL;
    int rc = -1;
    if (argc) {
        pid_t pid = fork();
        if (pid == 0) { /* only async-signal-safe calls until exec */
            umask(022); /* what the compiler writes: no group/other write whatever the caller's umask */
            int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
            if (fd >= 0) {
                dup2(fd, 1);
                dup2(fd, 2);
            }
            execvp(argv[0], (char *const *)argv);
            _exit(127);
        }
        int ws;
        if (pid > 0 && waitpid(pid, &ws, 0) == pid) rc = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
    }
    free(copy);
    return rc;
}

/* the first line of a file, for error messages */
static void first_line(const char *path, char *buf, size_t cap) {
    char *text = NULL;
    size_t len = 0;
    buf[0] = 0;
    if (kb_read_file(path, &text, &len)) {
        kb_clear_error();
        return;
    }
    const char *p = text;
    while (*p == '\n') p++;
    size_t n = strcspn(p, "\n");
    snprintf(buf, cap, "%.*s", (int)(n < cap ? n : cap - 1), p);
    free(text);
}

static cJSON *expr_json(const kx_expr *e) {
    double v[KX_NMONO];
    for (int m = 0; m < KX_NMONO; m++) v[m] = (double)e->c[m];
    return cJSON_CreateDoubleArray(v, KX_NMONO);
}


static char *manifest_text(const kx_compile_req *r, const kx_export *x, const kx_plan *p, const char *hash,
                           const char *so_sha, const char *cc_version, int n_kinds) {
    char es[128];
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "format", PKG_MAGIC);
    cJSON_AddNumberToObject(m, "format_version", KX_FORMAT_VERSION);
    cJSON_AddStringToObject(m, "kiln_version", KILN_VERSION);
    cJSON_AddNumberToObject(m, "abi", KX_ABI);
    cJSON_AddStringToObject(m, "family", r->family);
    cJSON_AddStringToObject(m, "graph_hash", hash);
    cJSON_AddStringToObject(m, "dtype", r->dtype ? r->dtype : "");
    cJSON_AddStringToObject(m, "quant", r->quant ? r->quant : "none");
    cJSON *cpu = cJSON_AddArrayToObject(m, "cpu_features");
    if (r->cpu_isa && *r->cpu_isa) cJSON_AddItemToArray(cpu, cJSON_CreateString(r->cpu_isa));
    cJSON *cc = cJSON_AddObjectToObject(m, "compiler");
    cJSON_AddStringToObject(cc, "command", cc_cmd());
    cJSON_AddStringToObject(cc, "flags", PKG_CFLAGS);
    cJSON_AddStringToObject(cc, "version", cc_version);
    cJSON_AddStringToObject(m, "mode", r->regional ? "regional" : "whole-graph");
    cJSON_AddNumberToObject(m, "block_kinds", n_kinds);
    cJSON_AddNumberToObject(m, "regions", r->regional ? x->g.n_regions : 0);
    if (r->model_json) cJSON_AddItemToObject(m, "model", cJSON_Parse(r->model_json));
    cJSON *syms = cJSON_AddArrayToObject(m, "symbols");
    for (int i = 0; i < x->nsym; i++) {
        cJSON *s = cJSON_CreateObject();
        cJSON_AddStringToObject(s, "name", x->sym[i].name);
        cJSON_AddNumberToObject(s, "min", (double)x->sym[i].lo);
        cJSON_AddNumberToObject(s, "max", (double)x->sym[i].hi);
        cJSON_AddItemToArray(syms, s);
    }
    cJSON *guards = cJSON_AddArrayToObject(m, "guards");
    cJSON *ins = cJSON_AddArrayToObject(m, "inputs");
    for (int i = 0; i < x->g.n; i++) {
        const kg_node *n = &x->g.nodes[i];
        if (!kg_is_input(n)) continue;
        cJSON *in = cJSON_CreateObject();
        cJSON_AddStringToObject(in, "name", n->name);
        cJSON_AddNumberToObject(in, "slot", (double)n->iparam[0]);
        cJSON *dims = cJSON_AddArrayToObject(in, "dims"), *coef = cJSON_AddArrayToObject(in, "coef");
        for (int k = 0; k < n->ndim; k++) {
            kx_expr_str(&x->dim[i][k], x->sym, x->nsym, es, sizeof es);
            cJSON_AddItemToArray(dims, cJSON_CreateString(es));
            cJSON_AddItemToArray(coef, expr_json(&x->dim[i][k]));
            char gs[200];
            snprintf(gs, sizeof gs, "%s[%d] == %s", n->name, k, es);
            cJSON_AddItemToArray(guards, cJSON_CreateString(gs));
        }
        cJSON_AddItemToArray(ins, in);
    }
    for (int i = 0; i < x->nsym; i++) {
        char gs[160];
        snprintf(gs, sizeof gs, "%lld <= %s <= %lld", (long long)x->sym[i].lo, x->sym[i].name, (long long)x->sym[i].hi);
        cJSON_AddItemToArray(guards, cJSON_CreateString(gs));
    }
    cJSON *outs = cJSON_AddArrayToObject(m, "outputs");
    for (int o = 0; o < x->g.n_outputs; o++) {
        kg_id id = x->g.outputs[o];
        cJSON *ob = cJSON_CreateObject(), *dims = cJSON_AddArrayToObject(ob, "dims");
        cJSON_AddStringToObject(ob, "name", x->g.output_names[o]);
        for (int k = 0; k < x->g.nodes[id].ndim; k++) {
            kx_expr_str(&x->dim[id][k], x->sym, x->nsym, es, sizeof es);
            cJSON_AddItemToArray(dims, cJSON_CreateString(es));
        }
        cJSON_AddItemToArray(outs, ob);
    }
    cJSON_AddNumberToObject(m, "arena_bytes", (double)p->arena_bytes);
    cJSON_AddNumberToObject(m, "const_bytes", (double)p->const_bytes);
    cJSON *pl = cJSON_AddArrayToObject(m, "placement");
    for (int i = 0; i < p->n; i++) {
        cJSON *e = cJSON_CreateArray();
        cJSON_AddItemToArray(e, cJSON_CreateString(kx_place_name(p->place[i].kind)));
        cJSON_AddItemToArray(e, cJSON_CreateNumber((double)p->place[i].at));
        cJSON_AddItemToArray(pl, e);
    }
    /* a weight an op reads as its GEMM weight (ops.def gemm_src) is bound to its GEMM view, any other to its f32 data */
    char *as_w = calloc((size_t)x->g.n + 1, 1);
    for (int i = 0; as_w && i < x->g.n; i++) {
        int gs = kg_ops[x->g.nodes[i].op].gemm_src;
        if (gs >= 0 && x->g.nodes[i].src[gs] >= 0) as_w[x->g.nodes[i].src[gs]] = 1;
    }
    cJSON *ws = cJSON_AddArrayToObject(m, "weights");
    for (int k = 0; as_w && k < p->n_weights; k++) {
        const kg_node *n = &x->g.nodes[p->weights[k]];
        kx_bound b = {0};
        r->weight(r->weight_user, n->name, &b);
        int gemm = as_w[p->weights[k]];
        cJSON *w = cJSON_CreateObject();
        cJSON_AddStringToObject(w, "name", n->name);
        cJSON_AddNumberToObject(w, "node", p->weights[k]);
        cJSON_AddStringToObject(w, "view", gemm ? "gemm" : "f32");
        cJSON_AddStringToObject(w, "dtype", kiln_dtype_name(gemm ? b.dtype : KILN_F32));
        cJSON_AddStringToObject(w, "layout", gemm && b.layout ? b.layout : "rowmajor");
        double sh[4];
        for (int d = 0; d < n->ndim; d++) sh[d] = (double)n->shape[d];
        cJSON_AddItemToObject(w, "shape", cJSON_CreateDoubleArray(sh, n->ndim));
        cJSON_AddItemToArray(ws, w);
    }
    free(as_w);
    cJSON_AddStringToObject(m, "library", PKG_LIB);
    cJSON_AddStringToObject(m, "library_sha256", so_sha);
    char *text = cJSON_Print(m);
    cJSON_Delete(m);
    return text;
}

static void dims_label(const kx_sym *s, int n, char *buf, size_t cap) {
    size_t len = 0;
    buf[0] = 0;
    for (int i = 0; i < n && len < cap; i++) {
        if (s[i].lo == s[i].hi) snprintf(buf + len, cap - len, "%s%s%lld", i ? "." : "", s[i].name, (long long)s[i].lo);
        else snprintf(buf + len, cap - len, "%s%s%lld-%lld", i ? "." : "", s[i].name, (long long)s[i].lo, (long long)s[i].hi);
        len = strlen(buf);
    }
}

int kx_staging_dead(const char *name) {
    long pid = 0;
    if (strncmp(name, ".staging-", 9) || (pid = strtol(name + 9, NULL, 10)) <= 0) return 0;
    return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

/* Staging folders of compilers that died (their pid is gone) and folders
 * a remover renamed aside are deleted; a live compiler's are left alone. */
static void clean_leftovers(const char *famdir) {
    DIR *d = opendir(famdir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        int stale = strstr(e->d_name, ".trash.") != NULL || kx_staging_dead(e->d_name);
        char *path = stale ? kb_path_join(famdir, e->d_name) : NULL;
        if (path) {
            kb_log(KILN_LOG_INFO, "compile: removing %s, left by a compiler that died", path);
            kb_remove_tree(path);
        }
        free(path);
    }
    closedir(d);
}

/* a new file in the private staging folder, 0644 whatever the umask */
static kiln_status write_new(const char *path, const void *data, size_t len) {
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) return kb_fail(KILN_ERR_IO, "cannot create %s: %s", path, strerror(errno));
    kiln_status st = fchmod(fd, 0644) == 0 ? KILN_OK : kb_fail(KILN_ERR_IO, "cannot chmod %s: %s", path, strerror(errno));
    const char *b = data;
    while (!st && len) {
        ssize_t w = write(fd, b, len);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) st = kb_fail(KILN_ERR_IO, "cannot write %s: %s", path, w < 0 ? strerror(errno) : "short write");
        else b += w, len -= (size_t)w;
    }
    if (!st && fsync(fd) != 0) st = kb_fail(KILN_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    if (close(fd) != 0 && !st) st = kb_fail(KILN_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    return st;
}

/* a file the compiler or a helper wrote: group and other write removed
 * (a umask of 000 gives 0777) */
static kiln_status fix_mode(const char *path) {
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    struct stat sb;
    kiln_status st = fd >= 0 && fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && fchmod(fd, sb.st_mode & 0755) == 0
                         ? KILN_OK
                         : kb_fail(KILN_ERR_IO, "compile: cannot set the mode of %s: %s", path, strerror(errno));
    if (fd >= 0) close(fd);
    return st;
}

/* the package root and the family folder pass the trust checks */
static kiln_status check_folders(const char *root, const char *family, const char *famdir) {
    int rfd = -1, ffd = -1;
    kiln_status st = open_folder(AT_FDCWD, root, famdir, "the package root", root, 1, &rfd);
    if (!st) st = open_folder(rfd, family, famdir, "folder", famdir, 0, &ffd);
    if (rfd >= 0) close(rfd);
    if (ffd >= 0) close(ffd);
    return st ? kb_wrap(st, "compile") : KILN_OK;
}

kiln_status kx_compile(const kx_compile_req *r, kx_compile_info *info) {
    memset(info, 0, sizeof *info);
    if (!r->root || !*r->root || !r->family || !*r->family)
        return kb_fail(KILN_ERR_INVALID_ARG, "compile: no package folder (set KILN_PACKAGE_DIR or KILN_CACHE_DIR)");
    kx_export x;
    kx_plan p = {0};
    char *src = NULL, *famdir = NULL, *final = NULL, *staging = NULL, *manifest = NULL;
    double t0 = kb_now();
    kiln_status st = kx_export_graph(r->build, r->build_user, r->sym, r->nsym, &x);
    if (st) return st;
    info->export_s = kb_now() - t0;
    info->n_nodes = x.g.n;
    info->n_regions = r->regional ? x.g.n_regions : 0;
    t0 = kb_now();
    char digest[65] = "";
    if (!(st = kx_plan_graph(&x.g, &p))) { /* the manifest as it will be read back, for its digest */
        char *draft = manifest_text(r, &x, &p, "", "0000000000000000000000000000000000000000000000000000000000000000", "", 0);
        kx_manifest *tmp = NULL;
        if (!draft) st = KILN_ERR_NOMEM;
        else if (!(st = kx_manifest_parse(draft, strlen(draft), "(draft)", &tmp))) kx_manifest_digest(tmp, digest);
        free(draft);
        kx_manifest_free(tmp);
    }
    if (!st) st = kx_codegen(&x, &p, r->regional, digest, &src, &info->n_kinds);
    info->codegen_s = kb_now() - t0;
    info->arena_bytes = p.arena_bytes;
    /* the folder: dims, then a hash of everything the code depends on */
    char hex[65], label[160], hash[17];
    if (!st) {
        char *keytext = kb_strfmt("%s\n%s %s\n%s\n%s", r->family, cc_cmd(), PKG_CFLAGS, KILN_VERSION, src);
        if (!keytext) st = KILN_ERR_NOMEM;
        else kb_sha256(keytext, strlen(keytext), hex);
        free(keytext);
        snprintf(hash, sizeof hash, "%.16s", hex);
        dims_label(r->sym, r->nsym, label, sizeof label);
    }
    if (!st && (!(famdir = kb_path_join(r->root, r->family)) || !(final = kb_strfmt("%s/%s-%s", famdir, label, hash))))
        st = KILN_ERR_NOMEM;
    if (!st) snprintf(info->path, sizeof info->path, "%s", final);
    static int counter;
    if (!st && (st = kb_mkdir_p(famdir))) st = kb_wrap(st, "compile: package folder");
    /* a package published into folders others can write would be refused
     * at open: say so now, before building it */
    if (!st) st = check_folders(r->root, r->family, famdir);
    if (!st) clean_leftovers(famdir);
    if (!st && !(manifest = kb_strfmt("%s/" PKG_MANIFEST, final))) st = KILN_ERR_NOMEM;
    if (!st && kb_is_file(manifest)) {
        if (kx_package_verify(final, r->be) == KILN_OK) {
            info->reused = 1; /* the same code, already built, published and trusted */
            goto done;
        }
        /* unsigned (an older kiln), signed with another key, or tampered: ours replaces it */
        kb_log(KILN_LOG_WARN, "compile: %s; replacing it", kiln_last_error());
        if ((st = kb_remove_dir(final))) st = kb_wrap(st, "compile: cannot replace the refused package %s", final);
    }
    if (!st && !(staging = kb_strfmt("%s/.staging-%ld-%d", famdir, (long)getpid(),
                                     __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED))))
        st = KILN_ERR_NOMEM;
    /* private (0700) while it is built, so nobody else can open a file in
     * it before its mode is right; 0755 just before it is published */
    if (!st && (mkdir(staging, 0700) != 0 || chmod(staging, 0700) != 0))
        st = kb_fail(KILN_ERR_IO, "cannot create %s: %s", staging, strerror(errno));
    char *src_path = NULL, *so_path = NULL, *log_path = NULL, *man_path = NULL;
    if (!st && (!(src_path = kb_strfmt("%s/" PKG_SRC, staging)) || !(so_path = kb_strfmt("%s/" PKG_LIB, staging)) ||
                !(log_path = kb_strfmt("%s/" PKG_LOG, staging)) || !(man_path = kb_strfmt("%s/" PKG_MANIFEST, staging))))
        st = KILN_ERR_NOMEM;
    if (!st) st = kb_write_file_atomic(src_path, src, strlen(src));
    char cc_version[200] = "";
    if (!st) {
        char *vlog = kb_strfmt("%s/cc-version.txt", staging);
        const char *vargs[] = {"--version", NULL};
        if (vlog && run_tool(cc_cmd(), vargs, vlog) == 0) first_line(vlog, cc_version, sizeof cc_version);
        if (vlog) unlink(vlog);
        free(vlog);
        t0 = kb_now();
        kb_log(KILN_LOG_INFO, "compile: building %s with %s", label, cc_cmd());
        const char *args[] = {"-O2", "-fPIC", "-shared", "-o", so_path, src_path, NULL};
        int rc = run_tool(cc_cmd(), args, log_path);
        info->cc_s = kb_now() - t0;
        if (rc != 0) {
            char line[300];
            first_line(log_path, line, sizeof line);
            st = rc == 127 ? kb_fail(KILN_ERR_UNSUPPORTED, "compile: cannot run the C compiler '%s' (set KILN_CC)", cc_cmd())
                           : kb_fail(KILN_ERR_UNSUPPORTED, "compile: the C compiler '%s' failed (exit %d)%s%s", cc_cmd(), rc,
                                     *line ? ": " : "", line);
        } else if (!kb_is_file(so_path)) {
            st = kb_fail(KILN_ERR_UNSUPPORTED, "compile: the C compiler '%s' produced no shared object", cc_cmd());
        }
    }
    char so_sha[65];
    if (!st) st = fix_mode(so_path);
    if (!st) st = kb_sha256_file(so_path, so_sha);
    if (!st) {
        struct stat sb;
        if (stat(so_path, &sb) == 0) info->so_bytes = (size_t)sb.st_size;
        char *text = manifest_text(r, &x, &p, hash, so_sha, cc_version, info->n_kinds), sig[65], *sig_path = NULL;
        st = text ? KILN_OK : KILN_ERR_NOMEM;
        /* the signature covers the manifest's exact bytes, and the manifest
         * holds model.so's SHA-256: both are covered */
        if (!st && (st = kb_sign(text, strlen(text), sig))) st = kb_wrap(st, "compile: cannot sign the package");
        if (!st && !(sig_path = kb_strfmt("%s/" PKG_SIG, staging))) st = KILN_ERR_NOMEM;
        if (!st) st = write_new(man_path, text, strlen(text));
        sig[64] = '\n';
        if (!st) st = write_new(sig_path, sig, 65);
        free(sig_path);
        free(text);
    }
    if (!st) st = fix_mode(src_path);
    if (!st) st = fix_mode(log_path);
    if (!st && r->check) st = r->check(r->check_user, staging);
    if (!st && chmod(staging, 0755) != 0) st = kb_fail(KILN_ERR_IO, "cannot publish %s: chmod: %s", final, strerror(errno));
    /* publish: the rename is atomic; losing a race to an identical build is fine */
    if (!st && rename(staging, final) != 0) {
        if (errno == EEXIST || errno == ENOTEMPTY) info->reused = 1;
        else st = kb_fail(KILN_ERR_IO, "cannot publish %s: %s", final, strerror(errno));
        kb_remove_tree(staging);
    } else if (st && staging) {
        kb_remove_tree(staging);
    }
    free(src_path);
    free(so_path);
    free(log_path);
    free(man_path);
done:
    free(src);
    free(famdir);
    free(final);
    free(staging);
    free(manifest);
    kx_plan_free(&p);
    kx_export_free(&x);
    return st;
}
