/* test_compile.c - the ahead-of-time compiler and its fallback chain:
 * guards and their messages, export errors, shapes outside the range, no C
 * compiler, tampered or mismatched packages (refused with a reason, the
 * next step computes the same numbers), racing publishers, the package CLI,
 * the forked-worker pattern (a parent opens the cache and the package, four
 * children each run a different width), and allocations failing anywhere in
 * a forward (test.h's t_alloc_arm). (Every golden also runs
 * through each step of the chain in test_goldens.) */
#include "base/base.h"
#include "compile/compile.h"
#include "compile/manifest.h"
#include "golden_util.h"
#include "codegen_util.h"
#include "model_util.h"
#include "model/model.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char g_tmp[1024];
static char cmd_buf[2048];
#define MODEL_DIR golden_path("sd35-tiny", NULL) /* patch 2, position table 96, dual attention */

/* run with one chain; returns the output (malloc'd) or NULL */
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

static kiln_model *open_model(const char *pkg_dir) {
    kiln_model *m = NULL;
    kiln_open_opts o = {.dtype = KILN_F32};
    CHECK_OK(kiln_model_open(MODEL_DIR, &o, &m));
    if (m && pkg_dir) CHECK_OK(kiln_model_set_package_dir(m, pkg_dir));
    return m;
}

static void subdir(char *buf, size_t cap, const char *name) {
    snprintf(buf, cap, "%s/%s", g_tmp, name);
    mkdir(buf, 0755);
}

static kiln_status compile(kiln_model *m, const char *dims, int H, int W, kiln_compile_result *r) {
    kiln_compile_opts o = kiln_compile_defaults();
    o.dims = dims;
    o.batch = 2;
    o.height = H;
    o.width = W;
    o.context_len = 77;
    return kiln_compile(m, &o, r);
}

/* a model with its own package folder dir (g_tmp/tag), compiled for dims
 * around the HxW example (NULL when it could not be opened) */
static kiln_model *compiled_model(char *dir, size_t cap, const char *tag, const char *dims, int H, int W,
                                  kiln_compile_result *r) {
    subdir(dir, cap, tag);
    kiln_model *m = open_model(dir);
    if (m) CHECK_OK(compile(m, dims, H, W, r));
    return m;
}

/* output of a step against the executor `step`, within tol */
static void same_as(kiln_model *m, const inputs *in, const float *got, const char *what, const char *step, double tol) {
    kiln_status st;
    float *want = run(m, step, in, &st);
    CHECK_OK(st);
    if (want && got) {
        double e = rel_l2(got, want, in->n_out);
        CHECK_MSG(e <= tol, "%s: relative L2 %.3g against %s", what, e, step);
    }
    free(want);
}

/* output of every step must equal eager's (f32: fused or op by op, the same function) */
static void same_as_eager(kiln_model *m, const inputs *in, const float *got, const char *what) {
    same_as(m, in, got, what, "eager", 1e-6);
}

TEST(guards) {
    kx_sym s[4] = {{"batch", 1, 2}, {"h_tok", 4, 4}, {"w_tok", 8, 16}, {"ctx_len", 77, 77}};
    kx_iospec in[2] = {{"hidden_states", 4, {{{0}}}}, {"timestep", 1, {{{0}}}}};
    in[0].dim[0].c[1] = 1;  /* batch */
    in[0].dim[1].c[0] = 16; /* channels */
    in[0].dim[2].c[2] = 2;  /* 2*h_tok */
    in[0].dim[3].c[4] = 2;  /* 2*w_tok */
    in[1].dim[0].c[1] = 1;  /* batch */
    char es[64];
    kx_expr_str(&in[0].dim[3], s, 4, es, sizeof es);
    CHECK(!strcmp(es, "2*w_tok"));
    kx_expr e = {{0}};
    e.c[6] = 1, e.c[0] = 333;
    kx_expr_str(&e, s, 4, es, sizeof es);
    CHECK_MSG(!strcmp(es, "h_tok*w_tok+333"), "%s", es);
    int64_t v[4];
    CHECK_OK(kx_solve(s, 4, in, 2, (const int64_t[][4]){{2, 16, 8, 24}, {2}}, v));
    CHECK(v[0] == 2 && v[1] == 4 && v[2] == 12 && v[3] == 77);
    CHECK_FAILS(kx_solve(s, 4, in, 2, (const int64_t[][4]){{2, 16, 8, 40}, {2}}, v), KILN_ERR_RANGE,
                "w_tok = 20 (from hidden_states dimension 3) is outside the package's range [8, 16]");
    CHECK_FAILS(kx_solve(s, 4, in, 2, (const int64_t[][4]){{2, 16, 8, 25}, {2}}, v), KILN_ERR_RANGE,
                "hidden_states dimension 3 is 25, which is not of the form 2*w_tok");
    CHECK_FAILS(kx_solve(s, 4, in, 2, (const int64_t[][4]){{2, 16, 10, 24}, {2}}, v), KILN_ERR_RANGE,
                "the package is fixed at h_tok = 4");
    CHECK_FAILS(kx_solve(s, 4, in, 2, (const int64_t[][4]){{2, 16, 8, 24}, {1}}, v), KILN_ERR_RANGE,
                "shared dimensions differ");
    CHECK_FAILS(kx_solve(s, 4, in, 2, (const int64_t[][4]){{2, 8, 8, 24}, {2}}, v), KILN_ERR_RANGE,
                "hidden_states dimension 1 is 8, the package needs 16");
}

