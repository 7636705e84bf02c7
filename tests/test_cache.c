/* test_cache.c - the weight cache: key names, every branch of the load
 * flow, corruption and truncation, superseded and stale folders, the
 * callback source, that a hit computes bitwise what conversion does, and
 * memory running out while a miss converts and publishes. */
#include "base/base.h"
#include "cache/cache.h"
#include "golden_util.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <unistd.h>

static kiln_load_opts opts(const char *root, const char *source) {
    kiln_load_opts o = kiln_load_defaults();
    o.model_name = "sd35-tiny";
    o.cache_root = root;
    o.source = source;
    return o;
}

/* a private copy of the golden model folder (its mtime is ours to change) */
static void copy_model(const char *golden, const char *dir) {
    const char *files[] = {"config.json", "diffusion_pytorch_model.safetensors"};
    kb_mkdir_p(dir);
    for (int i = 0; i < 2; i++) {
        char *data, to[600];
        size_t len;
        snprintf(to, sizeof to, "%s/%s", dir, files[i]);
        if (kb_read_file(golden_path(golden, files[i]), &data, &len) || kb_write_file_atomic(to, data, len)) exit(2);
        free(data);
    }
}

TEST(key_names) {
    kcache_key_inputs in = {.model = "sd3-medium", .component = "transformer", .mesh_rows = 4, .mesh_cols = 4,
                            .dtype = KILN_BF16, .fsdp = 1, .layout = "packed", .layout_version = 1,
                            .source_hash = 42};
    in.parallel.cfg = (kiln_par_dim){2, 1};
    in.parallel.tp = (kiln_par_dim){4, 1};
    in.parallel.sp = (kiln_par_dim){4, 0};
    kcache_key k;
    CHECK_OK(kcache_key_make("/r/", &in, &k));
    CHECK_MSG(!strcmp(k.prefix, "CP2_1_TP4_1_SP4_0_mesh4x4_bf16_FSDP_packed"), "prefix %s", k.prefix);
    CHECK(strlen(k.content) == 12 && !strncmp(k.name, k.prefix, strlen(k.prefix)));
    CHECK_MSG(!strncmp(k.dir, "/r/sd3-medium/transformer/CP2_1_TP4_1_SP4_0_mesh4x4_bf16_FSDP_packed_c", 70), "%s", k.dir);
    CHECK(!strcmp(k.dir, k.path));
    /* the content changes with the source and with the layout version */
    kcache_key k2;
    in.source_hash = 43;
    CHECK_OK(kcache_key_make("/r", &in, &k2));
    CHECK(strcmp(k.content, k2.content) != 0);
    in.source_hash = 42;
    in.layout_version = 2;
    CHECK_OK(kcache_key_make("/r", &in, &k2));
    CHECK(strcmp(k.content, k2.content) != 0);
    /* several hosts: a folder for the mesh coordinates this host owns */
    in.host_coords = 1;
    in.host_r0 = 0, in.host_r1 = 1, in.host_c0 = 0, in.host_c1 = 3;
    CHECK_OK(kcache_key_make("/r", &in, &k2));
    CHECK_MSG(strstr(k2.path, "/host_coords_r0-1_c0-3") && !strncmp(k2.path, k2.dir, strlen(k2.dir)), "%s", k2.path);
    /* plain single process */
    kcache_key_inputs one = {.model = "m", .component = "transformer", .mesh_rows = 1, .mesh_cols = 1,
                             .dtype = KILN_F32};
    one.parallel.cfg.factor = one.parallel.tp.factor = one.parallel.sp.factor = 1;
    CHECK_OK(kcache_key_make("/r", &one, &k2));
    CHECK_MSG(!strcmp(k2.prefix, "mesh1x1_f32"), "%s", k2.prefix);
    /* what a user can get wrong */
    one.model = "../etc";
    CHECK_FAILS(kcache_key_make("/r", &one, &k2), KILN_ERR_INVALID_ARG, "model name");
    one.model = "m";
    one.parallel.tp = (kiln_par_dim){3, 1};
    CHECK_FAILS(kcache_key_make("/r", &one, &k2), KILN_ERR_INVALID_ARG, "does not divide");
    one.parallel.tp = (kiln_par_dim){1, 1};
    one.host_coords = 1;
    one.host_r1 = 2;
    CHECK_FAILS(kcache_key_make("/r", &one, &k2), KILN_ERR_INVALID_ARG, "outside");
}

