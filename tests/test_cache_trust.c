/* test_cache_trust.c - weight caches that are what they claim (issue 23):
 * another model's cache copied or symlinked under this key is never served,
 * a manifest not signed by this user's key is refused, every manifest field
 * is checked (each reproducer a clear error, never a signal), shapes that
 * disagree with the config are rebuilt with both shapes in the message,
 * files in place of folders are healed, `kiln cache` leaves packages alone,
 * two folders of one name keep two caches, a FIFO config fails at once, a
 * read-only root converts in memory, and a file size limit gives EFBIG and
 * a message rather than SIGXFSZ. */
#include "base/base.h"
#include "cache/cache.h"
#include "test.h"
#include "cli_util.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#define LAT 8
#define CTX_T 4

static char g_tmp[512];      /* scratch root of the whole test */
static char g_a[600];        /* seeded model, 2 layers */
static char g_b[600];        /* seeded model, 4 layers */
static float *g_ref_a, *g_ref_b; /* their forward outputs, converted without a cache */
static size_t g_nout;

static kiln_config small_config(int layers) {
    kiln_config c = kiln_config_demo();
    c.attention_head_dim = 64;
    c.num_attention_heads = 2;
    c.caption_projection_dim = 128;
    c.num_layers = layers;
    c.joint_attention_dim = 64;
    c.pooled_projection_dim = 64;
    c.pos_embed_max_size = 48;
    c.dual_attention_mask = 0;
    return c;
}

#define bin kiln_bin /* cli_util.h */

/* one forward on small deterministic inputs; a malloc'd output */
static float *forward(kiln_model *m) {
    if (!m) return NULL;
    const kiln_config *c = kiln_model_config(m);
    size_t nh = (size_t)c->in_channels * LAT * LAT, nc = (size_t)CTX_T * (size_t)c->joint_attention_dim,
           np = (size_t)c->pooled_projection_dim;
    float *hidden = malloc(nh * 4), *ctx = malloc(nc * 4), *pooled = malloc(np * 4), *out = malloc(nh * 4);
    float ts = 437.0f;
    kiln_status st = KILN_ERR_NOMEM;
    if (hidden && ctx && pooled && out) {
        kiln_noise(11, hidden, nh);
        kiln_noise(12, ctx, nc);
        kiln_noise(13, pooled, np);
        kiln_forward_args a = {.batch = 1, .height = LAT, .width = LAT, .context_len = CTX_T,
                               .hidden = hidden, .context = ctx, .pooled = pooled, .timestep = &ts};
        st = kiln_forward(m, &a, out);
    }
    free(hidden);
    free(ctx);
    free(pooled);
    if (st) {
        fprintf(stderr, "  forward: %s: %s\n", kiln_status_name(st), kiln_last_error());
        free(out);
        return NULL;
    }
    g_nout = nh;
    return out;
}

static kiln_load_opts opts(const char *root, const char *name, const char *source) {
    kiln_load_opts o = kiln_load_defaults();
    o.model_name = name;
    o.cache_root = root;
    o.source = source;
    o.dtype = KILN_F32;
    return o;
}

/* load, check the origin, return the cache folder in path (may be NULL) */
static kiln_model *load(const kiln_load_opts *o, const char *origin, char *path, size_t cap) {
    kiln_model *m = NULL;
    kiln_status st = kiln_load_model(o, &m);
    CHECK_MSG(st == KILN_OK, "load %s from %s: %s: %s", o->model_name, o->source ? o->source : "(no source)",
              kiln_status_name(st), kiln_last_error());
    if (m && origin) CHECK_MSG(!strcmp(kiln_model_origin(m), origin), "origin %s, want %s", kiln_model_origin(m), origin);
    if (path) snprintf(path, cap, "%s", m ? kiln_model_cache_path(m) : "");
    return m;
}

static int same_as(kiln_model *m, const float *ref) {
    float *y = forward(m);
    int same = y && ref && !memcmp(y, ref, g_nout * sizeof(float));
    free(y);
    return same;
}

static int sh(const char *fmt, ...) KB_PRINTF(1, 2);
static int sh(const char *fmt, ...) {
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    return system(cmd);
}

/* rewrite a manifest's body, with a valid xxh3 and (sign) a valid signature */
static void rewrite_manifest(const char *dir, const char *body, int sign) {
    char *p = kb_path_join(dir, KCACHE_MANIFEST), sig[65];
    if (sign) {
        if (kb_sign(body, strlen(body), sig)) exit(2);
    } else {
        memset(sig, 'a', 64);
        sig[64] = 0;
    }
    char *text = kb_strfmt(KCACHE_MAGIC " %d xxh3:%016llx hmac:%s\n%s\n", KCACHE_FORMAT_VERSION,
                           (unsigned long long)XXH3_64bits(body, strlen(body)), sig, body);
    if (!p || !text || kb_write_file_atomic(p, text, strlen(text))) exit(2);
    free(p);
    free(text);
}

/* the manifest body of the cache at dir, parsed (caller frees) */
static cJSON *manifest_json(const char *dir) {
    char *p = kb_path_join(dir, KCACHE_MANIFEST), *text = NULL;
    size_t len;
    cJSON *j = NULL;
    if (p && !kb_read_file(p, &text, &len) && strchr(text, '\n')) j = cJSON_Parse(strchr(text, '\n') + 1);
    free(p);
    free(text);
    return j;
}

static void put_manifest_json(const char *dir, cJSON *j, int sign) {
    char *body = cJSON_Print(j);
    rewrite_manifest(dir, body, sign);
    free(body);
}

/* ---- caches another user could have written (issue 42) ----------------------------- */