/* a toy builder: x [n] -> silu(x) [n], ignoring symbol 1; or changing structure with symbol 0 */
static kiln_status toy_build(void *user, const int64_t *s, kg_graph *g) {
    int mode = *(int *)user;
    kg_init(g, NULL, NULL);
    kg_id x = kg_input(g, "x", 1, (int64_t[]){s[0]});
    if (mode == 1 && s[0] % 2) x = kg_silu(g, x); /* structure depends on the symbol */
    kg_mark_output(g, kg_silu(g, x));
    return g->status;
}

TEST(export_errors) {
    kx_export x;
    int mode = 0;
    kx_sym s[2] = {{"n", 4, 9}, {"unused", 1, 3}};
    CHECK_FAILS(kx_export_graph(toy_build, &mode, s, 2, &x), KILN_ERR_SHAPE,
                "unused is declared dynamic but the graph does not depend on it");
    s[1].hi = 1;
    CHECK_OK(kx_export_graph(toy_build, &mode, s, 2, &x));
    CHECK(x.dim[0][0].c[1] == 1 && x.dim[0][0].c[0] == 0 && x.g.nodes[0].shape[0] == 9); /* built at the largest */
    kx_export_free(&x);
    mode = 1;
    CHECK_FAILS(kx_export_graph(toy_build, &mode, s, 2, &x), KILN_ERR_SHAPE, "structure changes with n");

    char dir[1100];
    subdir(dir, sizeof dir, "export");
    kiln_model *m = open_model(dir);
    if (!m) return;
    kiln_compile_result r;
    CHECK_FAILS(compile(m, "w_tok=8:100", 16, 24, &r), KILN_ERR_RANGE, "position table");
    CHECK_FAILS(compile(m, "w_tok=0:5", 16, 24, &r), KILN_ERR_INVALID_ARG, "w_tok=0:5");
    CHECK_FAILS(compile(m, "depth=3", 16, 24, &r), KILN_ERR_INVALID_ARG, "unknown dimension");
    CHECK_FAILS(compile(m, "w_tok", 16, 24, &r), KILN_ERR_INVALID_ARG, "expected name=min:max");
    CHECK_FAILS(compile(m, NULL, 15, 24, &r), KILN_ERR_SHAPE, "example request");
    CHECK_FAILS(kiln_model_set_exec(m, "dynamic,jit"), KILN_ERR_INVALID_ARG, "unknown execution step 'jit'");
    kiln_model_set_package_dir(m, NULL);
    unsetenv("KILN_PACKAGE_DIR");
    CHECK_FAILS(compile(m, NULL, 16, 24, &r), KILN_ERR_INVALID_ARG, "no package folder");
    kiln_model_free(m);
}