TEST(flow_without_cache_root) {
    setenv("KILN_CACHE_DIR", "", 1); /* set and empty: no cache (unset: the default root) */
    kiln_model *m = NULL, *m2 = NULL;
    kiln_load_opts o = opts(NULL, NULL);
    CHECK_FAILS(kiln_load_model(&o, &m), KILN_ERR_INVALID_ARG, "KILN_CACHE_DIR");
    o.source = golden_path("sd35-tiny", NULL);
    CHECK_OK(kiln_load_model(&o, &m));
    CHECK(m && !strcmp(kiln_model_origin(m), "no-cache") && !*kiln_model_cache_path(m));
    /* already loaded: nothing happens, the same model comes back */
    CHECK_OK(kiln_load_model(&o, &m2));
    CHECK(m2 == m);
    kiln_model_free(m2);
    kiln_model_free(m);
}

TEST(flow_with_cache_root) {
    char root[256], src[300];
    test_tmpdir(root, sizeof root, "cache-flow");
    snprintf(src, sizeof src, "%s/src", root);
    copy_model("sd35-tiny", src);
    kiln_model *m = NULL, *again = NULL, *ref = NULL;

    /* no complete cache and no source: the error carries the path it looked at */
    kiln_load_opts o = opts(root, NULL);
    CHECK_FAILS(kiln_load_model(&o, &m), KILN_ERR_CACHE_MISSING, root);
    char want[200];
    snprintf(want, sizeof want, "sd35-tiny/transformer/%s", default_key_prefix());
    CHECK_MSG(strstr(kiln_last_error(), want), "%s", kiln_last_error());

    /* a miss converts and publishes */
    o.source = src;
    CHECK_OK(kiln_load_model(&o, &m));
    if (!m) goto out;
    CHECK(!strcmp(kiln_model_origin(m), "miss"));
    char path[2600];
    snprintf(path, sizeof path, "%s", kiln_model_cache_path(m));
    char man[2700], data[2700];
    snprintf(man, sizeof man, "%s/manifest.json", path);
    snprintf(data, sizeof data, "%s/weights.bin", path);
    CHECK(kb_is_file(man) && kb_is_file(data));
    /* already loaded */
    CHECK_OK(kiln_load_model(&o, &again));
    CHECK(again == m);
    kiln_model_free(again);

    /* a hit, from another "process" (after the first is released) */
    size_t n1, n2, n3;
    float *miss_out = golden_forward(m, "sd35-tiny", &n1);
    kiln_model_free(m);
    m = NULL;
    CHECK_OK(kiln_load_model(&o, &m));
    CHECK(m && !strcmp(kiln_model_origin(m), "hit"));
    float *hit_out = m ? golden_forward(m, "sd35-tiny", &n2) : NULL;
    /* the conversion path without any cache: bitwise the same numbers */
    CHECK_OK(kiln_model_open(src, NULL, &ref));
    float *conv_out = ref ? golden_forward(ref, "sd35-tiny", &n3) : NULL;
    CHECK(miss_out && hit_out && conv_out && n1 == n2 && n2 == n3);
    if (miss_out && hit_out && conv_out) {
        CHECK(!memcmp(miss_out, hit_out, n1 * 4));
        CHECK(!memcmp(hit_out, conv_out, n1 * 4));
    }
    free(miss_out);
    free(hit_out);
    free(conv_out);
    kiln_model_free(ref);
    kiln_model_free(m);
    m = NULL;

    /* a complete cache without a source: found by its key, mapped */
    o.source = NULL;
    CHECK_OK(kiln_load_model(&o, &m));
    CHECK(m && !strcmp(kiln_model_origin(m), "hit") && !strcmp(kiln_model_cache_path(m), path));
    kiln_model_free(m);
    m = NULL;

    /* KILN_CACHE_DIR stands in for cache_root */
    setenv("KILN_CACHE_DIR", root, 1);
    o.cache_root = NULL;
    CHECK_OK(kiln_load_model(&o, &m));
    CHECK(m && !strcmp(kiln_model_cache_path(m), path));
    kiln_model_free(m);
    m = NULL;
    unsetenv("KILN_CACHE_DIR");
out:
    test_rmrf(root);
}

