/* test_cli_user.c - what a new user hit (issue 41), each as the kiln command
 * shows it: a component of the wrong family, a model folder overwritten,
 * the staging of a killed build, images half written at a SIGINT, the
 * prompts file read two ways, a component the index lists and the folder
 * lacks, OpenMP's spin, one warning a process, the cache root's rules, and
 * the small things (messages, exit codes, listings) that make a tool feel
 * finished. */
#include "base/base.h"
#include "cli_util.h"
#include "format/safetensors.h"
#include "golden_util.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHECK_RUN(...) CHECK_RUN_WITH(kiln_sh, __VA_ARGS__)

static char g_dir[256], g_pipe[600];

static int count(const char *s, const char *sub) {
    int n = 0;
    for (const char *p = s; (p = strstr(p, sub)); p += strlen(sub)) n++;
    return n;
}

#define sh test_sh /* a shell line (no kiln): cli_util.h */

/* how many entries a folder holds (-1: it is not there) */
static int entries(const char *dir) {
    char *o = NULL;
    if (!kb_is_dir(dir)) return -1;
    kiln_sh(&o, "ls -A '%s' | wc -l", dir);
    int n = atoi(o);
    free(o);
    return n;
}

/* 1. generate --cond, quality on a component that is not a transformer:
 * refused naming both families, before anything converts (it segfaulted) */
TEST(wrong_family_refused) {
    char c[700], root[700];
    snprintf(c, sizeof c, "%s/cond.safetensors", g_dir);
    snprintf(root, sizeof root, "%s/wf-cache", g_dir);
    CHECK_RUN(0, "cond:", "$K make-model '%s/wf-model' --demo --cond '%s'", g_dir, c);
    static const char *const parts[3][2] = {{"vae", "vae-decoder"}, {"text_encoder", "clip"}, {"text_encoder_3", "t5"}};
    for (int k = 0; k < 3; k++) {
        char want[200];
        snprintf(want, sizeof want, "is a %s model", parts[k][1]);
        CHECK_RUN(1, want, "$K generate '%s/%s' --cond '%s' --output '%s/x.safetensors' --cache-dir '%s'", g_pipe,
                  parts[k][0], c, g_dir, root);
        CHECK_RUN(1, "needs an SD3 transformer", "$K generate '%s/%s' --cond '%s' --output '%s/x.safetensors' --cache-dir '%s'",
                  g_pipe, parts[k][0], c, g_dir, root);
    }
    CHECK_RUN(1, "is a vae-decoder model", "$K quality '%s/vae' --quant int8 --cache-dir '%s'", g_pipe, root);
    CHECK_MSG(entries(root) <= 0, "a refused command left caches in %s", root);
    char p[800];
    snprintf(p, sizeof p, "%s/x.safetensors", g_dir);
    CHECK(!kb_is_file(p));
}

/* 2. make-model into a folder that holds a model: refused without --force */
TEST(make_model_keeps_a_model) {
    char m[700], cfg[800], *before = NULL, *after = NULL;
    snprintf(m, sizeof m, "%s/mm", g_dir);
    snprintf(cfg, sizeof cfg, "%s/config.json", m);
    CHECK_RUN(0, "model:", "$K make-model '%s' --demo", m);
    size_t n1 = 0, n2 = 0;
    CHECK_OK(kb_read_file(cfg, &before, &n1));
    CHECK_RUN(1, "is not empty (it holds", "$K make-model '%s' --config '%s/text_encoder/config.json'", m, g_pipe);
    CHECK_OK(kb_read_file(cfg, &after, &n2));
    CHECK(before && after && n1 == n2 && !memcmp(before, after, n1));
    free(after);
    after = NULL;
    CHECK_RUN(1, "is a file", "$K make-model '%s' --demo", cfg);
    /* --force replaces it; a CLIP config writes transformers' model.safetensors, and no stale weights stay */
    CHECK_RUN(0, "clip", "$K make-model '%s' --force --config '%s/text_encoder/config.json'", m, g_pipe);
    char w[800];
    snprintf(w, sizeof w, "%s/model.safetensors", m);
    CHECK(kb_is_file(w));
    snprintf(w, sizeof w, "%s/diffusion_pytorch_model.safetensors", m);
    CHECK(!kb_is_file(w));
    CHECK_RUN(0, "family:", "$K info '%s'", m);
    free(before);
}

/* 3. the staging folder of a build that died: listed, counted and removed
 * by gc / rm; one whose build still holds the key's lock: not touched */