TEST(outside_the_range_falls_back) {
    char dir[1100];
    kiln_compile_result r;
    kiln_model *m = compiled_model(dir, sizeof dir, "range", "w_tok=10:12,batch=1:2", 16, 24, &r);
    if (!m) return;
    CHECK_MSG(r.block_kinds == 3 && r.regions == 4, "%d kinds, %d regions", r.block_kinds, r.regions); /* dual-attention x2, plain, last */
    /* the compiler's passes folded each block's gate_adds into the GEMM epilogues (eager runs them apart) */
    char *code = NULL, path[1300];
    size_t len = 0;
    snprintf(path, sizeof path, "%s/model.c", r.path);
    CHECK_OK(kb_read_file(path, &code, &len));
    static gen_call calls[4096];
    int nc = code ? gen_calls(code, calls, 4096) : 0, gate_fold = 0, gate_adds = 0, joint = 0, concats = 0, image_only = 0;
    for (int i = 0; i < nc; i++) {
        const gen_call *c = &calls[i];
        gate_fold += !strcmp(c->op, "linear") && strcmp(c->ip[1], "0LL");
        gate_adds += !strcmp(c->op, "gate_add");
        concats += !strcmp(c->op, "concat_tokens");
        /* a joint attention (ip[1]); the last block asks with the image tokens alone (its context output is
         * dropped): no context queries, src[3] absent */
        if (!strcmp(c->op, "attention") && strcmp(c->ip[1], "0LL")) {
            joint++;
            image_only += c->absent[3];
        }
    }
    CHECK_MSG(nc > 0 && gate_fold && !gate_adds, "%d calls, %d linears with a gate_add folded in, %d gate_adds", nc,
              gate_fold, gate_adds);
    /* and the joint attention reads the image and context streams in place: no concatenation is left */
    CHECK_MSG(joint && !concats, "%d joint attentions, %d concatenations", joint, concats);
    CHECK_MSG(image_only == 1, "%d joint attentions with image queries only, want 1 (the last block)", image_only);
    free(code);
    inputs in;
    make_inputs(m, 2, 16, 32, 77, 1, &in); /* w_tok 16 > 12 */
    kiln_status st;
    float *got = run(m, "dynamic", &in, &st);
    CHECK(st == KILN_ERR_RANGE && strstr(kiln_last_error(), "outside the package's range [10, 12]"));
    free(got);
    got = run(m, "dynamic,planned", &in, &st);
    CHECK_OK(st);
    CHECK(!strcmp(kiln_model_last_exec(m), "planned"));
    same_as_eager(m, &in, got, "planned after dynamic refused the shape");
    free(got);
    /* the default chain compiles a fixed-shape package for it */
    got = run(m, "dynamic,fixed,planned,eager", &in, &st);
    CHECK_OK(st);
    CHECK(!strcmp(kiln_model_last_exec(m), "fixed"));
    same_as_eager(m, &in, got, "fixed-shape package");
    free(got);
    /* inside the range: the dynamic package, batch 1 too */
    free_inputs(&in);
    make_inputs(m, 1, 16, 20, 77, 2, &in);
    got = run(m, "dynamic", &in, &st);
    CHECK_OK(st);
    same_as_eager(m, &in, got, "dynamic package at batch 1, w_tok 10");
    free(got);
    free_inputs(&in);
    kiln_model_free(m);
}

/* the planned executor keeps the cropped position table between forwards of
 * one shape and remakes it when the shape changes (and back) */
TEST(planned_keeps_its_constants_per_shape) {
    kiln_model *m = open_model(NULL);
    if (!m) return;
    int shapes[][2] = {{16, 24}, {16, 24}, {20, 16}, {16, 24}};
    for (int k = 0; k < 4; k++) {
        inputs in;
        make_inputs(m, 1, shapes[k][0], shapes[k][1], 77, 10 + (uint64_t)k, &in);
        kiln_status st;
        float *got = run(m, "planned", &in, &st);
        CHECK_OK(st);
        char what[64];
        snprintf(what, sizeof what, "planned, forward %d (%dx%d)", k, shapes[k][0], shapes[k][1]);
        same_as_eager(m, &in, got, what);
        free(got);
        free_inputs(&in);
    }
    kiln_model_free(m);
}

/* ---- out of memory (test.h's t_alloc_arm) ---- */

/* one forward by `chain` with every aligned allocation from the k+1-th on
 * failing: it must fail with an out-of-memory message, or (falling back)
 * give what an unarmed forward gives (ref, or run here when NULL), within
 * tol. Returns 1 when the forward made no more than k allocations (so
 * nothing failed). */
static int armed_forward(kiln_model *m, const char *chain, const inputs *in, long k, double tol, const float *ref) {
    kiln_status st, st2;
    t_alloc_arm(k);
    float *got = run(m, chain, in, &st);
    long seen = t_alloc_disarm();
    const char *msg = kiln_last_error();
    if (!got)
        CHECK_MSG(st == KILN_ERR_NOMEM && (strstr(msg, "memory") || strstr(msg, "allocate")),
                  "%s, allocation %ld on failing: %s: %s", chain, k + 1, kiln_status_name(st), msg);
    float *own = ref ? NULL : run(m, chain, in, &st2);
    if (!ref) CHECK_OK(st2);
    const float *want = ref ? ref : own;
    if (got && want) {
        double e = rel_l2(got, want, in->n_out);
        CHECK_MSG(e <= tol, "%s, allocation %ld on failing: succeeded with relative L2 %.3g against an unarmed run",
                  chain, k + 1, e);
    }
    free(got);
    free(own);
    return seen <= k;
}

/* An allocation failing anywhere in a forward (an executor's arena or node
 * buffers, the kept position table, a kernel's work buffer, f32 and bf16
 * kernels) fails the forward with KILN_ERR_NOMEM or is worked around with
 * the same numbers; the forward never returns numbers nobody computed.
 * Each allocation in turn, until a forward needs no more. */
