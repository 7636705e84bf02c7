/* cmd_cache.c - kiln cache build | ls | verify | rm | gc */
#include "base/base.h"
#include "cache/cache.h"
#include "cli.h"
#include "pipeline/component.h"

#include <ctype.h>
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char k_usage[] =
    "kiln cache build MODEL [key options] | ls | verify [KEY...] | rm KEY... | rm --all | gc --max-size SIZE\n"
    "           [--cache-dir DIR]";

static int help(void) {
    printf("usage: %s\n\n"
           "  build MODEL       convert MODEL into the cache under its key (a hit does nothing); a\n"
           "                    pipeline folder or all-in-one file (--tokenizers DIR for its configs):\n"
           "                    every component, each under its component key\n"
           "  ls                every cache under the root: size, last use, key, source\n"
           "  verify [KEY...]   check every tensor's xxh3 (default: all caches); a corrupt one is removed\n"
           "                    (the next load rebuilds it); exit 1 if any is corrupt or partial\n"
           "  rm KEY... | --all remove caches (KEY as printed by ls, or a folder path)\n"
           "  gc --max-size SIZE  remove what builds that died left (state interrupted), then least\n"
           "                    recently used caches until the total fits (e.g. 20G, 500M); names each\n\n"
           "These act on weight caches only (manifests saying kiln-cache): compiled packages under the same\n"
           "root (<root>/packages) are never listed, verified or removed; see kiln package.\n"
           "The root is --cache-dir DIR, else KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln or ~/.cache/kiln.\n"
           "Layout and load flow: docs/cache.md.\n\n%s",
           k_usage, cli_common_help);
    return 0;
}

static const char *root_of(const cli_common *c) {
    return kcache_root(c->cache_dir);
}

/* "20G", "500M", "1.5GiB", "123" (bytes) */
static int parse_size(const char *s, int64_t *out) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || v < 0) return -1;
    double mul = 1;
    switch (toupper((unsigned char)*end)) {
    case 0: break;
    case 'K': mul = 1024.0; break;
    case 'M': mul = 1024.0 * 1024; break;
    case 'G': mul = 1024.0 * 1024 * 1024; break;
    case 'T': mul = 1024.0 * 1024 * 1024 * 1024; break;
    default: return -1;
    }
    if (*end) {
        end++;
        if (!strcmp(end, "iB") || !strcmp(end, "B") || !strcmp(end, "ib") || !strcmp(end, "b")) end += strlen(end);
        if (*end) return -1;
    }
    *out = (int64_t)(v * mul);
    return 0;
}

/* every component of a pipeline folder or an all-in-one file, each under
 * its own component key of the pipeline's name (what kiln generate PIPELINE
 * maps) */
static int build_pipeline(const char *dir, cli_common *com) {
    static const char *const comps[] = {"transformer", "text_encoder", "text_encoder_2", "text_encoder_3", "vae"};
    char name[128];
    kiln_load_opts base = cli_load_opts(dir, com, name, sizeof name);
    kp_source src;
    kiln_status s = kp_source_init(dir, com->tokenizers, &src);
    if (!s) s = kp_check_tokenizers(&src);
    if (!s) s = kp_check_folder(&src, kp_sd3_parts); /* every file there before the first conversion */
    if (s) return cli_fail("cache build", s);
    int rc = 0;
    for (size_t k = 0; k < sizeof comps / sizeof comps[0] && !rc; k++) {
        if (!kp_has_component(&src, comps[k])) continue;
        double t0 = kb_now();
        kiln_model *m = NULL;
        if (!com->quiet) fprintf(stderr, "cache build: %s ...\n", comps[k]); /* a miss converts: minutes on a real model */
        s = kp_open_part(&src, comps[k], &base, &m);
        if (s) {
            rc = cli_fail("cache build", kb_wrap(s, "%s", comps[k]));
        } else {
            char size[32];
            printf("%-15s %s: %s (%s, %.1f ms)\n", comps[k], kiln_model_origin(m), kiln_model_cache_path(m),
                   kb_human_bytes((double)kcache_dir_bytes(kiln_model_cache_path(m)), size, sizeof size),
                   (kb_now() - t0) * 1e3);
        }
        kiln_model_free(m);
    }
    return rc;
}