/* flip one byte in the middle of the cache's data file, keeping its size
 * (the signed manifest untouched): as the other user would */
static void flip_data(const char *cache_dir) {
    char *p = kb_path_join(cache_dir, KCACHE_DATA);
    FILE *f = p ? fopen(p, "r+b") : NULL;
    if (f && fseek(f, 0, SEEK_END) == 0) {
        long n = ftell(f);
        fseek(f, n / 2, SEEK_SET);
        int c = fgetc(f);
        fseek(f, n / 2, SEEK_SET);
        fputc(c ^ 0x40, f);
    }
    if (f) fclose(f);
    free(p);
}

TEST(another_users_cache_is_not_served) {
    char root[700], path[2400];
    snprintf(root, sizeof root, "%s/shared", g_tmp);
    CHECK_OK(kb_mkdir_p(root));
    kiln_load_opts o = opts(root, "a", g_a);
    kiln_model *m = load(&o, "miss", path, sizeof path);
    kiln_model_free(m);
    /* a root others may write (0777, no sticky bit): they could replace weights.bin */
    CHECK(chmod(root, 0777) == 0);
    flip_data(path);
    m = load(&o, "miss", NULL, 0); /* converted in memory: the flipped byte is never read */
    CHECK_MSG(m && same_as(m, g_ref_a), "a cache in a root others may write was served");
    CHECK_MSG(strstr(kiln_last_error(), "") != NULL, "%s", kiln_last_error());
    kiln_model_free(m);
    CHECK(kb_is_dir(path)); /* not ours to clear: left as it is */
    /* without a source there is nothing to convert from: refused by name */
    kiln_load_opts ns = opts(root, "a", NULL);
    m = NULL;
    CHECK_FAILS(kiln_load_model(&ns, &m), KILN_ERR_UNTRUSTED, "writable by others");
    CHECK(m == NULL);
    /* a data file others may write, in a root only this user may */
    CHECK(chmod(root, 0755) == 0 && sh("rm -rf '%s'/*", root) == 0);
    m = load(&o, "miss", path, sizeof path);
    kiln_model_free(m);
    char data[2500];
    snprintf(data, sizeof data, "%s/" KCACHE_DATA, path);
    CHECK(chmod(data, 0666) == 0);
    flip_data(path);
    m = load(&o, "miss", NULL, 0);
    CHECK_MSG(m && same_as(m, g_ref_a), "a cache whose data file others may write was served");
    kiln_model_free(m);
    CHECK_FAILS(kcache_check_trust(root, path), KILN_ERR_UNTRUSTED, "weights");
    /* a shared root with the sticky bit (1777) stays usable: a hit */
    CHECK(sh("rm -rf '%s'/*", root) == 0 && chmod(root, 01777) == 0);
    m = load(&o, "miss", path, sizeof path);
    kiln_model_free(m);
    m = load(&o, "hit", NULL, 0);
    CHECK(m && same_as(m, g_ref_a));
    kiln_model_free(m);
    CHECK_OK(kcache_check_trust(root, path));
    /* as root: a root folder another user owns, that user replacing weights.bin
     * with a copy one byte off (the probe, with nobody as that user) */
    if (getuid() != 0) {
        fprintf(stderr, "  SKIPPED (not root): another user's cache root, as that user\n");
    } else {
        CHECK(sh("rm -rf '%s'/*", root) == 0 && chmod(root, 0755) == 0);
        m = load(&o, "miss", path, sizeof path);
        kiln_model_free(m);
        CHECK(sh("chmod -R a+rX '%s' && chmod a+x '%s' && chown 65534 '%s'", g_tmp, g_tmp, root) == 0);
        fflush(stderr);
        pid_t pid = fork();
        if (pid == 0) {
            if (setgid(65534) != 0 || setuid(65534) != 0) _exit(4);
            /* nobody owns the root but not the folders in it: it renames the model folder away and plants a copy */
            char cmd[6000];
            snprintf(cmd, sizeof cmd, "cp -r '%s/a' '%s/a.copy' && mv '%s/a' '%s/a.old' && mv '%s/a.copy' '%s/a'",
                     root, root, root, root, root, root);
            if (system(cmd) != 0) _exit(3);
            flip_data(path);
            _exit(0);
        }
        int ws = 0;
        waitpid(pid, &ws, 0);
        CHECK_MSG(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "nobody could not plant its copy (status %d)", ws);
        m = load(&o, "miss", NULL, 0);
        CHECK_MSG(m && same_as(m, g_ref_a), "another user's planted cache was served");
        kiln_model_free(m);
        CHECK_FAILS(kcache_check_trust(root, path), KILN_ERR_UNTRUSTED, "owned by uid 65534");
    }
    CHECK(sh("chown -R %u '%s' 2>/dev/null; chmod -R u+w '%s'; rm -rf '%s'", (unsigned)getuid(), root, root, root) == 0);
}

/* ---- another model's cache under this key --------------------------------------- */