/* An allocation failing anywhere while a miss converts and publishes
 * (reading the checkpoint's tensors, packing each linear): the load fails
 * with KILN_ERR_NOMEM and publishes nothing, and the next load converts and
 * publishes as if nothing had happened; or it succeeds with the numbers of
 * an unarmed load. Each allocation in turn (the first few, then every
 * fifth: all go through the same lines) until a load needs no more. */
TEST(out_of_memory_while_loading) {
    char root[256], src[300];
    test_tmpdir(root, sizeof root, "cache-oom");
    snprintf(src, sizeof src, "%s/src", root);
    copy_model("sd35-tiny", src);
    kiln_model *ref = NULL;
    size_t nref = 0;
    CHECK_OK(kiln_model_open(src, NULL, &ref));
    float *want = ref ? golden_forward(ref, "sd35-tiny", &nref) : NULL;
    kiln_model_free(ref);
    int done = !want;
    long fails = 0;
    for (long k = 0; !done && k < 5000; k += k < 4 ? 1 : 5) {
        char dir[300];
        snprintf(dir, sizeof dir, "%s/%ld", root, k);
        kiln_load_opts o = opts(dir, src);
        kiln_model *m = NULL;
        t_alloc_arm(k);
        kiln_status st = kiln_load_model(&o, &m);
        done = t_alloc_disarm() <= k;
        if (st) {
            fails++;
            CHECK_MSG(st == KILN_ERR_NOMEM && strstr(kiln_last_error(), "memory"), "allocation %ld failing: %s: %s",
                      k + 1, kiln_status_name(st), kiln_last_error());
            kcache_item *v;
            size_t n, complete = 0;
            CHECK_OK(kcache_list(dir, &v, &n));
            for (size_t i = 0; i < n; i++) complete += (size_t)v[i].complete;
            CHECK_MSG(complete == 0, "allocation %ld failing: %zu cache folders published", k + 1, complete);
            if (n) free(v);
            CHECK_OK(kiln_load_model(&o, &m));
            CHECK(m && !strcmp(kiln_model_origin(m), "miss"));
        }
        if (m) {
            size_t n = 0;
            float *got = golden_forward(m, "sd35-tiny", &n);
            CHECK_MSG(got && n == nref && !memcmp(got, want, n * sizeof(float)),
                      "allocation %ld failing: the model loaded computes other numbers", k + 1);
            free(got);
            kiln_model_free(m);
        }
        test_rmrf(dir);
    }
    CHECK(done && fails > 10);
    free(want);
    test_rmrf(root);
}

TEST(no_create_cache) {
    char root[256];
    test_tmpdir(root, sizeof root, "cache-nocreate");
    kiln_load_opts o = opts(root, golden_path("sd35-tiny", NULL));
    o.no_create_cache = 1;
    kiln_model *m = NULL;
    CHECK_OK(kiln_load_model(&o, &m));
    CHECK(m && !strcmp(kiln_model_origin(m), "miss") && !*kiln_model_cache_path(m));
    kiln_model_free(m);
    kcache_item *v;
    size_t n;
    CHECK_OK(kcache_list(root, &v, &n));
    size_t complete = 0;
    for (size_t i = 0; i < n; i++) complete += (size_t)v[i].complete;
    CHECK(complete == 0);
    free(v);
    test_rmrf(root);
}