TEST(out_of_memory_fails_or_falls_back) {
    kiln_dtype dts[3] = {KILN_F32, KILN_BF16, KILN_BF16};
    kiln_quant quants[3] = {KILN_QUANT_NONE, KILN_QUANT_NONE, KILN_QUANT_INT8}; /* int8: its own kernels' buffers */
    double tols[3] = {1e-6, 2e-2, 2e-2}; /* bf16: a kernel may fall back to another (the AMX attention to strips) */
    int H = 16;
    for (int d = 0; d < 3; d++) {
        if (quants[d] && !quant_runs_here(quants[d], "out of memory with int8 weights")) continue;
        kiln_open_opts o = {.dtype = dts[d], .quant = quants[d]};
        /* planned: a fresh model each time (the arena and the kept position
         * table are the model's) and a larger shape each time (the kernels'
         * work buffers are their threads' and only grow) */
        int done = 0;
        for (long k = 0; !done && k < 40; k++) {
            kiln_model *m = NULL;
            CHECK_OK(kiln_model_open(MODEL_DIR, &o, &m));
            if (!m) return;
            H += 2;
            inputs in;
            make_inputs(m, 1, H, 24, 77, 60 + (uint64_t)k, &in);
            done = armed_forward(m, "planned", &in, k, tols[d], NULL);
            free_inputs(&in);
            kiln_model_free(m);
        }
        CHECK_MSG(done, "planned (%s%s): still allocating after 40 failures", kiln_dtype_name(dts[d]),
                  quants[d] ? ", int8" : "");
        if (quants[d]) continue;
        /* eager: its node buffers are allocated anew by every forward, each
         * failure handled by the same lines, so after the first few every
         * seventh (the kernels' buffers, grown by now, are the planned runs') */
        kiln_model *m = NULL;
        CHECK_OK(kiln_model_open(MODEL_DIR, &o, &m));
        if (!m) return;
        inputs in;
        make_inputs(m, 1, 16, 24, 77, 90, &in);
        kiln_status st;
        float *ref = run(m, "eager", &in, &st);
        CHECK_OK(st);
        done = !ref;
        for (long k = 0; !done && k < 2000; k += k < 4 ? 1 : 7) done = armed_forward(m, "eager", &in, k, tols[d], ref);
        CHECK_MSG(done, "eager (%s): still allocating after 2000", kiln_dtype_name(dts[d]));
        free(ref);
        free_inputs(&in);
        kiln_model_free(m);
    }
}

/* The same through a compiled package (its arena, the runtime's kernels):
 * a fresh model each time, so the package is bound again, and a wider
 * latent each time, inside the package's range, from wider than the tests
 * before ran (the kernels' buffers only grow). A package whose arena could
 * not be had is tried again on the next forward, not refused for good. */
TEST(out_of_memory_in_a_package) {
    char dir[1100];
    kiln_compile_result r;
    kiln_model *m = compiled_model(dir, sizeof dir, "oom-package", "w_tok=8:96", 16, 16, &r);
    if (!m) return;
    kiln_model_free(m);
    int done = 0, W = 96;
    for (long k = 0; !done && k < 40 && W <= 192; k++, W += 2) {
        if (!(m = open_model(dir))) return;
        inputs in;
        make_inputs(m, 2, 16, W, 77, 70 + (uint64_t)k, &in);
        done = armed_forward(m, "dynamic", &in, k, 1e-6, NULL);
        CHECK(!strcmp(kiln_model_last_exec(m), "dynamic"));
        free_inputs(&in);
        kiln_model_free(m);
    }
    CHECK_MSG(done, "dynamic package: still allocating after 40 failures");
}

TEST(no_compiler) {
    char dir[1100];
    kiln_compile_result r;
    kiln_model *m = compiled_model(dir, sizeof dir, "nocc", NULL, 16, 24, &r); /* this model has been compiled here */
    if (!m) return;
    setenv("KILN_CC", "/bin/false", 1);
    CHECK_FAILS(compile(m, "w_tok=4:8", 16, 24, &r), KILN_ERR_UNSUPPORTED, "the C compiler '/bin/false' failed (exit 1)");
    setenv("KILN_CC", "/nonexistent/cc", 1);
    CHECK_FAILS(compile(m, "w_tok=4:8", 16, 24, &r), KILN_ERR_UNSUPPORTED, "cannot run the C compiler '/nonexistent/cc'");
    setenv("KILN_CC", "/bin/false", 1);
    inputs in;
    make_inputs(m, 2, 16, 16, 77, 3, &in);
    kiln_status st;
    float *got = run(m, "dynamic,fixed,planned,eager", &in, &st);
    CHECK_OK(st);
    CHECK_MSG(!strcmp(kiln_model_last_exec(m), "planned"), "ran by %s", kiln_model_last_exec(m));
    unsetenv("KILN_CC");
    same_as_eager(m, &in, got, "planned without a compiler");
    free(got);
    free_inputs(&in);
    kiln_model_free(m);
}

