/* test_package_trust.c - compiled packages that cannot be planted (issue
 * 23): a planted model.so (its SHA-256 recomputed into the manifest, a
 * forged signature) is refused and its constructor never runs; folders
 * writable by group or others, owned by another user, or reached through a
 * symbolic link are refused; a umask of 000 still gives private files; the
 * manifest parser refuses every reproducer with KILN_ERR_CORRUPT (never a
 * signal), and an edited manifest is refused at open by its signature; a
 * signature made with another key is refused, one made "elsewhere" with a
 * shared key file is accepted; `kiln package` leaves weight caches alone.
 * Every refusal falls back to a step that computes the same numbers.
 *
 * One package is compiled (under umask 000) and copied (cp -a: modes and
 * owners kept) into a fresh package root for each case. */
/* the paths here are short (a mkdtemp folder and kiln's own names); the
 * buffers are sized for that, not for the worst case gcc computes */
#pragma GCC diagnostic ignored "-Wformat-truncation"
#include "base/base.h"
#include "compile/compile.h"
#include "compile/manifest.h"
#include "golden_util.h"
#include "model_util.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char g_tmp[1024];
static char g_master[1200]; /* the compiled package folder: <g_tmp>/master/<family>/<name> */
static char g_family[400], g_name[400];
#define MODEL_DIR golden_path("sd35-tiny", NULL)
#define H 16
#define W 24
#define T 77

static const char *kiln_bin(void) { return getenv("KILN_BIN") ? getenv("KILN_BIN") : "build/kiln"; }