TEST(planted_copy_and_symlink_are_not_served) {
    char root[700], pa[2600], pb[2600];
    snprintf(root, sizeof root, "%s/plant", g_tmp);
    kiln_load_opts oa = opts(root, "a", g_a), ob = opts(root, "b", g_b);
    kiln_model *m = load(&oa, "miss", pa, sizeof pa);
    kiln_model_free(m);
    m = load(&ob, "miss", pb, sizeof pb);
    kiln_model_free(m);
    /* b's 4-layer cache copied where a's 2-layer one belongs */
    CHECK(sh("rm -rf '%s' && cp -a '%s' '%s'", pa, pb, pa) == 0);
    kiln_load_opts nosrc = opts(root, "a", NULL);
    m = NULL;
    CHECK_FAILS(kiln_load_model(&nosrc, &m), KILN_ERR_CORRUPT, "was made for another key: its model is \"b\", this load needs \"a\"");
    CHECK(m == NULL);
    nosrc.verify = 1; /* the data's hashes are fine: it is the key that is wrong */
    CHECK_FAILS(kiln_load_model(&nosrc, &m), KILN_ERR_CORRUPT, "another key");
    /* and `kiln cache verify`, which knows no load's key, compares it with the folder */
    char *vout = kb_strfmt("%s/plant-verify.txt", g_tmp), *vtext = NULL;
    int vrc = vout ? sh("'%s' cache verify --cache-dir '%s' > '%s' 2>&1", bin(), root, vout) : -1;
    if (vout && !kb_read_file(vout, &vtext, NULL))
        CHECK_MSG(WIFEXITED(vrc) && WEXITSTATUS(vrc) == 1 && strstr(vtext, "CORRUPT") &&
                  strstr(vtext, "its model is \"b\", the folder says \"a\""), "rc %d: %s", vrc, vtext);
    free(vtext);
    free(vout);
    /* verify removed what it found corrupt (issue 42): the next load converts anew */
    CHECK(!kb_is_dir(pa));
    m = load(&oa, "miss", NULL, 0);
    CHECK_MSG(same_as(m, g_ref_a), "a planted copy of b served for a");
    kiln_model_free(m);
    /* planted again, without a verify in between: the load itself rebuilds it */
    CHECK(sh("rm -rf '%s' && cp -a '%s' '%s'", pa, pb, pa) == 0);
    m = load(&oa, "rebuilt", NULL, 0);
    CHECK_MSG(same_as(m, g_ref_a), "a planted copy of b served for a");
    kiln_model_free(m);

    /* a symlink to b's cache: refused, rebuilt, and b's cache untouched */
    CHECK(sh("rm -rf '%s' && ln -s '%s' '%s'", pa, pb, pa) == 0);
    m = NULL;
    CHECK_FAILS(kiln_load_model(&nosrc, &m), KILN_ERR_CORRUPT, "symbolic link");
    m = load(&oa, "rebuilt", NULL, 0);
    CHECK_MSG(same_as(m, g_ref_a), "a symlinked cache of b served for a");
    kiln_model_free(m);
    struct stat st;
    CHECK(lstat(pa, &st) == 0 && S_ISDIR(st.st_mode));
    m = load(&ob, "hit", NULL, 0);
    CHECK_MSG(same_as(m, g_ref_b), "b's own cache damaged");
    kiln_model_free(m);
    /* a symlinked manifest or data file */
    char f[2700], g[2700];
    snprintf(f, sizeof f, "%s/" KCACHE_DATA, pa);
    snprintf(g, sizeof g, "%s/" KCACHE_DATA, pb);
    CHECK(unlink(f) == 0 && symlink(g, f) == 0);
    kcache_entry *e = NULL;
    CHECK_FAILS(kcache_open(pa, 0, &e), KILN_ERR_CORRUPT, "not a regular file (a symbolic link)");
    m = load(&oa, "rebuilt", NULL, 0);
    kiln_model_free(m);
    snprintf(f, sizeof f, "%s/" KCACHE_MANIFEST, pa);
    snprintf(g, sizeof g, "%s/" KCACHE_MANIFEST, pb);
    CHECK(unlink(f) == 0 && symlink(g, f) == 0);
    CHECK_FAILS(kcache_open(pa, 0, &e), KILN_ERR_CORRUPT, "symbolic link");
    m = load(&oa, "rebuilt", NULL, 0);
    kiln_model_free(m);
    /* under the same model name, another checkpoint: another key, and neither
     * is taken for the other */
    kiln_load_opts ob_as_a = opts(root, "a", g_b);
    m = load(&ob_as_a, "miss", NULL, 0);
    CHECK(same_as(m, g_ref_b));
    kiln_model_free(m);
    m = load(&oa, "hit", NULL, 0);
    CHECK(same_as(m, g_ref_a));
    kiln_model_free(m);
    test_rmrf(root);
}

/* ---- signatures -------------------------------------------------------------- */

TEST(unsigned_or_foreign_manifests_are_refused) {
    char root[700], pa[2600];
    snprintf(root, sizeof root, "%s/sig", g_tmp);
    kiln_load_opts oa = opts(root, "a", g_a), nosrc = opts(root, "a", NULL);
    kiln_model *m = load(&oa, "miss", pa, sizeof pa);
    kiln_model_free(m);
    m = NULL;
    /* edited by hand: the checksum recomputed, the signature not */
    cJSON *j = manifest_json(pa);
    CHECK(j != NULL);
    cJSON *cfg = cJSON_GetObjectItem(j, "config");
    cJSON_ReplaceItemInObject(cfg, "num_layers", cJSON_CreateNumber(4));
    put_manifest_json(pa, j, 0);
    CHECK_FAILS(kiln_load_model(&nosrc, &m), KILN_ERR_CORRUPT, "signature does not verify");
    m = load(&oa, "rebuilt", NULL, 0);
    CHECK(same_as(m, g_ref_a));
    kiln_model_free(m);
    m = NULL;
    /* the old format (no signature on the header line): rebuilt, not misread */
    char *p = kb_path_join(pa, KCACHE_MANIFEST), *text = NULL;
    size_t len;
    CHECK_OK(kb_read_file(p, &text, &len));
    char *body = text ? strchr(text, '\n') + 1 : NULL;
    char *old = body ? kb_strfmt("kiln-cache 1 xxh3:%016llx\n%s", (unsigned long long)XXH3_64bits(body, strlen(body) - 1), body) : NULL;
    CHECK(old && kb_write_file_atomic(p, old, strlen(old)) == KILN_OK);
    CHECK_FAILS(kiln_load_model(&nosrc, &m), KILN_ERR_CORRUPT, "manifest format 1, this kiln reads 2");
    m = load(&oa, "rebuilt", NULL, 0);
    kiln_model_free(m);
    m = NULL;
    free(old);
    free(text);
    free(p);
    /* made by another user: signed with another key */
    char keyf[700];
    snprintf(keyf, sizeof keyf, "%s/other.key", g_tmp);
    CHECK(sh("printf '%%s' 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef > '%s' && chmod 600 '%s'",
             keyf, keyf) == 0);
    setenv("KILN_PACKAGE_KEY_FILE", keyf, 1);
    put_manifest_json(pa, j, 1);
    unsetenv("KILN_PACKAGE_KEY_FILE");
    CHECK_FAILS(kiln_load_model(&nosrc, &m), KILN_ERR_CORRUPT, "not trusted");
    m = load(&oa, "rebuilt", NULL, 0);
    CHECK(same_as(m, g_ref_a));
    kiln_model_free(m);
    cJSON_Delete(j);
    test_rmrf(root);
}