/* edit one package's manifest with f(cJSON), and sign it again with this
 * user's key: an edit without the key is refused at open, before anything
 * in it is read (tests/test_package_trust.c); these cases test the checks
 * behind the signature (the plan digest, the CPU features, the parser) */
static void edit_manifest(const char *pkg, void (*f)(cJSON *)) {
    char path[1200];
    snprintf(path, sizeof path, "%s/manifest.json", pkg);
    FILE *fp = fopen(path, "rb");
    static char text[1 << 20];
    size_t n = fp ? fread(text, 1, sizeof text - 1, fp) : 0;
    if (fp) fclose(fp);
    text[n] = 0;
    cJSON *m = cJSON_Parse(text);
    CHECK(m != NULL);
    if (!m) return;
    f(m);
    char *out = cJSON_Print(m), sig[65];
    fp = fopen(path, "wb");
    fputs(out, fp);
    fclose(fp);
    CHECK_OK(kb_sign(out, strlen(out), sig));
    snprintf(path, sizeof path, "%s/signature", pkg);
    fp = fopen(path, "wb");
    fprintf(fp, "%s\n", sig);
    fclose(fp);
    free(out);
    cJSON_Delete(m);
}

static void foreign_cpu(cJSON *m) {
    cJSON_ReplaceItemInObject(m, "cpu_features", cJSON_CreateStringArray((const char *[]){"avx10_9"}, 1));
}

static void wider_range(cJSON *m) { /* a guard widened after the build */
    cJSON *sym = cJSON_GetArrayItem(cJSON_GetObjectItem(m, "symbols"), 2);
    cJSON_ReplaceItemInObject(sym, "max", cJSON_CreateNumber(40));
}

static void damage_library(const char *pkg) {
    char path[1200];
    snprintf(path, sizeof path, "%s/model.so", pkg);
    FILE *fp = fopen(path, "r+b");
    CHECK(fp != NULL);
    if (!fp) return;
    fseek(fp, 100, SEEK_SET);
    int c = fgetc(fp);
    fseek(fp, 100, SEEK_SET);
    fputc(c ^ 0x5a, fp);
    fclose(fp);
}

/* compile a fresh package, break it, check the refusal and the fallback */
static void refused(const char *tag, void (*edit)(cJSON *), int damage, const char *reason) {
    char dir[1100];
    kiln_compile_result r;
    kiln_model *m = compiled_model(dir, sizeof dir, tag, "w_tok=10:12", 16, 24, &r);
    if (!m) return;
    kiln_model_free(m);
    if (edit) edit_manifest(r.path, edit);
    if (damage) damage_library(r.path);
    m = open_model(dir);
    inputs in;
    make_inputs(m, 2, 16, 24, 77, 4, &in);
    kiln_status st;
    float *got = run(m, "dynamic", &in, &st);
    CHECK_MSG(st != KILN_OK && strstr(kiln_last_error(), reason), "%s: %s", tag, kiln_last_error());
    free(got);
    CHECK_MSG(kx_package_verify(r.path, kk_backend_get("cpu", KILN_F32)) != KILN_OK || edit == wider_range, "%s: verify passed", tag);
    got = run(m, "dynamic,planned", &in, &st);
    CHECK_OK(st);
    CHECK(!strcmp(kiln_model_last_exec(m), "planned"));
    same_as_eager(m, &in, got, tag);
    free(got);
    free_inputs(&in);
    kiln_model_free(m);
}

static void foreign_slot(cJSON *m) { /* an input placement naming a slot the forward does not have */
    cJSON *pl = cJSON_GetObjectItem(m, "placement"), *e;
    cJSON_ArrayForEach(e, pl) {
        if (!strcmp(cJSON_GetArrayItem(e, 0)->valuestring, "input")) {
            cJSON_ReplaceItemInArray(e, 1, cJSON_CreateNumber(7));
            break;
        }
    }
}