static int shf(const char *fmt, ...) KB_PRINTF(1, 2);
static int shf(const char *fmt, ...) {
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static kiln_model *open_model(const char *pkg_root) {
    kiln_model *m = NULL;
    kiln_open_opts o = {.dtype = KILN_F32};
    CHECK_OK(kiln_model_open(MODEL_DIR, &o, &m));
    if (m && pkg_root) CHECK_OK(kiln_model_set_package_dir(m, pkg_root));
    return m;
}

static float *run(kiln_model *m, const char *chain, const inputs *in, kiln_status *st) {
    float *out = calloc(in->n_out, sizeof(float));
    kiln_model_set_exec(m, chain);
    *st = kiln_forward(m, &in->a, out);
    if (*st) {
        free(out);
        return NULL;
    }
    return out;
}

/* A forward through root's packages steps aside (dynamic is refused or finds
 * nothing) and the planned step gives eager's numbers. */
static void falls_back(const char *root, const char *what) {
    kiln_model *m = open_model(root);
    if (!m) return;
    inputs in;
    make_inputs(m, 2, H, W, T, 7, &in);
    kiln_status st;
    float *got = run(m, "dynamic,planned", &in, &st);
    CHECK_MSG(st == KILN_OK, "%s: %s", what, kiln_last_error());
    CHECK_MSG(!strcmp(kiln_model_last_exec(m) ? kiln_model_last_exec(m) : "", "planned"), "%s: ran %s", what,
              kiln_model_last_exec(m));
    float *want = run(m, "eager", &in, &st);
    CHECK_OK(st);
    if (got && want) CHECK_MSG(rel_l2(got, want, in.n_out) <= 1e-6, "%s: relative L2 %.3g", what, rel_l2(got, want, in.n_out));
    free(got);
    free(want);
    free_inputs(&in);
    kiln_model_free(m);
}

/* a fresh package root holding a copy of the master package; pkg receives
 * the copy's folder */
static void fresh_copy(const char *tag, char *root, size_t rcap, char *pkg, size_t pcap) {
    snprintf(root, rcap, "%s/%s", g_tmp, tag);
    snprintf(pkg, pcap, "%s/%s/%s", root, g_family, g_name);
    CHECK(shf("mkdir -p '%s' && chmod 755 '%s' && cp -a '%s/master/%s' '%s/'", root, root, g_tmp, g_family, root) == 0);
}

static char *slurp(const char *path, size_t *len) {
    char *text = NULL;
    *len = 0;
    if (kb_read_file(path, &text, len)) return NULL;
    return text;
}

static void spit(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

/* ---- the master package: compiled under umask 000 ---------------------------------- */

static int no_gow(const char *path) {
    struct stat sb;
    if (lstat(path, &sb) != 0) return 0;
    return (sb.st_mode & 022) == 0;
}

TEST(umask_000_compile_is_private) {
    char root[1100];
    snprintf(root, sizeof root, "%s/master", g_tmp);
    mode_t old = umask(0);
    kiln_model *m = open_model(root);
    kiln_compile_result r;
    memset(&r, 0, sizeof r);
    if (m) {
        kiln_compile_opts o = kiln_compile_defaults();
        o.dims = "w_tok=10:12";
        o.batch = 2;
        o.height = H;
        o.width = W;
        o.context_len = T;
        CHECK_OK(kiln_compile(m, &o, &r));
    }
    umask(old);
    kiln_model_free(m);
    snprintf(g_master, sizeof g_master, "%s", r.path);
    /* <root>/<family>/<name> */
    const char *name = strrchr(g_master, '/');
    CHECK(name != NULL);
    if (!name) return;
    snprintf(g_name, sizeof g_name, "%s", name + 1);
    snprintf(g_family, sizeof g_family, "%.*s", (int)(name - g_master - strlen(root) - 1), g_master + strlen(root) + 1);
    const char *files[] = {"", "/model.so", "/manifest.json", "/signature", "/model.c", "/build.log"};
    char path[1400];
    for (int i = 0; i < 6; i++) {
        snprintf(path, sizeof path, "%s%s", g_master, files[i]);
        CHECK_MSG(no_gow(path), "%s is writable by group or others after a compile under umask 000", path);
    }
    snprintf(path, sizeof path, "%s/%s", root, g_family);
    CHECK_MSG(no_gow(path), "%s (the family folder) is writable by group or others", path);
    CHECK_MSG(no_gow(root), "%s (the root) is writable by group or others", root);
    CHECK_OK(kx_package_verify(g_master, kk_backend_get("cpu", KILN_F32)));
}

/* ---- planted shared objects ---------------------------------------------------------------- */

/* a shared object whose constructor writes marker: built with the system compiler */
static int build_planted(const char *so, const char *marker) {
    char src[1400];
    snprintf(src, sizeof src, "%s/planted.c", g_tmp);
    FILE *f = fopen(src, "wb");
    if (!f) return -1;
    fprintf(f,
            "#include <stdio.h>\n"
            "__attribute__((constructor)) static void planted(void) {\n"
            "    FILE *f = fopen(\"%s\", \"w\");\n"
            "    if (f) { fputs(\"planted code ran\\n\", f); fclose(f); }\n"
            "}\n"
            "int kiln_pkg_abi(void) { return %d; }\n",
            marker, KX_ABI);
    fclose(f);
    const char *cc = getenv("KILN_CC") && *getenv("KILN_CC") ? getenv("KILN_CC") : "cc";
    return shf("%s -shared -fPIC -o '%s' '%s'", cc, so, src);
}

/* the manifest's library_sha256 set to the SHA-256 of the file at so (returns the new text) */
static char *recompute_sha(const char *pkg, const char *so) {
    char path[1400], hex[65];
    size_t len;
    snprintf(path, sizeof path, "%s/manifest.json", pkg);
    char *text = slurp(path, &len);
    cJSON *m = text ? cJSON_Parse(text) : NULL;
    free(text);
    CHECK(m != NULL);
    if (!m) return NULL;
    CHECK_OK(kb_sha256_file(so, hex));
    cJSON_ReplaceItemInObject(m, "library_sha256", cJSON_CreateString(hex));
    char *out = cJSON_Print(m);
    cJSON_Delete(m);
    spit(path, out);
    return out;
}

static int exists(const char *path) {
    struct stat sb;
    return lstat(path, &sb) == 0;
}

TEST(planted_so_never_runs) {
    char root[1100], pkg[1600], so[1700], marker[1200], path[1700];
    snprintf(marker, sizeof marker, "%s/planted-marker", g_tmp);

    /* 1. model.so replaced, its SHA-256 recomputed into the manifest, the
     * signature forged (a plain SHA-256 of the manifest: no key) */
    fresh_copy("planted", root, sizeof root, pkg, sizeof pkg);
    snprintf(so, sizeof so, "%s/model.so", pkg);
    CHECK(build_planted(so, marker) == 0);
    char *text = recompute_sha(pkg, so);
    if (text) {
        char forged[66];
        kb_sha256(text, strlen(text), forged);
        forged[64] = '\n';
        forged[65] = 0;
        snprintf(path, sizeof path, "%s/signature", pkg);
        spit(path, forged);
    }
    free(text);
    kx_package *p = NULL;
    CHECK_FAILS(kx_package_open(pkg, &p), KILN_ERR_CORRUPT, "signature does not match");
    kx_package_close(p);
    CHECK(kx_package_verify(pkg, kk_backend_get("cpu", KILN_F32)) == KILN_ERR_CORRUPT);
    CHECK(shf("'%s' package verify --package-dir '%s' 2>&1 | grep -q 'FAIL.*signature'", kiln_bin(), root) == 0);
    CHECK(shf("'%s' package verify --package-dir '%s' >/dev/null 2>&1", kiln_bin(), root) != 0);
    falls_back(root, "planted .so, forged signature");
    CHECK_MSG(!exists(marker), "the planted constructor ran");

    /* 2. the signed manifest kept, model.so replaced: the hash through the
     * opened descriptor refuses it before dlopen */
    fresh_copy("planted-kept-manifest", root, sizeof root, pkg, sizeof pkg);
    snprintf(so, sizeof so, "%s/model.so", pkg);
    CHECK(build_planted(so, marker) == 0);
    CHECK_OK(kx_package_open(pkg, &p));
    if (p) CHECK_FAILS(kx_package_load(p, NULL, NULL, NULL, NULL), KILN_ERR_CORRUPT, "does not match its manifest's SHA-256");
    kx_package_close(p);
    CHECK(shf("'%s' package verify --package-dir '%s' >/dev/null 2>&1", kiln_bin(), root) != 0);
    falls_back(root, "planted .so under a signed manifest");
    CHECK_MSG(!exists(marker), "the planted constructor ran");

    /* 3. model.so a symbolic link to the planted one (whose hash the
     * attacker cannot sign either way) */
    fresh_copy("planted-link", root, sizeof root, pkg, sizeof pkg);
    snprintf(so, sizeof so, "%s/model.so", pkg);
    snprintf(path, sizeof path, "%s/planted.so", g_tmp);
    CHECK(build_planted(path, marker) == 0);
    CHECK(unlink(so) == 0 && symlink(path, so) == 0);
    CHECK_OK(kx_package_open(pkg, &p));
    if (p) CHECK_FAILS(kx_package_load(p, NULL, NULL, NULL, NULL), KILN_ERR_CORRUPT, "model.so is a symbolic link; refused");
    kx_package_close(p);
    CHECK_FAILS(kx_package_verify(pkg, kk_backend_get("cpu", KILN_F32)), KILN_ERR_CORRUPT, "model.so is a symbolic link");
    falls_back(root, "model.so a symbolic link");
    CHECK_MSG(!exists(marker), "the planted constructor ran");
}

/* ---- folders ------------------------------------------------------------------------------ */

/* chmod what (relative to root: "", family, family/name) to mode: refused with want */
static void refused_mode(const char *tag, int level, mode_t mode, const char *want) {
    char root[1100], pkg[1600], path[1700];
    fresh_copy(tag, root, sizeof root, pkg, sizeof pkg);
    if (level == 0) snprintf(path, sizeof path, "%s", root);
    else if (level == 1) snprintf(path, sizeof path, "%s/%s", root, g_family);
    else snprintf(path, sizeof path, "%s", pkg);
    /* opened while still private, then the folder opens up before the first
     * load: the load checks again */
    kx_package *p = NULL, *q = NULL;
    CHECK_OK(kx_package_open(pkg, &q));
    CHECK(chmod(path, mode) == 0);
    CHECK_FAILS(kx_package_open(pkg, &p), KILN_ERR_CORRUPT, want);
    kx_package_close(p);
    if (q) CHECK_FAILS(kx_package_load(q, NULL, NULL, NULL, NULL), KILN_ERR_CORRUPT, want);
    kx_package_close(q);
    CHECK_FAILS(kx_package_verify(pkg, kk_backend_get("cpu", KILN_F32)), KILN_ERR_CORRUPT, want);
    CHECK(shf("'%s' package verify --package-dir '%s' 2>&1 | grep -q 'FAIL.*refused'", kiln_bin(), root) == 0);
    if (level == 2) falls_back(root, tag);
    chmod(path, 0755);
}

TEST(open_folders_are_refused) {
    char want[1800];
    snprintf(want, sizeof want, "folder %s/perm-pkg/%s/%s is writable by others (mode 0757); refused", g_tmp, g_family, g_name);
    refused_mode("perm-pkg", 2, 0757, want);
    snprintf(want, sizeof want, "folder %s/perm-family/%s is writable by its group (mode 0775); refused", g_tmp, g_family);
    refused_mode("perm-family", 1, 0775, want);
    snprintf(want, sizeof want, "the package root %s/perm-root is writable by others (mode 0777); refused", g_tmp);
    refused_mode("perm-root", 0, 0777, want);
    snprintf(want, sizeof want, "the package root %s/perm-sticky is writable by others (mode 01777); refused", g_tmp);
    refused_mode("perm-sticky", 0, 01777, want);

    /* a manifest writable by others */
    char root[1100], pkg[1600], path[1700];
    fresh_copy("perm-manifest", root, sizeof root, pkg, sizeof pkg);
    snprintf(path, sizeof path, "%s/manifest.json", pkg);
    CHECK(chmod(path, 0646) == 0);
    kx_package *p = NULL;
    CHECK_FAILS(kx_package_open(pkg, &p), KILN_ERR_CORRUPT, "file manifest.json is writable by others (mode 0646)");
    kx_package_close(p);
    /* model.so writable by its group */
    fresh_copy("perm-so", root, sizeof root, pkg, sizeof pkg);
    snprintf(path, sizeof path, "%s/model.so", pkg);
    CHECK(chmod(path, 0775) == 0);
    CHECK_FAILS(kx_package_verify(pkg, kk_backend_get("cpu", KILN_F32)), KILN_ERR_CORRUPT, "file model.so is writable by its group (mode 0775)");
    falls_back(root, "model.so g+w");
}

TEST(symbolic_links_are_refused) {
    char root[1100], pkg[1600], path[1700], target[1700];
    kx_package *p = NULL;
    /* the family folder a link to the master's */
    snprintf(root, sizeof root, "%s/link-family", g_tmp);
    CHECK(mkdir(root, 0755) == 0);
    snprintf(path, sizeof path, "%s/%s", root, g_family);
    snprintf(target, sizeof target, "%s/master/%s", g_tmp, g_family);
    CHECK(symlink(target, path) == 0);
    snprintf(pkg, sizeof pkg, "%s/%s", path, g_name);
    CHECK_FAILS(kx_package_open(pkg, &p), KILN_ERR_CORRUPT, "is a symbolic link; refused");
    kx_package_close(p);
    CHECK(shf("'%s' package verify --package-dir '%s' 2>&1 | grep -q 'FAIL.*symbolic link'", kiln_bin(), root) == 0);
    falls_back(root, "family folder a symbolic link");

    /* the package folder a link */
    snprintf(root, sizeof root, "%s/link-pkg", g_tmp);
    snprintf(path, sizeof path, "%s/%s", root, g_family);
    CHECK(shf("mkdir -p '%s' && chmod 755 '%s' '%s'", path, root, path) == 0);
    snprintf(pkg, sizeof pkg, "%s/%s", path, g_name);
    CHECK(symlink(g_master, pkg) == 0);
    char msg[1800];
    snprintf(msg, sizeof msg, "folder %s is a symbolic link; refused", pkg);
    CHECK_FAILS(kx_package_open(pkg, &p), KILN_ERR_CORRUPT, msg);
    kx_package_close(p);
    falls_back(root, "package folder a symbolic link");

    /* the manifest a link to a (signed, intact) copy */
    fresh_copy("link-manifest", root, sizeof root, pkg, sizeof pkg);
    snprintf(path, sizeof path, "%s/manifest.json", pkg);
    snprintf(target, sizeof target, "%s/manifest.copy", g_tmp);
    CHECK(shf("cp '%s' '%s' && rm '%s'", path, target, path) == 0);
    CHECK(symlink(target, path) == 0);
    CHECK_FAILS(kx_package_open(pkg, &p), KILN_ERR_CORRUPT, "manifest.json is a symbolic link; refused");
    kx_package_close(p);

    /* the package root itself may be reached through a link (it is the
     * user's own setting); what is inside it is checked */
    snprintf(root, sizeof root, "%s/link-root", g_tmp);
    snprintf(target, sizeof target, "%s/master", g_tmp);
    CHECK(symlink(target, root) == 0);
    snprintf(pkg, sizeof pkg, "%s/%s/%s", root, g_family, g_name);
    CHECK_OK(kx_package_verify(pkg, kk_backend_get("cpu", KILN_F32)));
}

TEST(other_owners_are_refused) {
    if (geteuid() != 0) {
        fprintf(stderr, "  (skipped: chown to another user needs root)\n");
        return;
    }
    const char *what[3] = {"", "family", "model.so"};
    for (int i = 0; i < 3; i++) {
        char tag[40], root[1100], pkg[1600], path[1700];
        snprintf(tag, sizeof tag, "owner-%d", i);
        fresh_copy(tag, root, sizeof root, pkg, sizeof pkg);
        if (i == 0) snprintf(path, sizeof path, "%s", pkg);
        else if (i == 1) snprintf(path, sizeof path, "%s/%s", root, g_family);
        else snprintf(path, sizeof path, "%s/model.so", pkg);
        CHECK_MSG(chown(path, 65534, 65534) == 0, "chown %s", what[i]);
        CHECK_FAILS(kx_package_verify(pkg, kk_backend_get("cpu", KILN_F32)), KILN_ERR_CORRUPT, "is owned by uid 65534, not by this user (0) or root; refused");
        if (i == 0) falls_back(root, "package folder owned by uid 65534");
    }
}

/* ---- manifests -------------------------------------------------------------------------------- */

static cJSON *master_json(void) {
    char path[1400];
    size_t len;
    snprintf(path, sizeof path, "%s/manifest.json", g_master);
    char *text = slurp(path, &len);
    cJSON *m = text ? cJSON_Parse(text) : NULL;
    free(text);
    CHECK(m != NULL);
    return m;
}

static cJSON *first_placement(cJSON *m, const char *kind) {
    cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(m, "placement"))
        if (!strcmp(cJSON_GetArrayItem(e, 0)->valuestring, kind)) return e;
    return NULL;
}

static void e_slot99(cJSON *m) { cJSON_ReplaceItemInObject(cJSON_GetArrayItem(cJSON_GetObjectItem(m, "inputs"), 0), "slot", cJSON_CreateNumber(99)); }
static void e_slot_neg(cJSON *m) { cJSON_ReplaceItemInObject(cJSON_GetArrayItem(cJSON_GetObjectItem(m, "inputs"), 0), "slot", cJSON_CreateNumber(-1)); }
static void e_slot_frac(cJSON *m) { cJSON_ReplaceItemInObject(cJSON_GetArrayItem(cJSON_GetObjectItem(m, "inputs"), 1), "slot", cJSON_CreateNumber(0.5)); }
static void e_slot_dup(cJSON *m) { cJSON_ReplaceItemInObject(cJSON_GetArrayItem(cJSON_GetObjectItem(m, "inputs"), 1), "slot", cJSON_CreateNumber(0)); }
static void e_coef_min(cJSON *m) {
    cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(m, "inputs"), 0), "coef"), 0);
    cJSON_ReplaceItemInArray(c, 0, cJSON_Parse("-9223372036854775808"));
}
static void e_coef_huge_product(cJSON *m) { /* |c| allowed, but c * h_tok * w_tok at the largest shape > 2^62 */
    cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(m, "inputs"), 0), "coef"), 0);
    cJSON *s = cJSON_GetArrayItem(cJSON_GetObjectItem(m, "symbols"), 1);
    cJSON_ReplaceItemInObject(s, "max", cJSON_CreateNumber(1 << 30));
    cJSON_ReplaceItemInObject(s, "min", cJSON_CreateNumber(1 << 30));
    cJSON_ReplaceItemInArray(c, 15, cJSON_CreateNumber(4294967296.0));
}
static void e_coef_unknown_sym(cJSON *m) { /* a monomial of a 5th symbol the manifest lacks */
    cJSON *syms = cJSON_GetObjectItem(m, "symbols");
    cJSON_DeleteItemFromArray(syms, 3);
    cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(m, "inputs"), 0), "coef"), 0);
    cJSON_ReplaceItemInArray(c, 8, cJSON_CreateNumber(1));
}
static void e_coef_short(cJSON *m) {
    cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(m, "inputs"), 0), "coef"), 0);
    cJSON_DeleteItemFromArray(c, 3);
}
static void e_coef_string(cJSON *m) {
    cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(m, "inputs"), 0), "coef"), 0);
    cJSON_ReplaceItemInArray(c, 2, cJSON_CreateString("2"));
}
static void e_arena_1e300(cJSON *m) { cJSON_ReplaceItemInObject(m, "arena_bytes", cJSON_CreateNumber(1e300)); }
static void e_arena_neg(cJSON *m) { cJSON_ReplaceItemInObject(m, "arena_bytes", cJSON_CreateNumber(-64)); }
static void e_min_frac(cJSON *m) { cJSON_ReplaceItemInObject(cJSON_GetArrayItem(cJSON_GetObjectItem(m, "symbols"), 2), "min", cJSON_CreateNumber(1.5)); }
static void e_max_huge(cJSON *m) { cJSON_ReplaceItemInObject(cJSON_GetArrayItem(cJSON_GetObjectItem(m, "symbols"), 2), "max", cJSON_CreateNumber(1e19)); }
static void e_min_zero(cJSON *m) { cJSON_ReplaceItemInObject(cJSON_GetArrayItem(cJSON_GetObjectItem(m, "symbols"), 0), "min", cJSON_CreateNumber(0)); }
static void e_place_beyond(cJSON *m) {
    double a = cJSON_GetObjectItem(m, "arena_bytes")->valuedouble;
    cJSON_ReplaceItemInArray(first_placement(m, "arena"), 1, cJSON_CreateNumber(a + 64));
}
static void e_place_neg(cJSON *m) { cJSON_ReplaceItemInArray(first_placement(m, "arena"), 1, cJSON_CreateNumber(-64)); }
static void e_place_frac(cJSON *m) { cJSON_ReplaceItemInArray(first_placement(m, "arena"), 1, cJSON_CreateNumber(64.5)); }
static void e_place_kind(cJSON *m) { cJSON_ReplaceItemInArray(first_placement(m, "arena"), 0, cJSON_CreateString("heap")); }
static void e_place_input(cJSON *m) { cJSON_ReplaceItemInArray(first_placement(m, "input"), 1, cJSON_CreateNumber(4)); }
static void e_place_output(cJSON *m) { cJSON_ReplaceItemInArray(first_placement(m, "output"), 1, cJSON_CreateNumber(1)); }
static void e_place_weight(cJSON *m) { cJSON_ReplaceItemInArray(first_placement(m, "weight"), 1, cJSON_CreateNumber(1e9)); }
static void e_place_short(cJSON *m) { cJSON_DeleteItemFromArray(first_placement(m, "arena"), 1); }
static void e_weight_node(cJSON *m) { cJSON_ReplaceItemInObject(cJSON_GetArrayItem(cJSON_GetObjectItem(m, "weights"), 0), "node", cJSON_CreateNumber(1e6)); }
static void e_weight_node_neg(cJSON *m) { cJSON_ReplaceItemInObject(cJSON_GetArrayItem(cJSON_GetObjectItem(m, "weights"), 0), "node", cJSON_CreateNumber(-1)); }
static void e_weight_node_other(cJSON *m) { /* a node that exists but is not this weight's */
    cJSON_ReplaceItemInObject(cJSON_GetArrayItem(cJSON_GetObjectItem(m, "weights"), 0), "node", cJSON_CreateNumber(0));
}
static void e_weight_shape(cJSON *m) {
    double sh[2] = {4294967296.0, 4294967296.0};
    cJSON_ReplaceItemInObject(cJSON_GetArrayItem(cJSON_GetObjectItem(m, "weights"), 0), "shape", cJSON_CreateDoubleArray(sh, 2));
}
static void e_weight_shape_frac(cJSON *m) {
    double sh[2] = {24, 2.5};
    cJSON_ReplaceItemInObject(cJSON_GetArrayItem(cJSON_GetObjectItem(m, "weights"), 0), "shape", cJSON_CreateDoubleArray(sh, 2));
}
static void e_weight_dtype(cJSON *m) { cJSON_ReplaceItemInObject(cJSON_GetArrayItem(cJSON_GetObjectItem(m, "weights"), 0), "dtype", cJSON_CreateString("F9")); }
static void e_weight_dropped(cJSON *m) { cJSON_DeleteItemFromArray(cJSON_GetObjectItem(m, "weights"), 0); }
/* one input more than KX_MAX_IN (8) */
static void e_nine_inputs(cJSON *m) {
    cJSON *ins = cJSON_GetObjectItem(m, "inputs");
    for (int i = cJSON_GetArraySize(ins); i < 9; i++) cJSON_AddItemToArray(ins, cJSON_Duplicate(cJSON_GetArrayItem(ins, 0), 1));
}
static void e_five_symbols(cJSON *m) {
    cJSON *s = cJSON_GetObjectItem(m, "symbols");
    cJSON_AddItemToArray(s, cJSON_Duplicate(cJSON_GetArrayItem(s, 0), 1));
}
static void e_sha(cJSON *m) { cJSON_ReplaceItemInObject(m, "library_sha256", cJSON_CreateString("../../../etc/passwd")); }
static void e_symbols_object(cJSON *m) { cJSON_ReplaceItemInObject(m, "symbols", cJSON_CreateObject()); }
static void e_cpu_long(cJSON *m) {
    cJSON_ReplaceItemInObject(m, "cpu_features", cJSON_CreateStringArray((const char *[]){"a-feature-name-far-too-long-to-keep"}, 1));
}

