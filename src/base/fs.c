/* fs.c - small file-system helpers: whole-file read, atomic write, mmap. */
#define _GNU_SOURCE
#include "base.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int kb_is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int kb_is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

char *kb_path_join(const char *a, const char *b) {
    size_t la = strlen(a);
    if (la && a[la - 1] == '/') return kb_strfmt("%s%s", a, b);
    return kb_strfmt("%s/%s", a, b);
}

char *kb_dirname(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return kb_strdup(".");
    if (slash == path) return kb_strdup("/");
    return kb_strfmt("%.*s", (int)(slash - path), path);
}

kiln_status kb_read_file(const char *path, char **out, size_t *len) {
    *out = NULL;
    /* regular files only: a FIFO would block forever, /dev/zero never end */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return kb_fail(KILN_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return kb_fail(KILN_ERR_IO, "%s is not a regular file", path);
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return kb_fail(KILN_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    }
    size_t cap = 4096, n = 0;
    char *buf = kb_malloc(cap);
    if (!buf) {
        fclose(f);
        return KILN_ERR_NOMEM;
    }
    for (;;) {
        if (n + 1 >= cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                fclose(f);
                return kb_fail(KILN_ERR_NOMEM, "out of memory reading %s", path);
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) break;
    }
    int err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        return kb_fail(KILN_ERR_IO, "error reading %s", path);
    }
    buf[n] = 0;
    *out = buf;
    if (len) *len = n;
    return KILN_OK;
}

static kiln_status fsync_dir_of(const char *path) {
    char *dir = kb_dirname(path);
    if (!dir) return KILN_ERR_NOMEM;
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    free(dir);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
    return KILN_OK;
}

kiln_status kb_write_file_atomic(const char *path, const void *data, size_t len) {
    char *tmp = kb_strfmt("%s.tmp.%ld", path, (long)getpid());
    if (!tmp) return KILN_ERR_NOMEM;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        kiln_status s = kb_fail(KILN_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
        free(tmp);
        return s;
    }
    const uint8_t *p = data;
    size_t left = len;
    while (left) {
        ssize_t w = write(fd, p, left);
        if (w < 0) {
            if (errno == EINTR) continue;
            kiln_status s = kb_fail(KILN_ERR_IO, "cannot write %s: %s", tmp, strerror(errno));
            close(fd);
            unlink(tmp);
            free(tmp);
            return s;
        }
        p += w;
        left -= (size_t)w;
    }
    if (fsync(fd) != 0 || close(fd) != 0) {
        kiln_status s = kb_fail(KILN_ERR_IO, "cannot flush %s: %s", tmp, strerror(errno));
        unlink(tmp);
        free(tmp);
        return s;
    }
    if (rename(tmp, path) != 0) {
        kiln_status s = kb_fail(KILN_ERR_IO, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
        unlink(tmp);
        free(tmp);
        return s;
    }
    free(tmp);
    return fsync_dir_of(path);
}

kiln_status kb_mkdir_p(const char *path) {
    char *p = kb_strdup(path);
    if (!p) return KILN_ERR_NOMEM;
    for (char *s = p + 1; *s; s++) {
        if (*s != '/') continue;
        *s = 0;
        if (mkdir(p, 0755) != 0 && errno != EEXIST) {
            kiln_status st = kb_fail(KILN_ERR_IO, "cannot create folder %s: %s", p, strerror(errno));
            free(p);
            return st;
        }
        *s = '/';
    }
    kiln_status st = KILN_OK;
    if (mkdir(p, 0755) != 0 && errno != EEXIST)
        st = kb_fail(KILN_ERR_IO, "cannot create folder %s: %s", p, strerror(errno));
    else if (!kb_is_dir(p))
        st = kb_fail(KILN_ERR_IO, "%s exists and is not a folder", p);
    free(p);
    return st;
}

/* the status of a failure that says nothing about the file (out of memory,
 * address space or file handles: it may pass), else KILN_ERR_IO */
static kiln_status io_status(int err) {
    return err == ENOMEM || err == EAGAIN || err == EMFILE || err == ENFILE ? KILN_ERR_NOMEM : KILN_ERR_IO;
}

kiln_status kb_map_file(const char *path, kb_map *m) {
    m->data = NULL;
    m->size = 0;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC); /* O_NONBLOCK: a FIFO fails below, never blocks */
    if (fd < 0) return kb_fail(io_status(errno), "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return kb_fail(KILN_ERR_IO, "%s is not a regular file", path);
    }
    if (st.st_size == 0) { /* mmap of 0 bytes fails; an empty map is valid */
        close(fd);
        return KILN_OK;
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return kb_fail(io_status(errno), "cannot map %s: %s", path, strerror(errno));
    /* huge pages for the weights where the kernel maps files so (2 MiB
     * page-cache folios; Linux 6.x on ext4, xfs, tmpfs): advice only */
    if (kb_huge_pages()) madvise(p, (size_t)st.st_size, MADV_HUGEPAGE);
    m->data = p;
    m->size = (size_t)st.st_size;
    return KILN_OK;
}

void kb_drop_pages(const void *p, size_t n) {
    if (!p || !n) return;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)p & ~(page - 1),
              b = ((uintptr_t)p + n + page - 1) & ~(page - 1);
    (void)madvise((void *)a, b - a, MADV_DONTNEED); /* advice: a failure costs only memory */
}

void kb_unmap(kb_map *m) {
    if (m->data) munmap((void *)m->data, m->size);
    m->data = NULL;
    m->size = 0;
}

const char *kb_human_bytes(double b, char *buf, size_t cap) {
    static const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (b >= 1024 && i < 4) {
        b /= 1024;
        i++;
    }
    if (i == 0) snprintf(buf, cap, "%.0f B", b);
    else snprintf(buf, cap, "%.1f %s", b, u[i]);
    return buf;
}

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    /* another remover may have taken it first */
    return remove(p) && errno != ENOENT ? -1 : 0;
}

kiln_status kb_remove_tree(const char *dir) {
    if (nftw(dir, rm_cb, 16, FTW_DEPTH | FTW_PHYS) != 0 && errno != ENOENT)
        return kb_fail(KILN_ERR_IO, "cannot remove %s: %s", dir, strerror(errno));
    return KILN_OK;
}

kiln_status kb_remove_dir(const char *dir) {
    static int counter;
    char *aside = kb_strfmt("%s.trash.%ld.%d", dir, (long)getpid(), __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED));
    if (!aside) return KILN_ERR_NOMEM;
    kiln_status s = KILN_OK;
    if (rename(dir, aside) != 0) {
        if (errno != ENOENT) s = kb_fail(KILN_ERR_IO, "cannot remove %s: %s", dir, strerror(errno));
    } else {
        s = kb_remove_tree(aside);
    }
    free(aside);
    return s;
}

long kb_json_values(const char *p, size_t n) {
    long items = 1;
    int in = 0;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (in) {
            if (c == '\\') i++;
            else if (c == '"') in = 0;
        } else if (c == '"') {
            in = 1;
        } else if (c == ',' || c == ':' || c == '[' || c == '{') {
            items++;
        }
    }
    return items;
}