TEST(tampered_packages_are_refused) {
    refused("tampered-so", NULL, 1, "does not match its manifest's SHA-256");
    refused("foreign-cpu", foreign_cpu, 0, "needs CPU feature avx10_9, which this machine lacks");
    refused("edited-guard", wider_range, 0, "edited after the build");
    /* a manifest that cannot even be read is skipped at open: the chain goes on */
    refused("foreign-slot", foreign_slot, 0, "no dynamic package for this model");
    char dir[1100], pkg[1300];
    snprintf(dir, sizeof dir, "%s/foreign-slot", g_tmp);
    snprintf(cmd_buf, sizeof cmd_buf, "ls -d '%s'/sd3-*/batch*", dir);
    FILE *f = popen(cmd_buf, "r");
    if (f && fgets(pkg, sizeof pkg, f)) {
        pkg[strcspn(pkg, "\n")] = 0;
        kx_package *p = NULL;
        CHECK_FAILS(kx_package_open(pkg, &p), KILN_ERR_CORRUPT, "names an input or output slot the forward does not have");
        kx_package_close(p);
    } else {
        CHECK_MSG(0, "no package under %s", dir);
    }
    if (f) pclose(f);
}

/* the model's side of binding, with one weight hidden or reshaped */
typedef struct {
    kiln_model *m;
    const char *hide, *reshape;
} bind_ctx;

static int bind_some(void *user, const char *name, kx_bound *b) {
    bind_ctx *c = user;
    if (c->hide && !strcmp(name, c->hide)) return 0;
    const km_weight *w = km_find(c->m, name);
    if (!w) return 0;
    *b = (kx_bound){w->ndim, {w->shape[0], w->shape[1], w->shape[2], w->shape[3]}, &w->kw, w->data,
                    w->packed ? w->kw.packed_dtype : KILN_F32, w->layout};
    if (c->reshape && !strcmp(name, c->reshape)) b->shape[0]++;
    return 1;
}

TEST(binding_checks_every_weight) {
    char dir[1100];
    kiln_compile_result r;
    kiln_model *m = compiled_model(dir, sizeof dir, "bind", NULL, 16, 24, &r);
    if (!m) return;
    const char *cases[3][3] = {{"transformer_blocks.1.attn.to_q.weight", NULL, "transformer_blocks.1.attn.to_q.weight (missing)"},
                               {NULL, "context_embedder.weight", "context_embedder.weight (shape differs)"},
                               {NULL, NULL, NULL}};
    for (int i = 0; i < 3; i++) {
        kx_package *p = NULL;
        CHECK_OK(kx_package_open(r.path, &p));
        if (!p) break;
        bind_ctx c = {m, cases[i][0], cases[i][1]};
        if (cases[i][2]) CHECK_FAILS(kx_package_load(p, m->backend, NULL, bind_some, &c), KILN_ERR_MISSING, cases[i][2]);
        else CHECK_OK(kx_package_load(p, m->backend, NULL, bind_some, &c));
        kx_package_close(p);
    }
    kiln_model_free(m);
}

static int sh(const char *fmt, const char *a, const char *b) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, fmt, getenv("KILN_BIN") ? getenv("KILN_BIN") : "build/kiln", a, b);
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

TEST(racing_publishers_and_the_cli) {
    char dir[1100];
    subdir(dir, sizeof dir, "race");
    /* a compiler that died mid-build left its staging folder: the next compile removes it */
    pid_t dead = fork();
    if (dead == 0) _exit(0);
    waitpid(dead, NULL, 0);
    char cmd0[1400];
    /* four processes compile the same package at once: all succeed, one is published */
    CHECK(sh("for i in 1 2 3 4; do %s compile '%s' --dtype f32 --package-dir '%s' --dim w_tok=8:12 --latent 16x24 "
             "--context-len 77 --log error >/dev/null & done; wait", MODEL_DIR, dir) == 0);
    char cmd_out[8192] = "";
    char cmd[4096];
    /* plant the dead compiler's leftovers in the family folder and compile again */
    snprintf(cmd0, sizeof cmd0, "f=$(ls -d '%s'/sd3-*) && mkdir \"$f/.staging-%ld-0\" && touch \"$f/.staging-%ld-0/model.c\"", dir,
             (long)dead, (long)dead);
    CHECK(system(cmd0) == 0);
    /* a compile that died (issue 42): package ls shows its staging folder as interrupted */
    CHECK(sh("%s package ls --package-dir '%s' | grep -q 'interrupted: a compile that died'%s", dir, "") == 0);
    CHECK(sh("%s compile '%s' --dtype f32 --package-dir '%s' --dim w_tok=8:12 --latent 16x24 --context-len 77 --log error "
             ">/dev/null", MODEL_DIR, dir) == 0);
    snprintf(cmd, sizeof cmd, "%s package ls --package-dir '%s'", getenv("KILN_BIN") ? getenv("KILN_BIN") : "build/kiln", dir);
    FILE *p = popen(cmd, "r");
    size_t n = p ? fread(cmd_out, 1, sizeof cmd_out - 1, p) : 0;
    if (p) pclose(p);
    cmd_out[n] = 0;
    int lines = 0;
    for (char *q = cmd_out; (q = strchr(q, '\n')); q++) lines++;
    CHECK_MSG(lines == 3 && strstr(cmd_out, "w_tok=8..12") && strstr(cmd_out, "size ") && strstr(cmd_out, "1 package,"),
              "%s", cmd_out); /* a header, the package, the total */
    CHECK(sh("%s package verify --package-dir '%s' >/dev/null%s", dir, "") == 0);
    snprintf(cmd, sizeof cmd, "test -z \"$(find '%s' -name '.staging*')\"", dir);
    CHECK(system(cmd) == 0); /* no staging folder left behind */
    /* rm --all takes what a dead compile left too, and the family folders left empty */
    snprintf(cmd, sizeof cmd, "d='%s/vae-decoder-000000000000-f32-x/.staging-%ld-3' && mkdir -p \"$d\" && touch \"$d/model.c\"",
             dir, (long)dead);
    CHECK(system(cmd) == 0);
    CHECK(sh("%s package rm --all --package-dir '%s' | grep -q 'an interrupted compile'%s", dir, "") == 0);
    CHECK(sh("%s package ls --package-dir '%s' | grep -q 'no packages'%s", dir, "") == 0);
    snprintf(cmd, sizeof cmd, "test -z \"$(find '%s' -mindepth 1)\"", dir);
    CHECK(system(cmd) == 0); /* nothing left: no staging, no empty family folder */
    CHECK(sh("%s package frobnicate --package-dir '%s' 2>/dev/null%s", dir, "") == 2);
}