TEST(manifest_reproducers) {
    struct {
        void (*f)(cJSON *);
        const char *want;
    } cases[] = {
        {e_slot99, "input hidden_states has a slot that is not an integer in [0, 7]"},
        {e_slot_neg, "input hidden_states has a slot that is not an integer in [0, 7]"},
        {e_slot_frac, "has a slot that is not an integer"},
        {e_slot_dup, "share slot 0"},
        {e_coef_min, "coefficient that is not an integer of magnitude <= 2^32"},
        {e_coef_huge_product, "exceeds 2^62 at the largest shape"},
        {e_coef_unknown_sym, "names a symbol the manifest lacks"},
        {e_coef_short, "needs 16 coefficients"},
        {e_coef_string, "coefficient that is not an integer"},
        {e_arena_1e300, "has no arena_bytes (an integer in [0, 2^46])"},
        {e_arena_neg, "has no arena_bytes"},
        {e_min_frac, "needs integers 1 <= min <= max"},
        {e_max_huge, "needs integers 1 <= min <= max"},
        {e_min_zero, "needs integers 1 <= min <= max"},
        {e_place_beyond, "outside the arena of"},
        {e_place_neg, "has a bad placement for node"},
        {e_place_frac, "has a bad placement for node"},
        {e_place_kind, "has a bad placement for node"},
        {e_place_short, "has a bad placement for node"},
        {e_place_input, "names an input or output slot the forward does not have"},
        {e_place_output, "names an input or output slot the forward does not have"},
        {e_place_weight, "is not placed as weight 0"},
        {e_weight_node, "has a node that is not an integer in [0,"},
        {e_weight_node_neg, "has a node that is not an integer in [0,"},
        {e_weight_node_other, "which is not placed as weight 0"},
        {e_weight_shape, "with a product <= 2^40"},
        {e_weight_shape_frac, "has a shape that is not integers"},
        {e_weight_dtype, "has dtype 'F9'"},
        {e_weight_dropped, "which is not placed as weight 0"},
        {e_nine_inputs, "has more than 8 inputs"},
        {e_five_symbols, "has more than 4 symbols"},
        {e_sha, "has no library_sha256"},
        {e_symbols_object, "has symbols that are not a list"},
        {e_cpu_long, "has a bad cpu_features list"},
    };
    kx_manifest *man = NULL;
    /* the real manifest parses, through a buffer with no NUL after it */
    cJSON *m = master_json();
    if (!m) return;
    char *text = cJSON_PrintUnformatted(m);
    size_t n = strlen(text);
    char *exact = malloc(n);
    memcpy(exact, text, n);
    CHECK_OK(kx_manifest_parse(exact, n, "master", &man));
    CHECK(man && man->n_in == 4 && man->nsym == 4 && man->nw > 0);
    kx_manifest_free(man);
    free(exact);
    free(text);
    cJSON_Delete(m);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        m = master_json();
        if (!m) return;
        cases[i].f(m);
        text = cJSON_Print(m);
        man = NULL;
        kiln_status st = kx_manifest_parse(text, strlen(text), "case", &man);
        CHECK_MSG(st == KILN_ERR_CORRUPT && strstr(kiln_last_error(), "package case: manifest ") &&
                      strstr(kiln_last_error(), cases[i].want),
                  "case %zu: %s: %s (want \"%s\")", i, kiln_status_name(st), kiln_last_error(), cases[i].want);
        kx_manifest_free(man);
        free(text);
        cJSON_Delete(m);
    }
    /* not JSON, empty, truncated */
    CHECK_FAILS(kx_manifest_parse("", 0, "empty", &man), KILN_ERR_CORRUPT, "not valid JSON");
    CHECK_FAILS(kx_manifest_parse("{\"format\":\"kiln-pa", 18, "cut", &man), KILN_ERR_CORRUPT, "not valid JSON");
    CHECK_FAILS(kx_manifest_parse("[1,2]", 5, "array", &man), KILN_ERR_CORRUPT, "is not a kiln package manifest");

    /* kx_expr_str must not negate INT64_MIN */
    kx_sym syms[1] = {{"batch", 1, 2}};
    kx_expr e;
    memset(&e, 0, sizeof e);
    e.c[0] = INT64_MIN;
    char buf[128];
    kx_expr_str(&e, syms, 1, buf, sizeof buf);
    CHECK_MSG(!strcmp(buf, "-9223372036854775808"), "%s", buf);
    e.c[1] = INT64_MIN;
    kx_expr_str(&e, syms, 1, buf, sizeof buf);
    CHECK_MSG(!strcmp(buf, "-9223372036854775808*batch-9223372036854775808"), "%s", buf);
    /* a solve whose dimension minus the constant overflows is a range error */
    kx_iospec in = {"x", 1, {{{0}}}};
    in.dim[0].c[0] = -5;
    in.dim[0].c[1] = 1;
    int64_t shape[1][4] = {{INT64_MAX}}, s[1];
    CHECK_FAILS(kx_solve(syms, 1, &in, 1, (const int64_t(*)[4])shape, s), KILN_ERR_RANGE, "is not of the form");
}