static int do_build(const char *model, cli_common *com) {
    if (!root_of(com))
        return cli_error("cache build", "no cache root (KILN_CACHE_DIR is set empty, or there is no HOME): pass "
                         "--cache-dir DIR or set KILN_CACHE_DIR");
    if (cli_is_pipeline(model, com)) return build_pipeline(model, com); /* a folder or an all-in-one file */
    double t0 = kb_now();
    kiln_model *m;
    if (!com->quiet) fprintf(stderr, "cache build: %s ...\n", model);
    kiln_status s = cli_load_model(model, com, &m);
    if (s) return cli_fail("cache build", s);
    char size[32];
    printf("%s: %s (%s, %.1f ms)\n", kiln_model_origin(m), kiln_model_cache_path(m),
           kb_human_bytes((double)kcache_dir_bytes(kiln_model_cache_path(m)), size, sizeof size), (kb_now() - t0) * 1e3);
    kiln_model_free(m);
    return 0;
}

static void gc_removed(void *user, const kcache_item *it) {
    (void)user;
    char size[32];
    printf("removed %s (%s%s)\n", it->rel, kb_human_bytes((double)it->bytes, size, sizeof size),
           it->interrupted ? ", a build that died" : it->complete ? "" : ", partial");
}

static int do_ls(const char *root) {
    kcache_item *v;
    size_t n;
    kiln_status s = kcache_list(root, &v, &n);
    if (s) return cli_fail("cache ls", s);
    int64_t total = 0;
    printf("%-10s  %-19s  %-11s  %s\n", "size", "last used", "state", "key (model/component/config)  <- source");
    for (size_t i = 0; i < n; i++) {
        char size[32], when[32];
        time_t t = (time_t)v[i].last_used;
        struct tm tm;
        localtime_r(&t, &tm);
        strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
        printf("%-10s  %-19s  %-11s  %s  <- %s\n", kb_human_bytes((double)v[i].bytes, size, sizeof size), when,
               v[i].interrupted ? "interrupted" : v[i].complete ? "complete" : "partial", v[i].rel,
               *v[i].source ? v[i].source : v[i].interrupted ? "(a build that died: kiln cache gc removes it)" : "(unknown)");
        total += v[i].bytes;
    }
    char size[32];
    printf("%zu cache%s, %s in %s\n", n, n == 1 ? "" : "s", kb_human_bytes((double)total, size, sizeof size), root);
    free(v);
    return 0;
}

/* folders holding a manifest under a key folder: itself or its host_coords_*
 * and shard_* folders (rel: the key's model/component/name); 0 ok, 1 a
 * partial build (never loaded), 2 corrupt */
static int verify_dir(const char *dir, const char *label, const char *rel) {
    kcache_entry *e;
    char *man = kb_path_join(dir, KCACHE_MANIFEST);
    int bad = 0, found = 0;
    if (man && kb_is_file(man)) {
        found = 1;
        kiln_status s = kcache_open(dir, 1, &e);
        if (!s && (s = kcache_check_place(e, rel, label + strlen(rel)))) kcache_close(e);
        if (s) {
            printf("CORRUPT  %s: %s\n", label, kiln_last_error());
            bad = 2;
        } else {
            printf("ok       %s (%zu tensors)\n", label, e->n);
            kcache_close(e);
        }
    }
    free(man);
    if (!found) {
        /* host_coords_* and shard_* sub-folders of a key on a mesh */
        DIR *d = opendir(dir);
        struct dirent *de;
        while (d && (de = readdir(d))) {
            if ((strncmp(de->d_name, "host_coords_", 12) && strncmp(de->d_name, "shard_", 6)) ||
                strchr(de->d_name, '.'))
                continue;
            char *sub = kb_path_join(dir, de->d_name), *lab = kb_strfmt("%s/%s", label, de->d_name);
            if (sub && lab) {
                found = 1;
                int b = verify_dir(sub, lab, rel);
                if (b > bad) bad = b;
            }
            free(sub);
            free(lab);
        }
        if (d) closedir(d);
        if (!found) {
            printf("PARTIAL  %s: no manifest (an interrupted build; never loaded)\n", label);
            bad = 1;
        }
    }
    return bad;
}

static int do_verify(const char *root, int nkeys, char **keys) {
    kcache_item *v;
    size_t n;
    kiln_status s = kcache_list(root, &v, &n);
    if (s) return cli_fail("cache verify", s);
    int bad = 0, matched = 0;
    for (size_t i = 0; i < n; i++) {
        int want = nkeys == 0;
        for (int k = 0; k < nkeys && !want; k++) want = !strcmp(keys[k], v[i].rel) || !strcmp(keys[k], v[i].dir);
        if (!want) continue;
        matched++;
        int b = verify_dir(v[i].dir, v[i].rel, v[i].rel);
        /* a cache found corrupt is never served again: removed, so the next load rebuilds it */
        if (b == 2) {
            if (kcache_remove(v[i].dir)) printf("         %s: could not be removed: %s\n", v[i].rel, kiln_last_error());
            else printf("         %s: removed (the next load rebuilds it from its source)\n", v[i].rel);
        }
        bad |= b != 0;
    }
    free(v);
    if (nkeys && matched < nkeys) return cli_error("cache verify", "no cache named %s under %s", keys[0], root);
    if (!matched) printf("no caches under %s\n", root);
    return bad ? 1 : 0;
}