/* The package manifest harness's seeds parse with today's parser: a seed
 * stale by a format or ABI number stops at the version check and the
 * fuzzer tests nothing (issue 42: coverage 18 -> 32 in 23M runs). When a
 * bump makes this fail, regenerate them: tests/fuzz/make_package_seeds.sh. */
TEST(fuzz_seeds_follow_the_abi) {
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/../fuzz/corpus/package_manifest", test_data_dir());
    DIR *d = opendir(dir);
    CHECK_MSG(d != NULL, "no seeds at %s", dir);
    struct dirent *e;
    int n = 0;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char *p = kb_path_join(dir, e->d_name), *text = NULL;
        size_t len = 0;
        kx_manifest *m = NULL;
        CHECK_OK(kb_read_file(p, &text, &len));
        kiln_status st = text ? kx_manifest_parse(text, len, e->d_name, &m) : KILN_ERR_IO;
        CHECK_MSG(st == KILN_OK, "seed %s no longer parses (%s): run tests/fuzz/make_package_seeds.sh build/kiln",
                  e->d_name, kiln_last_error());
        kx_manifest_free(m);
        free(text);
        free(p);
        n++;
    }
    if (d) closedir(d);
    CHECK(n >= 6);
}

/* The forked-worker pattern: the parent maps the cache and opens the
 * package (manifest only, no kernel has run), four children each run a
 * different width through the package; the parent then checks each. */
TEST(forked_workers) {
    char cache[1100];
    subdir(cache, sizeof cache, "fork-cache");
    const char *bin = getenv("KILN_BIN") ? getenv("KILN_BIN") : "build/kiln";
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s compile '%s' --dtype f32 --cache-dir '%s' --dim w_tok=6:12 --batch 2 --latent 16x24 "
                              "--context-len 77 --log error >/dev/null", bin, MODEL_DIR, cache);
    CHECK(system(cmd) == 0);
    kiln_load_opts o = kiln_load_defaults();
    o.model_name = "fork";
    o.source = MODEL_DIR;
    o.cache_root = cache;
    o.dtype = KILN_F32;
    kiln_model *m = NULL;
    /* the cache build (which packs weights with threads) runs in a child too */
    snprintf(cmd, sizeof cmd, "%s cache build '%s' --dtype f32 --name fork --cache-dir '%s' --log error >/dev/null", bin,
             MODEL_DIR, cache);
    CHECK(system(cmd) == 0);
    CHECK_OK(kiln_load_model(&o, &m));
    if (!m) return;
    CHECK(!strcmp(kiln_model_origin(m), "hit"));
    int n = 0;
    CHECK_OK(kiln_model_open_packages(m, &n));
    CHECK(n == 1);
    const int widths[4] = {12, 14, 20, 24};
    pid_t pid[4];
    for (int k = 0; k < 4; k++) {
        if ((pid[k] = fork()) == 0) {
            inputs in;
            make_inputs(m, 2, 16, widths[k], 77, 10 + (uint64_t)k, &in);
            kiln_status st;
            float *got = run(m, "dynamic", &in, &st);
            char path[1200];
            snprintf(path, sizeof path, "%s/out%d.bin", g_tmp, k);
            FILE *f = got ? fopen(path, "wb") : NULL;
            int ok = f && fwrite(got, sizeof(float), in.n_out, f) == in.n_out;
            if (f) fclose(f);
            if (!got) fprintf(stderr, "child %d: %s\n", k, kiln_last_error());
            _exit(ok ? 0 : 1);
        }
    }
    for (int k = 0; k < 4; k++) {
        int ws = 0;
        waitpid(pid[k], &ws, 0);
        CHECK_MSG(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "child %d (width %d) failed", k, widths[k]);
    }
    for (int k = 0; k < 4; k++) {
        inputs in;
        make_inputs(m, 2, 16, widths[k], 77, 10 + (uint64_t)k, &in);
        float *got = calloc(in.n_out, sizeof(float));
        char path[1200];
        snprintf(path, sizeof path, "%s/out%d.bin", g_tmp, k);
        FILE *f = fopen(path, "rb");
        CHECK(f && fread(got, sizeof(float), in.n_out, f) == in.n_out);
        if (f) fclose(f);
        same_as_eager(m, &in, got, "a forked child's package run");
        free(got);
        free_inputs(&in);
    }
    kiln_model_free(m);
}