/* an edited manifest: without the key, refused at open before it is read;
 * with it (an attacker who is this user), the parser still refuses slot 99 */
TEST(edited_manifest_is_refused_at_open) {
    char root[1100], pkg[1600], path[1700];
    fresh_copy("edited", root, sizeof root, pkg, sizeof pkg);
    cJSON *m = master_json();
    if (!m) return;
    e_slot99(m);
    char *text = cJSON_Print(m);
    cJSON_Delete(m);
    snprintf(path, sizeof path, "%s/manifest.json", pkg);
    spit(path, text);
    kx_package *p = NULL;
    CHECK_FAILS(kx_package_open(pkg, &p), KILN_ERR_CORRUPT, "manifest.json's signature; refused: the signature does not match");
    kx_package_close(p);
    CHECK(shf("'%s' package verify --package-dir '%s' >/dev/null 2>&1", kiln_bin(), root) != 0);
    falls_back(root, "edited manifest");
    char sig[66];
    CHECK_OK(kb_sign(text, strlen(text), sig));
    sig[64] = '\n';
    sig[65] = 0;
    snprintf(path, sizeof path, "%s/signature", pkg);
    spit(path, sig);
    CHECK_FAILS(kx_package_open(pkg, &p), KILN_ERR_CORRUPT, "slot that is not an integer in [0, 7]");
    kx_package_close(p);
    falls_back(root, "edited and re-signed manifest");
    /* no signature file at all */
    CHECK(unlink(path) == 0);
    CHECK_FAILS(kx_package_open(pkg, &p), KILN_ERR_CORRUPT, "no signature (unsigned");
    kx_package_close(p);
    free(text);
}