/* ---- every field checked ------------------------------------------------------------ */

static kiln_status parse(const char *body, kcache_entry **e) {
    *e = calloc(1, sizeof **e);
    return kcache_manifest_parse(body, strlen(body), "test", *e);
}

static void refused(const char *tensors, uint64_t data_bytes, const char *want) {
    char *body = kb_strfmt("{\"format_version\": %d, \"key\": {}, \"config\": {}, \"data_file\": \"weights.bin\", "
                           "\"data_bytes\": %llu, \"tensors\": [%s]}", KCACHE_FORMAT_VERSION,
                           (unsigned long long)data_bytes, tensors);
    kcache_entry *e = NULL;
    CHECK_FAILS(parse(body, &e), KILN_ERR_CORRUPT, want);
    kcache_close(e);
    free(body);
}

#define T(shape, bytes, off) "{\"name\": \"x\", \"dtype\": \"F32\", \"shape\": " shape ", \"layout\": \"rowmajor\", " \
    "\"offset\": " off ", \"bytes\": " bytes ", \"xxh3\": \"0123456789abcdef\"}"

TEST(manifest_fields_are_checked) {
    kcache_entry *e = NULL;
    /* a good one parses */
    char *good = kb_strfmt("{\"format_version\": %d, \"key\": {\"model\": \"m\"}, \"config\": {}, \"data_file\": "
                           "\"weights.bin\", \"data_bytes\": 128, \"tensors\": [" T("[4, 4]", "64", "64") "]}",
                           KCACHE_FORMAT_VERSION);
    CHECK_OK(parse(good, &e));
    CHECK(e && e->n == 1 && e->t[0].offset == 64 && e->t[0].nbytes == 64 && e->t[0].shape[1] == 4);
    kcache_close(e);
    free(good);
    /* [2^32, 2^32] with bytes 0: 2^64 elements, not 0 */
    refused(T("[4294967296, 4294967296]", "0", "0"), 0, "overflows 64 bits");
    refused(T("[1000000000000000, 1000000000000000]", "0", "0"), 0, "overflows 64 bits");
    refused(T("[4611686018427387904]", "0", "0"), 0, "shape[0] is not an integer");
    refused(T("[2.5, 4]", "40", "0"), 64, "shape[0] is not an integer");
    refused(T("[-1]", "4", "0"), 64, "shape[0] is not an integer");
    refused(T("[1e300]", "4", "0"), 64, "shape[0] is not an integer");
    refused(T("[\"4\"]", "16", "0"), 64, "shape[0] is not an integer");
    refused(T("[4]", "16.5", "0"), 64, "offset and bytes must be integers");
    refused(T("[4]", "16", "-64"), 64, "offset and bytes must be integers");
    refused(T("[4]", "16", "1e300"), 64, "offset and bytes must be integers");
    refused(T("[4]", "16", "18446744073709551615"), 64, "offset and bytes must be integers");
    refused(T("[4]", "16", "9007199254740928"), 9007199254740936ull, "outside");
    refused(T("[16]", "64", "64"), 64, "outside");
    refused(T("[4]", "16", "8"), 64, "unaligned");
    refused(T("[4]", "20", "0"), 64, "20 bytes, its shape needs 16");
    refused(T("[1, 1, 1, 1, 1]", "4", "0"), 64, "rank 5");
    refused("{\"name\": \"x\", \"dtype\": \"F99\", \"shape\": [1], \"layout\": \"rowmajor\", \"offset\": 0, \"bytes\": 4, "
            "\"xxh3\": \"0123456789abcdef\"}", 64, "unknown dtype");
    refused("{\"name\": \"x\", \"dtype\": \"F32\", \"shape\": [1], \"layout\": \"rowmajor\", \"offset\": 0, \"bytes\": 4, "
            "\"xxh3\": \"xyz\"}", 64, "xxh3 is not 16 hex digits");
    refused("{\"name\": \"\", \"dtype\": \"F32\", \"shape\": [1], \"layout\": \"rowmajor\", \"offset\": 0, \"bytes\": 4, "
            "\"xxh3\": \"0123456789abcdef\"}", 64, "malformed");
    refused("42", 64, "malformed");
    refused("", 1e16, "data_bytes");
    const char *bodies[][2] = {
        {"[]", "not a JSON object"},
        {"{", "not a JSON object"},
        {"{\"format_version\": 2.5}", "format_version"},
        {"{\"format_version\": 2, \"data_file\": \"../../etc/passwd\", \"tensors\": []}", "data_file"},
        {"{\"format_version\": 2, \"data_file\": \"weights.bin\", \"tensors\": [], \"data_bytes\": -1}", "data_bytes"},
        {"{\"format_version\": 2, \"data_file\": \"weights.bin\", \"tensors\": [], \"data_bytes\": 0, \"key\": 1, "
         "\"config\": {}}", "key or config"},
    };
    for (size_t i = 0; i < sizeof bodies / sizeof *bodies; i++) {
        CHECK_FAILS(parse(bodies[i][0], &e), KILN_ERR_CORRUPT, bodies[i][1]);
        kcache_close(e);
    }
    /* the header line */
    int v;
    char sig[65];
    const char *b;
    size_t bl;
    const char *heads[][2] = {
        {"{}", "no kiln-cache header line"},
        {"kiln-cache\n{}", "no kiln-cache header line"},
        {"kiln-cache 99999999999 xxh3:0000000000000000 hmac:00\n{}", "format number"},
        {"kiln-cache 2 xxh3:00\n{}", "xxh3"},
        {"kiln-cache 2 xxh3:0000000000000000\n{}", "unsigned"},
        {"kiln-cache 2 xxh3:0000000000000000 hmac:0000000000000000000000000000000000000000000000000000000000000000\n{}",
         "checksum mismatch"},
    };
    for (size_t i = 0; i < sizeof heads / sizeof *heads; i++)
        CHECK_FAILS(kcache_manifest_split(heads[i][0], strlen(heads[i][0]), "test", &v, sig, &b, &bl), KILN_ERR_CORRUPT,
                    heads[i][1]);
}