/* publish once, return the cache folder */
static void publish_once(const char *root, const char *src, char *path, size_t cap) {
    kiln_load_opts o = opts(root, src);
    kiln_model *m = NULL;
    CHECK_OK(kiln_load_model(&o, &m));
    snprintf(path, cap, "%s", m ? kiln_model_cache_path(m) : "");
    kiln_model_free(m);
}

static void flip_byte(const char *file, long at) {
    FILE *f = fopen(file, "r+b");
    if (!f) exit(2);
    fseek(f, at, SEEK_SET);
    int c = fgetc(f);
    fseek(f, at, SEEK_SET);
    fputc(c ^ 0x40, f);
    fclose(f);
}

/* A mapping that fails for lack of address space (a memory limit, as in a
 * container) says nothing about the cache: the load fails with
 * KILN_ERR_NOMEM and the cache stays, to be a hit once there is room. (It
 * was taken for corruption, and a good cache removed to be rebuilt.) The
 * limit is set in a child, and not under ASan, which needs the room. */
TEST(out_of_memory_mapping_keeps_the_cache) {
#if defined(__SANITIZE_ADDRESS__)
    fprintf(stderr, "  (skipped under ASan: it reserves more address space than the limit allows)\n");
#else
    char root[256], src[300], path[600];
    test_tmpdir(root, sizeof root, "cache-nomap");
    snprintf(src, sizeof src, "%s/src", root);
    copy_model("sd35-tiny", src);
    publish_once(root, src, path, sizeof path);
    char data[700];
    snprintf(data, sizeof data, "%s/weights.bin", path);
    struct stat sb;
    CHECK(stat(data, &sb) == 0 && sb.st_size > (1 << 20));
    pid_t pid = fork();
    if (pid == 0) {
        /* room for everything but the weights: what the process maps now, plus a quarter of the file */
        unsigned long pages = 0;
        FILE *f = fopen("/proc/self/statm", "r");
        if (!f || fscanf(f, "%lu", &pages) != 1) _exit(3);
        fclose(f);
        struct rlimit rl = {(rlim_t)(pages * (unsigned long)sysconf(_SC_PAGESIZE) + (size_t)sb.st_size / 4),
                            RLIM_INFINITY};
        if (setrlimit(RLIMIT_AS, &rl) != 0) _exit(3);
        kiln_load_opts o = opts(root, src);
        kiln_model *m = NULL;
        kiln_status st = kiln_load_model(&o, &m);
        if (st != KILN_ERR_NOMEM) fprintf(stderr, "  child: %s: %s\n", kiln_status_name(st), kiln_last_error());
        _exit(st == KILN_ERR_NOMEM ? 0 : 1);
    }
    int ws = 0;
    waitpid(pid, &ws, 0);
    CHECK_MSG(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "the load under a memory limit did not fail with out of memory");
    kiln_load_opts o = opts(root, src);
    kiln_model *m = NULL;
    CHECK_OK(kiln_load_model(&o, &m));
    CHECK_MSG(m && !strcmp(kiln_model_origin(m), "hit"), "the cache was not kept: %s", m ? kiln_model_origin(m) : "-");
    kiln_model_free(m);
    test_rmrf(root);
#endif
}