TEST(staging_of_a_killed_build) {
    char root[700], grp[900], key[1200];
    snprintf(root, sizeof root, "%s/st-cache", g_dir);
    CHECK_RUN(0, "miss", "$K cache build '%s/vae' --cache-dir '%s'", g_pipe, root);
    char *o = NULL;
    kiln_sh(&o, "ls -d '%s'/*/vae/*_c* | head -1", root);
    snprintf(key, sizeof key, "%.*s", (int)strcspn(o, "\n"), o);
    free(o);
    snprintf(grp, sizeof grp, "%.*s", (int)(strrchr(key, '/') - key), key);
    /* a build in progress: holds <key>.lock (flock) while its staging folder fills */
    char live[1400];
    snprintf(live, sizeof live, "%s.staging.999991.0", key);
    CHECK(sh("mkdir -p '%s' && head -c 4096 /dev/zero > '%s/weights.bin'", live, live) == 0);
    char lock[1300];
    snprintf(lock, sizeof lock, "%s.lock", key);
    pid_t h = fork();
    if (h == 0) { /* flock -o: the lock is flock's alone (not its child's), so killing flock releases it */
        setpgid(0, 0);
        execlp("flock", "flock", "-o", "-x", lock, "sleep", "30", (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 200; i++) { /* until it holds the lock */
        if (sh("flock -n -x '%s' true", lock) != 0) break;
        usleep(10000);
    }
    CHECK_RUN(0, "1 cache,", "$K cache ls --cache-dir '%s'", root); /* the live staging is not listed */
    CHECK_RUN(0, "removed 0 caches", "$K cache gc --max-size 1T --cache-dir '%s'", root);
    CHECK(kb_is_dir(live));
    /* the build is killed: its staging is now an interrupted build's */
    kill(-h, SIGKILL); /* flock and its sleep */
    kill(h, SIGKILL);
    waitpid(h, NULL, 0);
    CHECK_RUN(0, "interrupted", "$K cache ls --cache-dir '%s'", root);
    CHECK_RUN(0, "2 caches,", "$K cache ls --cache-dir '%s'", root);
    CHECK_RUN(0, "a build that died", "$K cache gc --max-size 1T --cache-dir '%s'", root);
    CHECK(!kb_is_dir(live));
    CHECK_RUN(0, "1 cache,", "$K cache ls --cache-dir '%s'", root); /* the complete one stays: it fits */
    /* rm --all removes a dead build's staging too */
    char dead[1400];
    snprintf(dead, sizeof dead, "%s.staging.999992.3", key);
    CHECK(sh("mkdir -p '%s'", dead) == 0);
    CHECK_RUN(0, "removed", "$K cache rm --all --cache-dir '%s'", root);
    CHECK(!kb_is_dir(dead) && !kb_is_dir(key));
    CHECK(kb_is_dir(grp));
}

/* 4. SIGINT while a run writes its images: none of them stays, and the
 * files of an earlier run are as they were */
TEST(images_all_or_none_at_sigint) {
    char pf[700], out[700], first[800], log[700];
    snprintf(pf, sizeof pf, "%s/two-batches.txt", g_dir);
    snprintf(out, sizeof out, "%s/sig/out.png", g_dir);
    snprintf(first, sizeof first, "%s/sig/out-0.png", g_dir);
    snprintf(log, sizeof log, "%s/sig.log", g_dir);
    /* the first batch is written (one step), the second samples for long */
    CHECK(sh("mkdir -p '%s/sig' && printf '%%s\\n' '{\"prompt\": \"a\", \"steps\": 1}' "
             "'{\"prompt\": \"b\", \"steps\": 10000, \"images_per_prompt\": 8}' > '%s' && echo earlier > '%s'", g_dir, pf, first) == 0);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "exec '%s' generate '%s' --prompts-file '%s' --output '%s' > '%s' 2>&1", kiln_bin(),
             g_pipe, pf, out, log);
    pid_t p = fork();
    if (p == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    int seen = 0;
    for (int i = 0; i < 3000 && !seen; i++) { /* until image 0 is written (under its temporary name) */
        usleep(10000);
        seen = sh("grep -q 'image 0 ->' '%s'", log) == 0;
    }
    CHECK_MSG(seen, "the run never wrote its first image");
    kill(p, SIGINT);
    int st = 0;
    waitpid(p, &st, 0);
    CHECK_MSG(WIFSIGNALED(st) && WTERMSIG(st) == SIGINT, "the run did not end by its SIGINT (status %d)", st);
    char *o = NULL;
    kiln_sh(&o, "ls -A '%s/sig'", g_dir);
    CHECK_MSG(!strcmp(o, "out-0.png\n"), "after SIGINT the folder holds: %s", o); /* only the earlier file */
    free(o);
    char *text = NULL;
    CHECK_OK(kb_read_file(first, &text, NULL));
    CHECK(text && !strcmp(text, "earlier\n"));
    free(text);
    /* a run that finishes replaces it, and says so once */
    CHECK(sh("printf 'a\\nb\\n' > '%s'", pf) == 0);
    CHECK_RUN(0, "replaced 1 existing file", "$K generate '%s' --prompts-file '%s' --steps 1 --output '%s'", g_pipe, pf, out);
    CHECK(entries(out) < 0 && sh("ls '%s/sig' | grep -c png | grep -qx 2", g_dir) == 0);
}

/* 5. kiln encode reads a prompts file as kiln generate does */
TEST(encode_reads_json_prompts) {
    char pf[700], a[700], b[700];
    snprintf(pf, sizeof pf, "%s/enc.jsonl", g_dir);
    snprintf(a, sizeof a, "%s/enc-a.safetensors", g_dir);
    snprintf(b, sizeof b, "%s/enc-b.safetensors", g_dir);
    CHECK(sh("printf '%%s\\n' '{\"prompt\": \"a cat\", \"negative_prompt\": \"blurry\", \"images_per_prompt\": 2, "
             "\"seed\": 3}' 'a dog' > '%s'", pf) == 0);
    CHECK_RUN(0, "generate's settings", "$K encode '%s' --prompts-file '%s' --dtype f32 --output '%s'", g_pipe, pf, a);
    CHECK_RUN(0, "3 rows", "$K encode '%s' --prompt 'a cat' --negative-prompt blurry --images-per-prompt 3 --dtype f32 "
              "--output '%s'", g_pipe, b);
    st_file *fa = NULL, *fb = NULL;
    CHECK_OK(st_open(a, &fa));
    CHECK_OK(st_open(b, &fb));
    if (fa && fb) {
        /* rows 0 and 1: "a cat" with its own negative prompt, as the single-prompt file's rows */
        static const char *const names[2] = {"prompt_embeds", "negative_prompt_embeds"};
        for (int k = 0; k < 2; k++) {
            size_t na = 0, nb = 0;
            float *x = golden_tensor(fa, names[k], &na), *y = golden_tensor(fb, names[k], &nb);
            CHECK_MSG(na / 3 == nb / 3 && !memcmp(x, y, sizeof(float) * (nb / 3) * 2), "%s: rows differ", names[k]);
            CHECK(st_find(fa, names[k])->shape[0] == 3);
            free(x);
            free(y);
        }
    }
    st_close(fa);
    st_close(fb);
    CHECK_RUN(1, "expected a file name ending in .safetensors", "$K encode '%s' --prompt x --output '%s/c.png'", g_pipe, g_dir);
}

/* 6. a component the index lists and the folder lacks, a missing weights
 * file, a missing tokenizer: refused before any component converts */
TEST(missing_parts_before_any_conversion) {
    char p[700], root[700];
    snprintf(p, sizeof p, "%s/broken", g_dir);
    snprintf(root, sizeof root, "%s/broken-cache", g_dir);
    CHECK(sh("cp -r '%s' '%s' && rm -rf '%s/vae'", g_pipe, p, p) == 0);
    CHECK_RUN(1, "model_index.json lists vae (AutoencoderKL), but there is no vae/ folder",
              "$K generate '%s' --prompt x --output '%s/b.png' --cache-dir '%s'", p, g_dir, root);
    CHECK(sh("rm -rf '%s' && cp -r '%s' '%s' && rm '%s/text_encoder_2/model.safetensors'", p, g_pipe, p, p) == 0);
    CHECK_RUN(1, "transformers' model.safetensors", "$K generate '%s' --prompt x --output '%s/b.png' --cache-dir '%s'", p,
              g_dir, root);
    CHECK(sh("rm -rf '%s' && cp -r '%s' '%s' && rm -rf '%s/tokenizer_3'", p, g_pipe, p, p) == 0);
    CHECK_RUN(1, "tokenizer_3", "$K cache build '%s' --cache-dir '%s'", p, root);
    CHECK_RUN(1, "tokenizer_3", "$K encode '%s' --prompt x --output '%s/b.safetensors' --cache-dir '%s'", p, g_dir, root);
    CHECK_MSG(entries(root) <= 0, "a refused pipeline left caches in %s", root);
    char png[800];
    snprintf(png, sizeof png, "%s/b.png", g_dir);
    CHECK(!kb_is_file(png));
}

/* 7. OpenMP's idle threads: kiln sets GOMP_SPINCOUNT=10000 unless the user chose */
TEST(openmp_spin_default) {
    CHECK_RUN(0, "GOMP_SPINCOUNT=10000", "KILN_LOG=debug $K --version");
    CHECK_RUN(0, "GOMP_SPINCOUNT=(unset), OMP_WAIT_POLICY=passive", "OMP_WAIT_POLICY=passive KILN_LOG=debug $K --version");
    CHECK_RUN(0, "GOMP_SPINCOUNT=5", "GOMP_SPINCOUNT=5 KILN_LOG=debug $K --version");
}

/* 9. a warning once a process, none under --quiet: the bf16 fallback on a
 * class without a bf16 GEMM (KILN_MAX_ISA=avx2 runs it on any machine) and
 * a cache root that cannot be written */
TEST(one_warning_a_process) {
    char *o = NULL;
    int rc = kiln_sh(&o, "KILN_MAX_ISA=avx2 KILN_LOG=warn $K generate '%s' --prompt x --steps 1 --output '%s/w.png'",
                     g_pipe, g_dir);
    CHECK_MSG(rc == 0 && count(o, "has no bf16 GEMM") == 1, "exit %d, %d warnings: %s", rc, count(o, "has no bf16 GEMM"), o);
    free(o);
    rc = kiln_sh(&o, "KILN_MAX_ISA=avx2 KILN_LOG=warn $K generate '%s' --prompt x --steps 1 --quiet --output '%s/w.png'",
                 g_pipe, g_dir);
    CHECK_MSG(rc == 0 && !*o, "exit %d; --quiet printed: %s", rc, o);
    free(o);
    char file[700];
    snprintf(file, sizeof file, "%s/root-is-a-file", g_dir);
    CHECK(sh("touch '%s'", file) == 0);
    rc = kiln_sh(&o, "KILN_LOG=warn $K generate '%s' --prompt x --steps 1 --cache-dir '%s' --output '%s/w.png'", g_pipe,
                 file, g_dir);
    CHECK_MSG(rc == 0 && count(o, "cannot be written") == 1, "exit %d: %s", rc, o);
    free(o);
}

/* the cache root: unset, the default ($XDG_CACHE_HOME/kiln) is made and
 * used; set empty, none; a missing root is made */
TEST(cache_root_rules) {
    char xdg[700];
    snprintf(xdg, sizeof xdg, "%s/xdg", g_dir);
    CHECK_RUN(0, "miss", "unset KILN_CACHE_DIR; XDG_CACHE_HOME='%s' $K cache build '%s/vae'", xdg, g_pipe);
    CHECK_RUN(0, "/xdg/kiln/", "unset KILN_CACHE_DIR; XDG_CACHE_HOME='%s' $K cache build '%s/vae'", xdg, g_pipe);
    CHECK_RUN(0, "hit", "unset KILN_CACHE_DIR; XDG_CACHE_HOME='%s' $K cache build '%s/vae'", xdg, g_pipe);
    CHECK_RUN(0, "1 cache,", "unset KILN_CACHE_DIR; XDG_CACHE_HOME='%s' $K cache ls", xdg);
    CHECK_RUN(0, "/home-like/.cache/kiln", "unset KILN_CACHE_DIR XDG_CACHE_HOME; HOME='%s/home-like' $K cache ls", g_dir);
    CHECK_RUN(1, "no cache root", "KILN_CACHE_DIR= $K cache ls");
    CHECK_RUN(0, "miss", "KILN_CACHE_DIR='%s/not/yet/there' $K cache build '%s/vae'", g_dir, g_pipe);
}

/* the small things */
TEST(small_things) {
    char png[700];
    snprintf(png, sizeof png, "%s/s.png", g_dir);
    CHECK_RUN(1, "/no/such/path does not exist", "$K generate /no/such/path --prompt x --output '%s'", png);
    CHECK_RUN(2, "give only one of --prompt and --prompts-file",
              "$K generate '%s' --prompt x --prompts-file y --output '%s'", g_pipe, png);
    CHECK_RUN(2, "option --prompt is given twice", "$K generate '%s' --prompt x --prompt y --output '%s'", g_pipe, png);
    CHECK_RUN(2, "--guidance -3: must be 0 or more", "$K generate '%s' --prompt x --guidance -3 --output '%s'", g_pipe, png);
    CHECK_RUN(2, "--memory lots: expected a positive number of bytes", "$K generate '%s' --prompt x --memory lots "
              "--output '%s'", g_pipe, png);
    CHECK_RUN(2, "did you mean 'generate'", "$K generat");
    CHECK_RUN(2, "did you mean 'cache'", "$K cahce ls");
    CHECK_RUN(1, "is not a safetensors file (it looks like a PNG image)", "$K info '%s/sig/out-0.png'", g_dir);
    char pf[700];
    snprintf(pf, sizeof pf, "%s/arr.txt", g_dir);
    CHECK(sh("printf '[\"a\", \"b\"]\\n' > '%s'", pf) == 0);
    CHECK_RUN(1, "line 1: a JSON array", "$K generate '%s' --prompts-file '%s' --output '%s'", g_pipe, pf, png);
    CHECK(!kb_is_file(png));
}

/* listings and progress that say what happened */
TEST(listings_and_progress) {
    char root[700];
    snprintf(root, sizeof root, "%s/lp-cache", g_dir);
    /* PIPELINE/vae is keyed as the pipeline keys its vae: generate PIPELINE then maps it */
    CHECK_RUN(0, "/vae/", "$K cache build '%s/vae' --cache-dir '%s'", g_pipe, root);
    CHECK_RUN(0, "vae             hit", "$K generate '%s' --prompt x --steps 1 --cache-dir '%s' --output '%s/lp.png'",
              g_pipe, root, g_dir);
    /* cache build names each component before it loads; its sizes are the ones ls counts */
    char *b = NULL, *l = NULL;
    kiln_sh(&b, "$K cache build '%s' --cache-dir '%s'", g_pipe, root);
    CHECK_MSG(strstr(b, "cache build: text_encoder_2 ..."), "%s", b);
    kiln_sh(&l, "$K cache ls --cache-dir '%s'", root);
    const char *t5 = strstr(b, "\ntext_encoder_3  "), *t5l = strstr(l, "/text_encoder_3/");
    if (t5 && t5l) {
        const char *sz = strchr(t5, '(');
        const char *line = t5l;
        while (line > l && line[-1] != '\n') line--;
        char want[32];
        snprintf(want, sizeof want, "%.*s", (int)strcspn(sz + 1, ","), sz + 1);
        CHECK_MSG(!strncmp(line, want, strlen(want)), "cache build says %s, cache ls: %.60s", want, line);
    }
    free(b);
    free(l);
    CHECK_RUN(0, "removed ", "$K cache gc --max-size 1K --cache-dir '%s'", root); /* names what it removes */
    /* compile PIPELINE: progress, then "already compiled" */
    CHECK_RUN(0, "packages published", "$K compile '%s' --cache-dir '%s'", g_pipe, root);
    CHECK_RUN(0, "compile: loading transformer", "$K compile '%s' --cache-dir '%s'", g_pipe, root);
    CHECK_RUN(0, "is already compiled", "$K compile '%s' --cache-dir '%s'", g_pipe, root);
    CHECK_RUN(0, "size        family", "$K package ls --cache-dir '%s'", root);
    CHECK_RUN(0, "packages, ", "$K package ls --cache-dir '%s'", root);
    /* the demo, run twice: the second says it mapped */
    CHECK_RUN(0, "components converted into the cache", "$K demo --dir '%s/demo'", g_dir);
    CHECK_RUN(0, "every component mapped from the cache", "$K demo --dir '%s/demo'", g_dir);
    /* the README's compile example, as written, on the demo's model */
    char *line = NULL;
    kiln_sh(&line, "grep -o 'kiln compile MODEL --dim[^#]*' '%s/../../README.md' | sed 's/kiln compile MODEL//'",
            test_data_dir());
    line[strcspn(line, "\n")] = 0;
    CHECK_MSG(strlen(line) > 5, "no compile example in the README");
    CHECK_RUN(0, "nodes", "$K compile '%s/demo/model' %s --cache-dir '%s'", g_dir, line, root);
    free(line);
}

int main(void) {
    test_tmpdir(g_dir, sizeof g_dir, "cli-user");
    snprintf(g_pipe, sizeof g_pipe, "%s", golden_path("sd3-pipeline-tiny", NULL));
    RUN(wrong_family_refused);
    RUN(make_model_keeps_a_model);
    RUN(staging_of_a_killed_build);
    RUN(images_all_or_none_at_sigint);
    RUN(encode_reads_json_prompts);
    RUN(missing_parts_before_any_conversion);
    RUN(openmp_spin_default);
    RUN(one_warning_a_process);
    RUN(cache_root_rules);
    RUN(small_things);
    RUN(listings_and_progress);
    test_rmrf(g_dir);
    return TEST_SUMMARY();
}