/* The reproducers through the whole load: signed (as if this user's key had
 * made them), each a clear error without a source and a rebuild with one. */
TEST(signed_bad_manifests_fail_clearly_and_are_rebuilt) {
    char root[700], pa[2600];
    snprintf(root, sizeof root, "%s/bad", g_tmp);
    kiln_load_opts oa = opts(root, "a", g_a), nosrc = opts(root, "a", NULL);
    kiln_model *m = load(&oa, "miss", pa, sizeof pa);
    kiln_model_free(m);
    cJSON *orig = manifest_json(pa);
    CHECK(orig != NULL);
    if (!orig) return;
    int nt = cJSON_GetArraySize(cJSON_GetObjectItem(orig, "tensors"));
    struct {
        const char *field, *value; /* JSON; tensor field of the last tensor, or key.<name> */
        const char *want;
    } cases[] = {
        {"shape", "[4294967296, 4294967296]", "overflows 64 bits"},
        {"shape", "[0.5]", "not an integer"},
        {"offset", "1e300", "offset and bytes"},
        {"bytes", "0", "bytes, its shape needs"},
        /* the same element count in another shape: the model's check, with both shapes */
        {"shape", "[1, SAME]", "this build needs proj_out.bias F32 ["},
        {"key.dtype", "\"BF16\"", "its dtype is \"BF16\", this load needs \"F32\""},
        {"key.layout_version", "1", "its layout_version is 1"},
        {"key.part", "\"/shard_tp0of2\"", "its part is"},
        {"key.extra", "1", "its extra is 1, this load needs (absent)"},
        {"key.content", "\"000000000000\"", "its content is"},
        {"key.component", "\"vae\"", "its component is \"vae\""},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        cJSON *j = cJSON_Duplicate(orig, 1);
        cJSON *last = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "tensors"), nt - 1);
        char value[64];
        snprintf(value, sizeof value, "%s", cases[c].value);
        char *same = strstr(value, "SAME");
        if (same) {
            cJSON *s0 = cJSON_GetArrayItem(cJSON_GetObjectItem(last, "shape"), 0);
            snprintf(same, sizeof value - (size_t)(same - value), "%d]", s0 ? s0->valueint : 0);
        }
        cJSON *v = cJSON_Parse(value);
        if (!strncmp(cases[c].field, "key.", 4)) {
            cJSON *key = cJSON_GetObjectItem(j, "key");
            if (cJSON_GetObjectItem(key, cases[c].field + 4)) cJSON_ReplaceItemInObject(key, cases[c].field + 4, v);
            else cJSON_AddItemToObject(key, cases[c].field + 4, v);
        } else {
            cJSON_ReplaceItemInObject(last, cases[c].field, v);
        }
        put_manifest_json(pa, j, 1);
        cJSON_Delete(j);
        m = NULL;
        kiln_status st = kiln_load_model(&nosrc, &m);
        CHECK_MSG(st == KILN_ERR_CORRUPT && strstr(kiln_last_error(), cases[c].want), "%s = %s: %s: %s", cases[c].field,
                  cases[c].value, kiln_status_name(st), kiln_last_error());
        kiln_model_free(m);
        m = load(&oa, "rebuilt", NULL, 0);
        CHECK_MSG(same_as(m, g_ref_a), "%s = %s: the rebuilt cache computes other numbers", cases[c].field,
                  cases[c].value);
        kiln_model_free(m);
    }
    /* a manifest whose source is another checkpoint's */
    cJSON *j = cJSON_Duplicate(orig, 1);
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(j, "key"), "source_hash", cJSON_CreateString("0123456789abcdef"));
    put_manifest_json(pa, j, 1);
    cJSON_Delete(j);
    m = load(&nosrc, "hit", NULL, 0); /* without the source there is nothing to compare it with */
    kiln_model_free(m);
    m = load(&oa, "rebuilt", NULL, 0);
    kiln_model_free(m);
    /* a config that is not the source's (signed, so only the comparison can tell) */
    j = cJSON_Duplicate(orig, 1);
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(j, "config"), "num_attention_heads", cJSON_CreateNumber(1));
    put_manifest_json(pa, j, 1);
    cJSON_Delete(j);
    m = load(&oa, "rebuilt", NULL, 0);
    CHECK(same_as(m, g_ref_a));
    kiln_model_free(m);
    cJSON_Delete(orig);
    test_rmrf(root);
}