TEST(corruption_is_caught) {
    char root[256], path[2600], file[2700];
    test_tmpdir(root, sizeof root, "cache-corrupt");
    publish_once(root, golden_path("sd35-tiny", NULL), path, sizeof path);
    kcache_entry *e = NULL;
    CHECK_OK(kcache_open(path, 1, &e));
    kcache_close(e);

    /* a flipped byte in the data: verify catches it, naming the tensor */
    snprintf(file, sizeof file, "%s/weights.bin", path);
    flip_byte(file, 1000);
    CHECK_FAILS(kcache_open(path, 1, &e), KILN_ERR_CORRUPT, "fails its xxh3 check");
    kiln_load_opts o = opts(root, NULL);
    o.verify = 1;
    kiln_model *m = NULL;
    CHECK_FAILS(kiln_load_model(&o, &m), KILN_ERR_CORRUPT, "xxh3");
    /* with a source at hand it is rebuilt */
    o.source = golden_path("sd35-tiny", NULL);
    CHECK_OK(kiln_load_model(&o, &m));
    CHECK(m && !strcmp(kiln_model_origin(m), "rebuilt"));
    kiln_model_free(m);
    m = NULL;
    CHECK_OK(kcache_open(path, 1, &e));
    kcache_close(e);

    /* a truncated data file is caught at load, verify or not */
    CHECK(truncate(file, 4096) == 0);
    CHECK_FAILS(kcache_open(path, 0, &e), KILN_ERR_CORRUPT, "truncated");
    o.source = NULL;
    o.verify = 0;
    CHECK_FAILS(kiln_load_model(&o, &m), KILN_ERR_CORRUPT, "truncated");
    o.source = golden_path("sd35-tiny", NULL);
    CHECK_OK(kiln_load_model(&o, &m));
    CHECK(m && !strcmp(kiln_model_origin(m), "rebuilt"));
    kiln_model_free(m);
    m = NULL;

    /* a tampered manifest fails its checksum */
    snprintf(file, sizeof file, "%s/manifest.json", path);
    flip_byte(file, 200);
    CHECK_FAILS(kcache_open(path, 0, &e), KILN_ERR_CORRUPT, "checksum");

    /* a folder without a manifest is never a hit */
    CHECK(unlink(file) == 0);
    CHECK_FAILS(kcache_open(path, 0, &e), KILN_ERR_CACHE_MISSING, path);
    o.source = NULL;
    CHECK_FAILS(kiln_load_model(&o, &m), KILN_ERR_CACHE_MISSING, "missing cache");
    o.source = golden_path("sd35-tiny", NULL);
    CHECK_OK(kiln_load_model(&o, &m));
    CHECK(m && !strcmp(kiln_model_origin(m), "miss"));
    kiln_model_free(m);
    test_rmrf(root);
}

TEST(superseded_and_stale_folders) {
    char root[256], src[300], path[2600], path2[2600], stale[2700];
    test_tmpdir(root, sizeof root, "cache-super");
    snprintf(src, sizeof src, "%s/src", root);
    copy_model("sd35-tiny", src);
    publish_once(root, src, path, sizeof path);
    /* a converter that died left a staging folder; an unrelated key must survive */
    snprintf(stale, sizeof stale, "%s.staging.999999.0", path);
    CHECK(mkdir(stale, 0755) == 0);
    char other[2700];
    snprintf(other, sizeof other, "%s/sd35-tiny/transformer/mesh1x1_f32_FSDP_c0123456789ab", root);
    CHECK(kb_mkdir_p(other) == KILN_OK);
    /* the checkpoint changes: a new key; the old cache is superseded */
    char cfg[400];
    snprintf(cfg, sizeof cfg, "%s/config.json", src);
    struct timespec ts[2] = {{0, UTIME_NOW}, {1000000000, 0}};
    CHECK(utimensat(AT_FDCWD, cfg, ts, 0) == 0);
    publish_once(root, src, path2, sizeof path2);
    CHECK(strcmp(path, path2) != 0);
    CHECK(kb_is_dir(path2) && !kb_is_dir(path));
    CHECK(kb_is_dir(other));
    /* stale staging of the new key is cleaned by the next conversion of that key */
    snprintf(stale, sizeof stale, "%s.staging.999999.0", path2);
    CHECK(mkdir(stale, 0755) == 0);
    CHECK(kcache_remove(path2) == KILN_OK);
    publish_once(root, src, path2, sizeof path2);
    CHECK(!kb_is_dir(stale));
    test_rmrf(root);
}

