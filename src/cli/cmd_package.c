/* cmd_package.c - kiln package ls | verify | rm: the compiled packages
 * under the package folder (root/<family>/<dims>-<hash>). */
#include "base/base.h"
#include "cli.h"
#include "cache/cache.h"
#include "compile/compile.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char k_usage[] = "kiln package ls | verify [PACKAGE...] | rm PACKAGE... | rm --all  [--package-dir DIR]";

static int help(void) {
    printf("usage: %s\n\n"
           "  ls                 every package: family, dimensions, mode\n"
           "  verify [PACKAGE]   check each package as loading it would: folders owned by this user\n"
           "                     or root and not writable by group or others, no symbolic links,\n"
           "                     the manifest's signature (this user's key), the shared object's\n"
           "                     SHA-256, the CPU features (default: all); exit 1 if any fails\n"
           "  rm PACKAGE... | --all   remove packages (as printed by ls, or a folder path)\n\n"
           "The folder is --package-dir DIR, else KILN_PACKAGE_DIR, else <cache root>/packages\n"
           "(--cache-dir or KILN_CACHE_DIR). Weight caches under it are never listed, verified or\n"
           "removed. Format and trust model: docs/package.md.\n",
           k_usage);
    return 0;
}

/* A weight-cache folder (its manifest starts "kiln-cache") is not a package,
 * whatever folder nests in which: `kiln package` never touches one. */
static int is_cache(const char *path) {
    char *man = kb_path_join(path, "manifest.json"), head[10];
    int fd = man ? open(man, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC) : -1;
    ssize_t n = fd >= 0 ? read(fd, head, sizeof head) : -1;
    if (fd >= 0) close(fd);
    free(man);
    return n == (ssize_t)sizeof head && !memcmp(head, "kiln-cache", sizeof head);
}

/* every package folder under root, as "family/name" (malloc'd list) */
/* the packages under root, as family/name; with staging, instead the
 * staging folders of compiles that died (family/.staging-PID-N) */
static char **list_of(const char *root, int *n, int staging) {
    *n = 0;
    char **out = NULL;
    DIR *d = opendir(root);
    if (!d) return NULL;
    struct dirent *f;
    while ((f = readdir(d))) {
        if (f->d_name[0] == '.') continue;
        char *fam = kb_path_join(root, f->d_name);
        DIR *e = fam ? opendir(fam) : NULL;
        struct dirent *p;
        while (e && (p = readdir(e))) {
            if (staging ? !kx_staging_dead(p->d_name) : p->d_name[0] == '.' || strstr(p->d_name, ".trash.")) continue;
            char *path = kb_path_join(fam, p->d_name);
            int cache = !path || is_cache(path);
            free(path);
            if (cache) continue;
            char **v = realloc(out, sizeof *v * (size_t)(*n + 1));
            if (!v) break;
            out = v;
            out[(*n)++] = kb_strfmt("%s/%s", f->d_name, p->d_name);
        }
        if (e) closedir(e);
        free(fam);
    }
    closedir(d);
    return out;
}

static char **list(const char *root, int *n) { return list_of(root, n, 0); }

/* family folders left empty (by rm, or by a compile that died) go too */
static void remove_empty_families(const char *root) {
    DIR *d = opendir(root);
    struct dirent *f;
    while (d && (f = readdir(d))) {
        if (f->d_name[0] == '.') continue;
        char *fam = kb_path_join(root, f->d_name);
        if (fam && kb_is_dir(fam) && rmdir(fam) == 0) kb_log(KILN_LOG_INFO, "removed the empty folder %s", fam);
        free(fam);
    }
    if (d) closedir(d);
}

int cli_count_packages(const char *root) {
    int n = 0;
    char **pk = root ? list(root, &n) : NULL;
    for (int i = 0; i < n; i++) free(pk[i]);
    free(pk);
    return n;
}

static char *resolve(const char *root, const char *arg) {
    if (kb_is_dir(arg)) return kb_strdup(arg);
    return kb_path_join(root, arg);
}

/* a package folder's family and model config hash, from its name
 * "<family>-<12 hex>-<dtype>-..." ("?" when it is not named so) */
static void name_parts(const char *name, char *family, size_t cap, char config[16]) {
    snprintf(family, cap, "?");
    snprintf(config, 16, "?");
    for (const char *p = strchr(name, '-'); p; p = strchr(p + 1, '-')) {
        int hex = 1;
        for (int k = 1; k <= 12 && hex; k++) hex = p[k] && strchr("0123456789abcdef", p[k]) != NULL;
        if (hex && p[13] == '-') {
            snprintf(family, cap, "%.*s", (int)(p - name), name);
            snprintf(config, 16, "%.12s", p + 1);
            return;
        }
    }
}