/* ---- keys -------------------------------------------------------------------------------------- */

static void write_key(const char *path, char fill) {
    char key[66];
    memset(key, fill, 64);
    key[64] = '\n';
    key[65] = 0;
    spit(path, key);
    chmod(path, 0600);
}

TEST(keys_other_and_shared) {
    char key_a[1200], key_b[1200], root[1100], pkg[1600], other[1200];
    snprintf(key_a, sizeof key_a, "%s/fleet.key", g_tmp);
    snprintf(key_b, sizeof key_b, "%s/other.key", g_tmp);
    write_key(key_a, 'a');
    write_key(key_b, 'b');
    /* the master was signed with this user's default key: another key refuses it */
    setenv("KILN_PACKAGE_KEY_FILE", key_b, 1);
    kx_package *p = NULL;
    CHECK_FAILS(kx_package_open(g_master, &p), KILN_ERR_CORRUPT, "the signature does not match this user's key");
    kx_package_close(p);
    /* compiled "elsewhere": another process with another config folder, the fleet's key file */
    snprintf(root, sizeof root, "%s/fleet", g_tmp);
    snprintf(other, sizeof other, "%s/elsewhere-config", g_tmp);
    CHECK(shf("XDG_CONFIG_HOME='%s' KILN_PACKAGE_KEY_FILE='%s' '%s' compile '%s' --dtype f32 --package-dir '%s' "
              "--dim w_tok=10:12 --latent %dx%d --context-len %d --log error >/dev/null",
              other, key_a, kiln_bin(), MODEL_DIR, root, H, W, T) == 0);
    snprintf(pkg, sizeof pkg, "%s/%s/%s", root, g_family, g_name); /* the same code: the same folder */
    CHECK_MSG(exists(pkg), "the fleet's package is not at %s", pkg);
    CHECK_FAILS(kx_package_open(pkg, &p), KILN_ERR_CORRUPT, "the signature does not match"); /* key b */
    kx_package_close(p);
    setenv("KILN_PACKAGE_KEY_FILE", key_a, 1);
    CHECK_OK(kx_package_verify(pkg, kk_backend_get("cpu", KILN_F32)));
    kiln_model *m = open_model(root);
    if (m) {
        inputs in;
        make_inputs(m, 2, H, W, T, 7, &in);
        kiln_status st;
        float *got = run(m, "dynamic", &in, &st);
        CHECK_OK(st);
        free(got);
        free_inputs(&in);
        kiln_model_free(m);
    }
    /* this user's own key (the default) refuses the fleet's package */
    setenv("KILN_PACKAGE_KEY_FILE", "", 1);
    CHECK_FAILS(kx_package_verify(pkg, kk_backend_get("cpu", KILN_F32)), KILN_ERR_CORRUPT, "the signature does not match");
    falls_back(root, "a package signed with another key");
}