/* kiln compile of a quantized backbone runs the quality gate first */
TEST(quantized_packages_pass_the_quality_gate) {
    char dir[1100];
    subdir(dir, sizeof dir, "quant");
    if (!quant_runs_here(KILN_QUANT_INT8, "quantized package")) return;
    kiln_open_opts bo = {.dtype = KILN_BF16}, qo = {.dtype = KILN_BF16, .quant = KILN_QUANT_INT8};
    kiln_model *base = NULL, *q = NULL;
    CHECK_OK(kiln_model_open(MODEL_DIR, &bo, &base));
    CHECK_OK(kiln_model_open(MODEL_DIR, &qo, &q));
    if (!base || !q) {
        kiln_model_free(base);
        kiln_model_free(q);
        return;
    }
    CHECK_OK(kiln_model_set_package_dir(q, dir));
    kiln_compile_opts o = kiln_compile_defaults();
    o.batch = 2, o.height = 16, o.width = 24, o.context_len = 77, o.dims = "w_tok=10:12";
    kiln_compile_result r;
    CHECK_FAILS(kiln_compile(q, &o, &r), KILN_ERR_INVALID_ARG, "needs the quality gate first");
    o.quality_base = base;
    CHECK_OK(kiln_compile(q, &o, &r));
    CHECK_MSG(r.quality_rel_l2 > 0 && r.quality_rel_l2 < 0.03, "gate error %g", r.quality_rel_l2);
    CHECK(strstr(r.path, "-qint8-") != NULL); /* the scheme is part of the package key */
    o.max_rel_l2 = r.quality_rel_l2 / 2; /* a gate this int8 cannot pass */
    CHECK_FAILS(kiln_compile(q, &o, &r), KILN_ERR_RANGE, "not published");
    o.force = 1;
    CHECK_OK(kiln_compile(q, &o, &r));
    /* the int8 package computes what the int8 planned executor does (the same
     * graph passes), and eager within int8's noise: eager quantizes the f32
     * activations of the unfused ops, the passes' bf16 ones */
    inputs in;
    make_inputs(q, 2, 16, 24, 77, 5, &in);
    kiln_status st;
    float *got = run(q, "dynamic", &in, &st);
    CHECK_OK(st);
    same_as(q, &in, got, "int8 dynamic package", "planned", 1e-6);
    same_as(q, &in, got, "int8 dynamic package", "eager", 2e-2);
    free(got);
    free_inputs(&in);
    kiln_model_free(base);
    kiln_model_free(q);
}

int main(void) {
    test_tmpdir(g_tmp, sizeof g_tmp, "compile");
    RUN(guards);
    RUN(forked_workers); /* first: the parent must not have started kernel threads before it forks */
    RUN(export_errors);
    RUN(outside_the_range_falls_back);
    RUN(planned_keeps_its_constants_per_shape);
    RUN(out_of_memory_fails_or_falls_back);
    RUN(out_of_memory_in_a_package);
    RUN(no_compiler);
    RUN(tampered_packages_are_refused);
    RUN(binding_checks_every_weight);
    RUN(racing_publishers_and_the_cli);
    RUN(quantized_packages_pass_the_quality_gate);
    RUN(fuzz_seeds_follow_the_abi);
    test_rmrf(g_tmp);
    return TEST_SUMMARY();
}