int cmd_package(int argc, char **argv) {
    const char *dir = NULL, *sub = NULL, *cache = NULL;
    int all = 0, first = 0;
    for (int i = 1; i < argc; i++) {
        int r;
        if (cli_flag(argv, i, "--help") || cli_flag(argv, i, "-h")) return help();
        if ((r = cli_opt("package", argc, argv, &i, "--package-dir", &dir)) ||
            (r = cli_opt("package", argc, argv, &i, "--cache-dir", &cache))) {
            if (r < 0) return 2;
            continue;
        }
        if (cli_flag(argv, i, "--all")) {
            all = 1;
            continue;
        }
        if (argv[i][0] == '-') return cli_usage_error("package", k_usage, "unknown option %s", argv[i]);
        if (!sub) {
            sub = argv[i];
            first = i + 1;
        }
    }
    if (!sub) return cli_usage_error("package", k_usage, "a subcommand is required (ls, verify, rm)");
    char *root = kcache_package_root(dir, cache);
    if (!root) return cli_error("package", "no package folder: pass --package-dir DIR or set KILN_PACKAGE_DIR or KILN_CACHE_DIR");
    /* the names after the subcommand */
    const char *names[256];
    int nn = 0;
    for (int i = first; i < argc && nn < 256; i++) {
        if (argv[i][0] == '-') {
            if (!strcmp(argv[i], "--package-dir") || !strcmp(argv[i], "--cache-dir")) i++;
            continue;
        }
        names[nn++] = argv[i];
    }
    int n = 0, rc = 0;
    char **pk = list(root, &n);
    if (!strcmp(sub, "ls")) {
        if (!n) printf("no packages under %s\n", root);
        else printf("%-10s  %-12s  %-12s  %-44s  %s\n", "size", "family", "config", "shapes, dtype, kind", "package");
        int64_t total = 0;
        for (int i = 0; i < n; i++) {
            char *path = kb_path_join(root, pk[i]);
            kx_package *p = NULL;
            char size[32], family[64], config[16];
            int64_t bytes = path ? kcache_dir_bytes(path) : 0;
            total += bytes;
            name_parts(pk[i], family, sizeof family, config);
            kb_human_bytes((double)bytes, size, sizeof size);
            if (path && !kx_package_open(path, &p))
                printf("%-10s  %-12s  %-12s  %-44s  %s\n", size, family, config, kx_package_summary(p), pk[i]);
            else
                printf("%-10s  %-12s  %-12s  %-44s  %s\n", size, family, config, "(unreadable: see kiln package verify)",
                       pk[i]);
            kb_clear_error();
            kx_package_close(p);
            free(path);
        }
        int ns = 0;
        char **st = list_of(root, &ns, 1);
        for (int i = 0; i < ns; i++) {
            char *path = kb_path_join(root, st[i]), size[32];
            int64_t bytes = path ? kcache_dir_bytes(path) : 0;
            total += bytes;
            printf("%-10s  %-12s  %-12s  %-44s  %s\n", kb_human_bytes((double)bytes, size, sizeof size), "-", "-",
                   "interrupted: a compile that died (rm --all removes it)", st[i]);
            free(path);
            free(st[i]);
        }
        free(st);
        char ts[32];
        if (n || ns)
            printf("%d package%s%s, %s in %s\n", n, n == 1 ? "" : "s", ns ? " and interrupted compiles" : "",
                   kb_human_bytes((double)total, ts, sizeof ts), root);
    } else if (!strcmp(sub, "verify")) {
        int checked = 0;
        for (int i = 0; i < (nn ? nn : n); i++) {
            char *path = nn ? resolve(root, names[i]) : kb_path_join(root, pk[i]);
            kiln_status s = !path ? KILN_ERR_NOMEM
                            : is_cache(path) ? kb_fail(KILN_ERR_INVALID_ARG, "a weight cache, not a package (see kiln cache verify)")
                                             : kx_package_verify(path, kk_backend_get("cpu", KILN_F32));
            printf("%s %s%s%s\n", s ? "FAIL" : "ok  ", nn ? names[i] : pk[i], s ? ": " : "", s ? kiln_last_error() : "");
            rc |= s != KILN_OK;
            checked++;
            free(path);
        }
        if (!checked) printf("no packages under %s\n", root);
    } else if (!strcmp(sub, "rm")) {
        if (!nn && !all) {
            rc = cli_usage_error("package", k_usage, "rm needs PACKAGE names or --all");
        } else {
            for (int i = 0; i < (all ? n : nn); i++) {
                char *path = all ? kb_path_join(root, pk[i]) : resolve(root, names[i]);
                char *man = path ? kb_path_join(path, "manifest.json") : NULL;
                if (path && is_cache(path)) {
                    cli_error("package", "%s is a weight cache, not a package; left alone (see kiln cache)", all ? pk[i] : names[i]);
                    rc = 1;
                } else if (!man || !kb_is_file(man)) {
                    cli_error("package", "%s is not a package (no manifest.json)", all ? pk[i] : names[i]);
                    rc = 1;
                } else if (kb_remove_dir(path)) {
                    rc = cli_error("package", "%s", kiln_last_error());
                } else {
                    printf("removed %s\n", all ? pk[i] : names[i]);
                }
                free(man);
                free(path);
            }
            if (all) { /* what compiles that died left, then the family folders left empty */
                int ns = 0;
                char **st = list_of(root, &ns, 1);
                for (int i = 0; i < ns; i++) {
                    char *path = kb_path_join(root, st[i]);
                    if (path && !kb_remove_tree(path)) printf("removed %s (an interrupted compile)\n", st[i]);
                    free(path);
                    free(st[i]);
                }
                free(st);
                remove_empty_families(root);
            }
        }
    } else {
        rc = cli_usage_error("package", k_usage, "unknown subcommand '%s'", sub);
    }
    for (int i = 0; i < n; i++) free(pk[i]);
    free(pk);
    free(root);
    return rc;
}