/* ---- the CLI and weight caches -------------------------------------------------------------- */

TEST(package_cli_leaves_caches_alone) {
    char root[1100], pkg[1600], cache[1300], path[1400];
    fresh_copy("cli", root, sizeof root, pkg, sizeof pkg);
    snprintf(cache, sizeof cache, "%s/m-3f2a91/transformer-0123abcd", root);
    CHECK(shf("mkdir -p '%s'", cache) == 0);
    snprintf(path, sizeof path, "%s/manifest.json", cache);
    spit(path, "kiln-cache 1 xxh3:0000000000000000\n{\"tensors\": []}\n");
    const char *bin = kiln_bin();
    CHECK(shf("'%s' package ls --package-dir '%s' | grep -q transformer-0123abcd", bin, root) != 0);
    CHECK(shf("'%s' package ls --package-dir '%s' | grep -q '%s'", bin, root, g_name) == 0);
    CHECK(shf("'%s' package verify --package-dir '%s' >/dev/null", bin, root) == 0);
    CHECK(shf("'%s' package verify --package-dir '%s' m-3f2a91/transformer-0123abcd 2>&1 | grep -q 'weight cache, not a package'", bin,
              root) == 0);
    CHECK(shf("'%s' package rm --package-dir '%s' m-3f2a91/transformer-0123abcd >/dev/null 2>&1", bin, root) != 0);
    CHECK(exists(path));
    CHECK(shf("'%s' package rm --all --package-dir '%s' >/dev/null", bin, root) == 0);
    CHECK(exists(path));
    CHECK(!exists(pkg));
}

int main(void) {
    test_tmpdir(g_tmp, sizeof g_tmp, "pkgtrust");
    chmod(g_tmp, 0755);
    RUN(umask_000_compile_is_private);
    if (!*g_name) {
        fprintf(stderr, "no master package: the rest cannot run\n");
        return TEST_SUMMARY() | 1;
    }
    RUN(planted_so_never_runs);
    RUN(open_folders_are_refused);
    RUN(symbolic_links_are_refused);
    RUN(other_owners_are_refused);
    RUN(manifest_reproducers);
    RUN(edited_manifest_is_refused_at_open);
    RUN(keys_other_and_shared);
    RUN(package_cli_leaves_caches_alone);
    test_rmrf(g_tmp);
    return TEST_SUMMARY();
}