/* ---- a callback source ----------------------------------------------------- */

static kiln_status emit_golden(void *user, kiln_emit_fn emit, void *ctx) {
    st_file *f = user;
    for (size_t i = 0; i < st_count(f); i++) {
        const st_tensor *t = st_at(f, i);
        kiln_source_tensor s = {t->name, t->dtype, t->ndim, {0}, t->data};
        memcpy(s.shape, t->shape, sizeof s.shape);
        kiln_status st = emit(ctx, &s);
        if (st) return st;
    }
    return KILN_OK;
}

static kiln_status emit_nothing_then_fail(void *user, kiln_emit_fn emit, void *ctx) {
    (void)user;
    (void)emit;
    (void)ctx;
    return kb_fail(KILN_ERR_IO, "the weights server went away");
}

TEST(callback_source) {
    char root[256];
    test_tmpdir(root, sizeof root, "cache-cb");
    st_file *f = NULL;
    char *cfg = NULL;
    CHECK_OK(st_open(golden_path("sd35-tiny", "diffusion_pytorch_model.safetensors"), &f));
    CHECK_OK(kb_read_file(golden_path("sd35-tiny", "config.json"), &cfg, NULL));
    kiln_load_opts o = opts(root, NULL);
    o.source_fn = emit_golden;
    o.source_user = f;
    o.source_config_json = cfg;
    kiln_model *m = NULL;
    CHECK_FAILS(kiln_load_model(&o, &m), KILN_ERR_INVALID_ARG, "source_id");
    o.source_id = "sd35-tiny@golden";
    CHECK_OK(kiln_load_model(&o, &m));
    CHECK(m && !strcmp(kiln_model_origin(m), "miss"));
    size_t n1, n2;
    float *a = m ? golden_forward(m, "sd35-tiny", &n1) : NULL;
    kiln_model_free(m);
    m = NULL;
    o.source_fn = emit_nothing_then_fail; /* a hit never touches the source */
    CHECK_OK(kiln_load_model(&o, &m));
    CHECK(m && !strcmp(kiln_model_origin(m), "hit"));
    float *b = m ? golden_forward(m, "sd35-tiny", &n2) : NULL;
    CHECK(a && b && n1 == n2 && !memcmp(a, b, n1 * 4));
    kiln_model_free(m);
    m = NULL;
    /* a failing source on a miss: its error, nothing published */
    o.source_id = "another";
    CHECK_FAILS(kiln_load_model(&o, &m), KILN_ERR_IO, "went away");
    free(a);
    free(b);
    free(cfg);
    st_close(f);
    test_rmrf(root);
}

TEST(list_and_gc) {
    char root[256], path[2600];
    test_tmpdir(root, sizeof root, "cache-gc");
    publish_once(root, golden_path("sd35-tiny", NULL), path, sizeof path);
    kiln_load_opts o = opts(root, golden_path("sd3-tiny", NULL));
    o.model_name = "sd3-tiny";
    kiln_model *m = NULL;
    CHECK_OK(kiln_load_model(&o, &m));
    kiln_model_free(m);
    kcache_item *v;
    size_t n;
    CHECK_OK(kcache_list(root, &v, &n));
    CHECK(n == 2 && v[0].complete && v[1].complete && v[0].bytes > 0);
    free(v);
    int removed;
    int64_t freed;
    CHECK_OK(kcache_gc(root, 1 << 30, &removed, &freed, NULL, NULL));
    CHECK(removed == 0);
    CHECK_OK(kcache_gc(root, 0, &removed, &freed, NULL, NULL));
    CHECK(removed == 2 && freed > 0);
    CHECK_OK(kcache_list(root, &v, &n));
    CHECK(n == 0);
    free(v);
    test_rmrf(root);
}