/* ---- files and folders in place of one another -------------------------------------- */

TEST(files_in_place_of_folders_are_healed) {
    char root[700], pa[2600], f[2700];
    snprintf(root, sizeof root, "%s/heal", g_tmp);
    kiln_load_opts oa = opts(root, "a", g_a), nosrc = opts(root, "a", NULL);
    kiln_model *m = load(&oa, "miss", pa, sizeof pa);
    kiln_model_free(m);
    m = NULL;
    /* the key folder replaced by a file */
    CHECK(sh("rm -rf '%s' && echo x > '%s'", pa, pa) == 0);
    CHECK_FAILS(kiln_load_model(&nosrc, &m), KILN_ERR_CORRUPT, "is not a folder");
    m = load(&oa, "rebuilt", NULL, 0);
    CHECK(same_as(m, g_ref_a));
    kiln_model_free(m);
    m = NULL;
    /* weights.bin replaced by a folder */
    snprintf(f, sizeof f, "%s/" KCACHE_DATA, pa);
    CHECK(sh("rm -f '%s' && mkdir '%s'", f, f) == 0);
    CHECK_FAILS(kiln_load_model(&nosrc, &m), KILN_ERR_CORRUPT, "weights.bin is not a regular file");
    m = load(&oa, "rebuilt", NULL, 0);
    kiln_model_free(m);
    m = NULL;
    /* manifest.json replaced by a folder */
    snprintf(f, sizeof f, "%s/" KCACHE_MANIFEST, pa);
    CHECK(sh("rm -f '%s' && mkdir '%s'", f, f) == 0);
    CHECK_FAILS(kiln_load_model(&nosrc, &m), KILN_ERR_CORRUPT, "manifest.json is not a regular file");
    m = load(&oa, "rebuilt", NULL, 0);
    kiln_model_free(m);
    m = NULL;
    /* the component folder replaced by a file: reported, naming it */
    char group[2600];
    snprintf(group, sizeof group, "%s/a/transformer", root);
    CHECK(sh("rm -rf '%s' && echo x > '%s'", group, group) == 0);
    CHECK_FAILS(kiln_load_model(&oa, &m), KILN_ERR_IO, "is not a folder");
    test_rmrf(root);
}

/* ---- caches and packages under one root ---------------------------------------------- */

TEST(cache_commands_leave_packages_alone) {
    char root[700], pkg[800], pkg2[800], pa[2600], f[900];
    snprintf(root, sizeof root, "%s/ns", g_tmp);
    kiln_load_opts oa = opts(root, "a", g_a);
    kiln_model *m = load(&oa, "miss", pa, sizeof pa);
    kiln_model_free(m);
    /* packages as the default layout keeps them, and one nested like a cache key */
    snprintf(pkg, sizeof pkg, "%s/packages/a/sd3-0123456789abcdef", root);
    snprintf(pkg2, sizeof pkg2, "%s/a/transformer/pkg_c0123456789ab", root);
    const char *pkgs[2] = {pkg, pkg2};
    for (int i = 0; i < 2; i++) {
        CHECK_OK(kb_mkdir_p(pkgs[i]));
        snprintf(f, sizeof f, "%s/manifest.json", pkgs[i]);
        const char *man = "{\n  \"format\": \"kiln-package\",\n  \"format_version\": 1\n}\n";
        CHECK_OK(kb_write_file_atomic(f, man, strlen(man)));
        snprintf(f, sizeof f, "%s/model.so", pkgs[i]);
        CHECK_OK(kb_write_file_atomic(f, "ELF", 3));
    }
    kcache_item *v = NULL;
    size_t n = 0;
    CHECK_OK(kcache_list(root, &v, &n));
    CHECK_MSG(n == 1 && !strcmp(v[0].dir, pa), "%zu items listed (want the one cache)", n);
    CHECK(n < 1 || !strcmp(v[0].source, g_a));
    free(v);
    int rc = sh("'%s' cache verify --cache-dir '%s' > '%s/verify.txt' 2>&1", bin(), root, g_tmp);
    CHECK_MSG(rc == 0, "kiln cache verify exit %d with packages under the root", rc);
    char *out = NULL, *p = kb_strfmt("%s/verify.txt", g_tmp);
    if (!p) return;
    if (!kb_read_file(p, &out, NULL)) CHECK_MSG(!strstr(out, "CORRUPT") && !strstr(out, "package"), "%s", out);
    free(out);
    out = NULL;
    rc = sh("'%s' cache ls --cache-dir '%s' > '%s' 2>&1", bin(), root, p);
    if (p && !kb_read_file(p, &out, NULL))
        CHECK_MSG(rc == 0 && strstr(out, "1 cache,") && strstr(out, g_a) && !strstr(out, "packages"), "%s", out);
    free(out);
    free(p);
    int removed;
    int64_t freed;
    CHECK_OK(kcache_gc(root, 0, &removed, &freed, NULL, NULL));
    CHECK(removed == 1);
    CHECK(sh("'%s' cache gc --max-size 0 --cache-dir '%s' >/dev/null 2>&1", bin(), root) == 0);
    CHECK(sh("'%s' cache rm --all --cache-dir '%s' >/dev/null 2>&1", bin(), root) == 0);
    for (int i = 0; i < 2; i++) {
        snprintf(f, sizeof f, "%s/model.so", pkgs[i]);
        CHECK_MSG(kb_is_file(f), "%s removed by cache gc/rm", pkgs[i]);
    }
    CHECK(!kb_is_dir(pa));
    test_rmrf(root);
}