static int do_rm(const char *root, int all, int nkeys, char **keys) {
    kcache_item *v;
    size_t n;
    kiln_status s = kcache_list(root, &v, &n);
    if (s) return cli_fail("cache rm", s);
    int rc = 0;
    for (int k = 0; k < nkeys; k++) {
        int found = 0;
        for (size_t i = 0; i < n; i++) found |= !strcmp(keys[k], v[i].rel) || !strcmp(keys[k], v[i].dir);
        if (!found) rc = cli_error("cache rm", "no cache named %s under %s (see kiln cache ls)", keys[k], root);
    }
    for (size_t i = 0; i < n && !rc; i++) {
        int want = all;
        for (int k = 0; k < nkeys && !want; k++) want = !strcmp(keys[k], v[i].rel) || !strcmp(keys[k], v[i].dir);
        if (!want) continue;
        if ((s = kcache_remove(v[i].dir))) rc = cli_fail("cache rm", s);
        else printf("removed %s\n", v[i].rel);
    }
    free(v);
    return rc;
}

int cmd_cache(int argc, char **argv) {
    if (argc < 2) return cli_usage_error("cache", k_usage, "a subcommand is required");
    const char *sub = argv[1];
    if (!strcmp(sub, "--help") || !strcmp(sub, "-h")) return help();
    cli_common com = cli_common_defaults();
    const char *maxs = NULL;
    int all = 0, nargs = 0;
    char **args = calloc((size_t)argc, sizeof *args);
    if (!args) return cli_error("cache", "out of memory");
    int rc = 0;
    for (int i = 2; i < argc && !rc; i++) {
        int r;
        if (cli_flag(argv, i, "--help") || cli_flag(argv, i, "-h")) {
            free(args);
            return help();
        }
        if (cli_flag(argv, i, "--all")) {
            all = 1;
            continue;
        }
        if ((r = cli_common_opt("cache", argc, argv, &i, &com)) ||
            (r = cli_opt("cache", argc, argv, &i, "--max-size", &maxs))) {
            if (r < 0) rc = 2;
            continue;
        }
        if (argv[i][0] == '-') rc = cli_usage_error("cache", k_usage, "unknown option %s", argv[i]);
        else args[nargs++] = argv[i];
    }
    const char *root = root_of(&com);
    if (!rc && strcmp(sub, "build") && !root)
        rc = cli_error("cache", "no cache root (KILN_CACHE_DIR is set empty, or there is no HOME): pass --cache-dir "
                       "DIR or set KILN_CACHE_DIR");
    if (rc) {
    } else if (!strcmp(sub, "build")) {
        rc = nargs == 1 ? do_build(args[0], &com) : cli_usage_error("cache", k_usage, "build takes one MODEL");
    } else if (!strcmp(sub, "ls")) {
        rc = nargs ? cli_usage_error("cache", k_usage, "ls takes no arguments") : do_ls(root);
    } else if (!strcmp(sub, "verify")) {
        rc = do_verify(root, nargs, args);
    } else if (!strcmp(sub, "rm")) {
        if (!all && !nargs) rc = cli_usage_error("cache", k_usage, "rm needs KEY... or --all");
        else rc = do_rm(root, all, nargs, args);
    } else if (!strcmp(sub, "gc")) {
        int64_t max;
        if (!maxs) {
            rc = cli_usage_error("cache", k_usage, "gc needs --max-size SIZE (e.g. 20G, 500M, 4096)");
        } else if (parse_size(maxs, &max)) {
            rc = cli_usage_error("cache", k_usage,
                                 "--max-size %s: expected a size in bytes with an optional K, M, G or T suffix "
                                 "(e.g. 20G, 500M, 4096)", maxs);
        } else {
            int removed;
            int64_t freed;
            kiln_status s = kcache_gc(root, max, &removed, &freed, gc_removed, NULL);
            char fb[32];
            if (s) rc = cli_fail("cache gc", s);
            else printf("removed %d cache%s, freed %s\n", removed, removed == 1 ? "" : "s",
                        kb_human_bytes((double)freed, fb, sizeof fb));
        }
    } else {
        rc = cli_usage_error("cache", k_usage, "unknown subcommand %s", sub);
    }
    free(args);
    cli_common_finish(&com);
    return rc;
}