TEST(unsupported_options_are_refused) {
    kiln_load_opts o = opts("/tmp", golden_path("sd35-tiny", NULL));
    kiln_model *m = NULL;
    o.mesh_cols = 2;
    CHECK_FAILS(kiln_load_model(&o, &m), KILN_ERR_INVALID_ARG, "does not match the parallel factors");
    o.parallel.tp.factor = 2; /* a 1x2 mesh, in a process started alone */
    if (kiln_dist_available()) CHECK_FAILS(kiln_load_model(&o, &m), KILN_ERR_INVALID_ARG, "needs 2 MPI ranks (mpirun -np 2)");
    else CHECK_FAILS(kiln_load_model(&o, &m), KILN_ERR_UNSUPPORTED, "built without MPI");
    CHECK(kiln_dist_size() == 1 && kiln_dist_rank() == 0); /* MPI was not started */
    o.parallel.tp.factor = 1;
    o.mesh_cols = 1;
    o.dtype = KILN_F8_E4M3;
    CHECK_FAILS(kiln_load_model(&o, &m), KILN_ERR_UNSUPPORTED, "F8_E4M3");
    o.dtype = KILN_F32;
    o.source_fn = emit_golden;
    CHECK_FAILS(kiln_load_model(&o, &m), KILN_ERR_INVALID_ARG, "not both");
}

/* kb_alloc_aligned: 64-byte alignment, 2 MiB (huge pages asked for) from
 * 2 MiB up unless KILN_NO_HUGE is set; every byte writable */
TEST(aligned_allocations) {
    size_t sizes[] = {1, 100, ((size_t)2 << 20) - 64, (size_t)2 << 20, ((size_t)5 << 20) + 3};
    for (int no_huge = 0; no_huge < 2; no_huge++) {
        if (no_huge) setenv("KILN_NO_HUGE", "1", 1);
        CHECK(kb_huge_pages() == !no_huge);
        for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
            unsigned char *p = kb_alloc_aligned(sizes[i]);
            CHECK(p != NULL);
            if (!p) continue;
            size_t align = !no_huge && sizes[i] >= ((size_t)2 << 20) ? (size_t)2 << 20 : 64;
            CHECK_MSG((uintptr_t)p % align == 0, "%zu bytes at %p, want %zu-byte alignment", sizes[i], (void *)p, align);
            memset(p, 0xa5, sizes[i]);
            CHECK(p[0] == 0xa5 && p[sizes[i] - 1] == 0xa5);
            kb_free_aligned(p);
        }
    }
    setenv("KILN_NO_HUGE", "0", 1); /* "0": huge pages stay on */
    CHECK(kb_huge_pages());
    unsetenv("KILN_NO_HUGE");
    /* asked for (madvise) only with KILN_HUGE=1, and never with KILN_NO_HUGE */
    CHECK(!kb_huge_pages_asked());
    setenv("KILN_HUGE", "1", 1);
    CHECK(kb_huge_pages_asked());
    unsigned char *p = kb_alloc_aligned((size_t)4 << 20);
    CHECK(p && (uintptr_t)p % ((size_t)2 << 20) == 0);
    kb_free_aligned(p);
    setenv("KILN_NO_HUGE", "1", 1);
    CHECK(!kb_huge_pages_asked());
    unsetenv("KILN_NO_HUGE");
    unsetenv("KILN_HUGE");
}

int main(void) {
    RUN(key_names);
    RUN(flow_without_cache_root);
    RUN(flow_with_cache_root);
    RUN(out_of_memory_while_loading);
    RUN(out_of_memory_mapping_keeps_the_cache);
    RUN(no_create_cache);
    RUN(corruption_is_caught);
    RUN(superseded_and_stale_folders);
    RUN(callback_source);
    RUN(list_and_gc);
    RUN(unsupported_options_are_refused);
    RUN(aligned_allocations);
    return TEST_SUMMARY();
}