/* ---- names that cannot collide -------------------------------------------------------- */

TEST(two_folders_of_one_name_keep_two_caches) {
    char root[700], a[700], b[700];
    snprintf(root, sizeof root, "%s/names", g_tmp);
    snprintf(a, sizeof a, "%s/x/m", g_tmp);
    snprintf(b, sizeof b, "%s/y/m", g_tmp);
    CHECK(sh("mkdir -p '%s/x' '%s/y' && cp -a '%s' '%s' && cp -a '%s' '%s'", g_tmp, g_tmp, g_a, a, g_b, b) == 0);
    /* the command: default names differ, both hit on the second round */
    for (int round = 0; round < 2; round++)
        for (int i = 0; i < 2; i++) {
            char *out = NULL, *p = kb_strfmt("%s/build.txt", g_tmp);
            int rc = sh("'%s' cache build '%s' --cache-dir '%s' --dtype f32 --quiet > '%s' 2>&1", bin(), i ? b : a, root, p);
            if (p && !kb_read_file(p, &out, NULL))
                CHECK_MSG(rc == 0 && !strncmp(out, round ? "hit: " : "miss: ", 5) && strstr(out, "/m-"),
                          "round %d, %s: %s", round, i ? b : a, out);
            free(out);
            free(p);
        }
    /* the library with one name for both (--name m): each keeps its cache,
     * neither removes the other's as superseded */
    kiln_load_opts o[2] = {opts(root, "m", a), opts(root, "m", b)};
    for (int round = 0; round < 2; round++)
        for (int i = 0; i < 2; i++) {
            kiln_model *m = load(&o[i], round ? "hit" : "miss", NULL, 0);
            CHECK_MSG(same_as(m, i ? g_ref_b : g_ref_a), "round %d: model %d computes the other's numbers", round, i);
            kiln_model_free(m);
        }
    /* a changed checkpoint still supersedes its own old cache */
    char cfg[800];
    snprintf(cfg, sizeof cfg, "%s/config.json", a);
    struct timespec ts[2] = {{0, UTIME_NOW}, {1000000000, 0}};
    CHECK(utimensat(AT_FDCWD, cfg, ts, 0) == 0);
    kiln_model *m = load(&o[0], "miss", NULL, 0);
    kiln_model_free(m);
    kcache_item *v;
    size_t n;
    CHECK_OK(kcache_list(root, &v, &n));
    int under_m = 0;
    for (size_t i = 0; i < n; i++) under_m += !strncmp(v[i].rel, "m/", 2);
    CHECK_MSG(under_m == 2, "%d caches under m (want a's new one and b's)", under_m);
    free(v);
    m = load(&o[1], "hit", NULL, 0);
    kiln_model_free(m);
    test_rmrf(root);
}

/* ---- the smaller ones ------------------------------------------------------------------- */

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "  FAIL: a load blocked on a FIFO config (alarm)\n";
    if (write(2, msg, sizeof msg - 1) < 0) {
    }
    _exit(3);
}

TEST(fifo_and_device_configs_are_refused_at_once) {
    char dir[700], root[700], cfg[800], w[900];
    snprintf(dir, sizeof dir, "%s/fifo-model", g_tmp);
    snprintf(root, sizeof root, "%s/fifo-root", g_tmp);
    CHECK(sh("mkdir -p '%s' && cp '%s/diffusion_pytorch_model.safetensors' '%s/'", dir, g_a, dir) == 0);
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    CHECK(mkfifo(cfg, 0644) == 0);
    signal(SIGALRM, on_alarm);
    alarm(20); /* a regression fails here instead of hanging the suite */
    kiln_load_opts o = opts(root, "fifo", dir);
    kiln_model *m = NULL;
    CHECK_FAILS(kiln_load_model(&o, &m), KILN_ERR_IO, "not a regular file");
    o.cache_root = NULL; /* converting without a cache reads it too */
    CHECK_FAILS(kiln_load_model(&o, &m), KILN_ERR_IO, "not a regular file");
    kiln_model *c = NULL;
    CHECK_FAILS(kiln_model_open(dir, NULL, &c), KILN_ERR_IO, "not a regular file");
    /* --config /dev/zero: a device, not "no config.json" */
    o = opts(root, "zero", g_a);
    o.config_path = "/dev/zero";
    CHECK_FAILS(kiln_load_model(&o, &m), KILN_ERR_IO, "/dev/zero is not a regular file");
    kiln_open_opts oo = {0};
    oo.config_path = "/dev/zero";
    CHECK_FAILS(kiln_model_open(g_a, &oo, &c), KILN_ERR_IO, "/dev/zero is not a regular file");
    /* a FIFO where the checkpoint belongs */
    snprintf(w, sizeof w, "%s/fifo.safetensors", g_tmp);
    CHECK(mkfifo(w, 0644) == 0);
    o = opts(root, "fifo2", w);
    CHECK_FAILS(kiln_load_model(&o, &m), KILN_ERR_IO, "not a regular file");
    alarm(0);
    signal(SIGALRM, SIG_DFL);
    test_rmrf(root);
}

/* A read-only root (here: one this user may not write; as root, by dropping
 * to nobody in a child): the load converts in memory with a warning; a cache
 * already there is still a hit. */
