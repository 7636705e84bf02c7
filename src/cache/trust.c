/* trust.c - who could have written a weight cache (docs/trust.md). A cache
 * is weights: one another user could have changed after this user's kiln
 * signed its manifest (a byte of weights.bin flipped, the signature left
 * alone) would be served as it is. So a cache is trusted only when nobody
 * but this user and root could have written it, ssh's StrictModes rule and
 * the packages' (src/compile/package.c): every folder from the cache root
 * down to the key folder and everything in the key folder is owned by this
 * user or root and writable by neither group nor others; a symbolic link
 * below the root counts by its own owner and its target's (the cache code
 * never reads a cache through a link: kcache_check_dir and the manifest
 * reader refuse one, and the load flow rebuilds it). The one exception is a folder with the sticky bit
 * (a shared 1777 root): others may add entries there but not rename or
 * remove this user's, so it stays usable, and what sits in it is checked
 * like the rest. A path check is sound here: once every folder on the path
 * is this user's or root's and closed to others, nobody else can swap
 * anything on it between the check and the open. */
#define _GNU_SOURCE
#include "cache/cache.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* why sb (at path, a `what`) could have been written by someone else; NULL when it could not */
static const char *writer_of(const struct stat *sb, int allow_sticky, char *why, size_t cap) {
    uid_t me = geteuid();
    if (sb->st_uid != me && sb->st_uid != 0) {
        snprintf(why, cap, "owned by uid %u, not by this user (%u) or root", (unsigned)sb->st_uid, (unsigned)me);
        return why;
    }
    if ((sb->st_mode & 022) && !(allow_sticky && S_ISDIR(sb->st_mode) && (sb->st_mode & S_ISVTX))) {
        snprintf(why, cap, "writable by %s (mode 0%03o%s)", sb->st_mode & 002 ? "others" : "its group",
                 (unsigned)(sb->st_mode & 07777), S_ISDIR(sb->st_mode) ? ", no sticky bit" : "");
        return why;
    }
    return NULL;
}

static kiln_status untrusted(const char *what, const char *path, const char *why) {
    return kb_fail(KILN_ERR_UNTRUSTED, "%s %s is %s: another user could have changed the cache, so it is not trusted",
                   what, path, why);
}

/* the key folder's contents (and its host_coords_* / shard_* folders'), depth-first */
static kiln_status check_tree(const char *dir, int depth) {
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? KILN_OK : kb_fail(KILN_ERR_IO, "cannot read %s: %s", dir, strerror(errno));
    kiln_status st = KILN_OK;
    struct dirent *e;
    char why[160];
    while (!st && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char *p = kb_path_join(dir, e->d_name);
        struct stat sb;
        if (!p) st = KILN_ERR_NOMEM;
        else if (lstat(p, &sb) != 0) st = errno == ENOENT ? KILN_OK : kb_fail(KILN_ERR_IO, "cannot look at %s: %s", p, strerror(errno));
        else if (writer_of(&sb, 0, why, sizeof why) && !(S_ISLNK(sb.st_mode) && (sb.st_uid == geteuid() || !sb.st_uid)))
            st = untrusted(S_ISLNK(sb.st_mode) ? "symbolic link" : S_ISDIR(sb.st_mode) ? "folder" : "file", p, why);
        else if (S_ISDIR(sb.st_mode) && depth < 3) st = check_tree(p, depth + 1);
        free(p);
    }
    closedir(d);
    return st;
}

kiln_status kcache_check_trust(const char *root, const char *dir) {
    if (!root || !dir) return kb_fail(KILN_ERR_INVALID_ARG, "kcache_check_trust: root and dir are required");
    size_t rl = strlen(root);
    while (rl > 1 && root[rl - 1] == '/') rl--;
    if (strncmp(dir, root, rl) || (dir[rl] && dir[rl] != '/'))
        return kb_fail(KILN_ERR_INVALID_ARG, "kcache_check_trust: %s is not under the cache root %s", dir, root);
    char why[160];
    struct stat sb;
    /* the root (a symbolic link to it is the user's choice): this user's or root's; a sticky 1777 root is fine */
    if (stat(root, &sb) != 0) return KILN_OK; /* nothing there yet: nothing to trust or distrust */
    if (writer_of(&sb, 1, why, sizeof why)) return untrusted("the cache root", root, why);
    /* every folder below it down to dir, then what dir holds */
    char *p = kb_strdup(dir);
    if (!p) return KILN_ERR_NOMEM;
    kiln_status st = KILN_OK;
    for (char *s = p + rl; !st && s && *s;) {
        char *next = strchr(s + 1, '/');
        if (next) *next = 0;
        if (lstat(p, &sb) != 0) {
            if (next) *next = '/';
            break; /* the rest is not there yet (a miss): what exists is checked */
        }
        if (S_ISLNK(sb.st_mode)) { /* the link's owner (its mode says nothing), then what it leads to */
            if (sb.st_uid != geteuid() && sb.st_uid != 0) st = untrusted("symbolic link", p, writer_of(&sb, 0, why, sizeof why));
            else if (stat(p, &sb) == 0 && writer_of(&sb, 1, why, sizeof why)) st = untrusted("folder", p, why);
        } else if (writer_of(&sb, 1, why, sizeof why)) {
            st = untrusted("folder", p, why);
        }
        if (next) *next = '/';
        s = next;
    }
    if (!st && lstat(dir, &sb) == 0 && S_ISDIR(sb.st_mode)) st = check_tree(dir, 0);
    free(p);
    return st;
}
