/* trust.c - the per-user secret that signs compiled packages and cache
 * manifests (base.h, docs/package.md). A package is code and a cache is
 * weights: a hash stored beside them only detects damage, while a keyed
 * signature made with a secret only this user (or a fleet sharing the key
 * file) can read tells a planted file from one kiln wrote. */
#define _GNU_SOURCE
#include "base.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static char *g_path;         /* the path the key below came from */
static uint8_t g_key[KB_KEY_MAX];
static size_t g_len;

char *kb_trust_key_path(void) {
    const char *env = getenv("KILN_PACKAGE_KEY_FILE");
    if (env && *env) return kb_strdup(env);
    const char *xdg = getenv("XDG_CONFIG_HOME");
    if (xdg && *xdg == '/') return kb_strfmt("%s/kiln/package.key", xdg);
    const char *home = getenv("HOME");
    if (home && *home) return kb_strfmt("%s/.config/kiln/package.key", home);
    kb_fail(KILN_ERR_INVALID_ARG, "no place for the package signing key: set KILN_PACKAGE_KEY_FILE, "
                                  "XDG_CONFIG_HOME or HOME");
    return NULL;
}

/* a new key file: 32 random bytes as hex, 0600, created exclusively (a
 * process racing us to it wins and we read its key) */
static kiln_status create_key(const char *path) {
    char *dir = kb_dirname(path);
    if (!dir) return KILN_ERR_NOMEM;
    kiln_status st = kb_mkdir_p(dir);
    if (!st) chmod(dir, 0700); /* best effort: the file's own mode is what is checked */
    free(dir);
    if (st) return kb_wrap(st, "cannot create the folder of the package signing key %s", path);
    uint8_t raw[32];
    size_t got = 0;
    while (got < sizeof raw) {
        ssize_t r = getrandom(raw + got, sizeof raw - got, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return kb_fail(KILN_ERR_IO, "cannot draw random bytes for the package signing key: %s", strerror(errno));
        got += (size_t)r;
    }
    char hex[66];
    kb_hex(raw, sizeof raw, hex);
    hex[64] = '\n';
    hex[65] = 0;
    /* written whole under a private name, then linked into place: a process
     * racing us never reads a half-written key, and the first link wins */
    char *tmp = kb_strfmt("%s.tmp.%ld", path, (long)getpid());
    if (!tmp) return KILN_ERR_NOMEM;
    unlink(tmp);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        st = kb_fail(KILN_ERR_IO, "cannot create the package signing key %s: %s", path, strerror(errno));
        free(tmp);
        return st;
    }
    ssize_t w = write(fd, hex, 65);
    int ok = w == 65 && fsync(fd) == 0;
    close(fd);
    int linked = ok ? link(tmp, path) : -1, lerr = errno;
    unlink(tmp);
    free(tmp);
    if (!ok) return kb_fail(KILN_ERR_IO, "cannot write the package signing key %s", path);
    if (linked != 0 && lerr == EEXIST) return KILN_OK; /* another process made it first: use theirs */
    if (linked != 0) return kb_fail(KILN_ERR_IO, "cannot create the package signing key %s: %s", path, strerror(lerr));
    kb_log(KILN_LOG_INFO, "created the package signing key %s", path);
    return KILN_OK;
}

static kiln_status read_key(const char *path, uint8_t *key, size_t *len) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0)
        return kb_fail(KILN_ERR_IO, "cannot open the package signing key %s: %s", path,
                       errno == ELOOP ? "it is a symbolic link" : strerror(errno));
    struct stat st;
    kiln_status s = KILN_OK;
    if (fstat(fd, &st) != 0) s = kb_fail(KILN_ERR_IO, "cannot stat the package signing key %s", path);
    else if (!S_ISREG(st.st_mode)) s = kb_fail(KILN_ERR_INVALID_ARG, "the package signing key %s is not a regular file", path);
    else if (st.st_uid != geteuid() && st.st_uid != 0)
        s = kb_fail(KILN_ERR_INVALID_ARG, "the package signing key %s is owned by uid %u, not by this user (%u) or root",
                    path, (unsigned)st.st_uid, (unsigned)geteuid());
    else if (st.st_mode & 077)
        s = kb_fail(KILN_ERR_INVALID_ARG, "the package signing key %s has mode %03o: group and others must have no "
                                          "access (chmod 600 %s)", path, (unsigned)(st.st_mode & 0777), path);
    else if (st.st_size < 32 || st.st_size > KB_KEY_MAX)
        s = kb_fail(KILN_ERR_INVALID_ARG, "the package signing key %s holds %lld bytes (32 to %d expected)", path,
                    (long long)st.st_size, KB_KEY_MAX);
    size_t n = 0;
    while (!s && n < (size_t)st.st_size) {
        ssize_t r = read(fd, key + n, (size_t)st.st_size - n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            s = kb_fail(KILN_ERR_IO, "cannot read the package signing key %s", path);
            break;
        }
        n += (size_t)r;
    }
    close(fd);
    if (s) return s;
    while (n && (key[n - 1] == '\n' || key[n - 1] == '\r' || key[n - 1] == ' ' || key[n - 1] == '\t')) n--;
    if (n < 32) return kb_fail(KILN_ERR_INVALID_ARG, "the package signing key %s holds fewer than 32 bytes", path);
    *len = n;
    return KILN_OK;
}

kiln_status kb_trust_key(uint8_t key[KB_KEY_MAX], size_t *len) {
    char *path = kb_trust_key_path();
    if (!path) return KILN_ERR_INVALID_ARG;
    pthread_mutex_lock(&g_lock);
    kiln_status st = KILN_OK;
    if (!g_path || strcmp(g_path, path)) {
        int given = getenv("KILN_PACKAGE_KEY_FILE") && *getenv("KILN_PACKAGE_KEY_FILE");
        struct stat sb;
        if (lstat(path, &sb) != 0) {
            if (given)
                st = kb_fail(KILN_ERR_IO, "KILN_PACKAGE_KEY_FILE %s: %s", path, strerror(errno));
            else
                st = create_key(path);
        }
        uint8_t k[KB_KEY_MAX];
        size_t n = 0;
        if (!st) st = read_key(path, k, &n);
        if (!st) {
            free(g_path);
            g_path = path;
            path = NULL;
            memcpy(g_key, k, n);
            g_len = n;
        }
    }
    if (!st) {
        memcpy(key, g_key, g_len);
        *len = g_len;
    }
    pthread_mutex_unlock(&g_lock);
    free(path);
    return st;
}

kiln_status kb_sign(const void *data, size_t n, char hex[65]) {
    uint8_t key[KB_KEY_MAX], mac[32];
    size_t klen;
    kiln_status st = kb_trust_key(key, &klen);
    if (st) return st;
    kb_hmac_sha256(key, klen, data, n, mac);
    kb_hex(mac, 32, hex);
    return KILN_OK;
}

kiln_status kb_verify_sig(const void *data, size_t n, const char *sig) {
    if (!sig || strlen(sig) != 64) return kb_fail(KILN_ERR_CORRUPT, "no signature");
    char want[65];
    kiln_status st = kb_sign(data, n, want);
    if (st) return st;
    if (!kb_const_eq(want, sig, 64))
        return kb_fail(KILN_ERR_CORRUPT, "the signature does not match this user's key (made elsewhere, or tampered)");
    return KILN_OK;
}