TEST(read_only_root_converts_in_memory) {
    char root[700];
    snprintf(root, sizeof root, "%s/ro", g_tmp);
    CHECK_OK(kb_mkdir_p(root));
    /* a cache made while it was writable */
    kiln_load_opts ob = opts(root, "b", g_b);
    kiln_model *m = load(&ob, "miss", NULL, 0);
    kiln_model_free(m);
    CHECK(sh("chmod -R a+rX '%s' && chmod a-w '%s' && chmod a+x '%s'", g_tmp, root, g_tmp) == 0);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        if (getuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0)) _exit(4);
        kiln_load_opts o = opts(root, "a", g_a);
        kiln_model *mm = NULL;
        kiln_status st = kiln_load_model(&o, &mm);
        if (st) {
            fprintf(stderr, "  child: %s: %s\n", kiln_status_name(st), kiln_last_error());
            _exit(1);
        }
        int ok = !strcmp(kiln_model_origin(mm), "miss") && !*kiln_model_cache_path(mm) && same_as(mm, g_ref_a);
        kiln_model_free(mm);
        o.no_create_cache = 1;
        if (ok && kiln_load_model(&o, &mm) == KILN_OK) kiln_model_free(mm);
        else ok = 0;
        _exit(ok ? 0 : 2);
    }
    int ws = 0;
    waitpid(pid, &ws, 0);
    if (WIFEXITED(ws) && WEXITSTATUS(ws) == 4) {
        fprintf(stderr, "  (cannot drop to an unprivileged user here: skipped)\n");
    } else {
        CHECK_MSG(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "a read-only root did not convert in memory (status %d)", ws);
    }
    CHECK(chmod(root, 0755) == 0);
    kcache_item *v;
    size_t n;
    CHECK_OK(kcache_list(root, &v, &n));
    CHECK(n == 1);
    free(v);
    test_rmrf(root);
}

/* ulimit -f: the write fails with EFBIG and a message; no SIGXFSZ */
TEST(file_size_limit_gives_a_message) {
    char root[700];
    snprintf(root, sizeof root, "%s/fsize", g_tmp);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        struct rlimit rl = {64 << 10, 64 << 10};
        if (setrlimit(RLIMIT_FSIZE, &rl) != 0) _exit(4);
        kiln_load_opts o = opts(root, "a", g_a);
        kiln_model *m = NULL;
        kiln_status st = kiln_load_model(&o, &m);
        int ok = st == KILN_ERR_IO && strstr(kiln_last_error(), "File too large") && strstr(kiln_last_error(), "ulimit");
        if (!ok) fprintf(stderr, "  child: %s: %s\n", kiln_status_name(st), kiln_last_error());
        _exit(ok ? 0 : 1);
    }
    int ws = 0;
    waitpid(pid, &ws, 0);
    CHECK_MSG(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "over the file size limit: status %d (signal %d)", ws,
              WIFSIGNALED(ws) ? WTERMSIG(ws) : 0);
    /* and the command (its own SIG_IGN in main) */
    char *p = kb_strfmt("%s/fsize.txt", g_tmp), *out = NULL;
    int rc = sh("ulimit -f 64; '%s' cache build '%s' --cache-dir '%s/fsize2' --dtype f32 > '%s' 2>&1", bin(), g_a,
                g_tmp, p);
    if (p && !kb_read_file(p, &out, NULL))
        CHECK_MSG(WIFEXITED(rc) && WEXITSTATUS(rc) == 1 && strstr(out, "File too large"), "rc %d: %s", rc, out);
    free(out);
    free(p);
    test_rmrf(root);
}

int main(void) {
    /* libgomp is not fork-safe once its pool has started, and the tests fork
     * after forwards in the parent: one kernel thread */
    kiln_set_threads(1);
    const char *t = getenv("TMPDIR");
    snprintf(g_tmp, sizeof g_tmp, "%s/kiln-test-trust-XXXXXX", t ? t : "/tmp");
    if (!mkdtemp(g_tmp)) return 2;
    char real[PATH_MAX]; /* sources are recorded by their absolute path */
    if (realpath(g_tmp, real) && strlen(real) < sizeof g_tmp) memcpy(g_tmp, real, strlen(real) + 1);
    snprintf(g_a, sizeof g_a, "%s/model-a", g_tmp);
    snprintf(g_b, sizeof g_b, "%s/model-b", g_tmp);
    kiln_config ca = small_config(2), cb = small_config(4);
    if (kiln_write_seeded_model(g_a, &ca, 1, KILN_F32) || kiln_write_seeded_model(g_b, &cb, 2, KILN_F32)) {
        fprintf(stderr, "cannot write the seeded models: %s\n", kiln_last_error());
        return 2;
    }
    kiln_open_opts oo = {0};
    oo.dtype = KILN_F32;
    kiln_model *ma = NULL, *mb = NULL;
    if (kiln_model_open(g_a, &oo, &ma) || kiln_model_open(g_b, &oo, &mb)) {
        fprintf(stderr, "cannot open the seeded models: %s\n", kiln_last_error());
        return 2;
    }
    g_ref_b = forward(mb);
    g_ref_a = forward(ma);
    kiln_model_free(ma);
    kiln_model_free(mb);
    if (!g_ref_a || !g_ref_b) return 2;
    RUN(planted_copy_and_symlink_are_not_served);
    RUN(unsigned_or_foreign_manifests_are_refused);
    RUN(manifest_fields_are_checked);
    RUN(signed_bad_manifests_fail_clearly_and_are_rebuilt);
    RUN(files_in_place_of_folders_are_healed);
    RUN(cache_commands_leave_packages_alone);
    RUN(two_folders_of_one_name_keep_two_caches);
    RUN(fifo_and_device_configs_are_refused_at_once);
    RUN(read_only_root_converts_in_memory);
    RUN(file_size_limit_gives_a_message);
    RUN(another_users_cache_is_not_served);
    free(g_ref_a);
    free(g_ref_b);
    test_rmrf(g_tmp);
    return TEST_SUMMARY();
}
