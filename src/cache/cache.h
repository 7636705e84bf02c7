/* cache.h - the weight cache on disk: keys, atomic publishing, file locks,
 * checked loading, verification, listing and garbage collection.
 *
 * Layout (docs/cache.md):
 *   <root>/<model>/<component>/<parallel id>mesh<R>x<C>_<dtype>[_FSDP][_<layout>][_q-<quant>]_c<content>/
 *       [host_coords_r<r0>-<r1>_c<c0>-<c1>/]   only on runs spanning several hosts
 *       [shard_<part>/]                          one per distinct rank part on a mesh (tp1of2, full)
 *           weights.bin     the tensors, 64-byte aligned, exactly as the kernels consume them
 *           manifest.json   written last: format, key inputs, config, per tensor name, dtype,
 *                           shape, layout, offset, bytes, xxh3-64; its first line carries the
 *                           xxh3-64 of the rest and its HMAC-SHA256 under the trust key (kb_sign)
 * This layer knows files and tensors, not models: the load flow that
 * converts checkpoints lives in src/model/load.c. */
#ifndef KILN_CACHE_H
#define KILN_CACHE_H

#include "base/base.h"
#include "kiln.h"

#define KCACHE_FORMAT_VERSION 2 /* 2: signed manifests, every key input recorded and compared */
#define KCACHE_ALIGN 64
#define KCACHE_MANIFEST "manifest.json"
#define KCACHE_DATA "weights.bin"
#define KCACHE_MAGIC "kiln-cache" /* a manifest's first word: a weight cache (packages say "kiln-package") */
#define KCACHE_MANIFEST_MAX (64u << 20) /* bytes; a manifest lists a few thousand tensors at most */

typedef struct kcache_key_inputs {
    const char *model, *component;
    kiln_parallel parallel;
    int mesh_rows, mesh_cols;
    kiln_dtype dtype;
    int fsdp;
    const char *layout; /* NULL or "" for the plain row-major layout */
    int layout_version; /* bumped when a conversion changes */
    const char *quant;  /* NULL or "": not quantized; else the scheme's tag ("int8", "fp8", ...) */
    int host_coords, host_r0, host_r1, host_c0, host_c1;
    const char *shard;    /* a rank's part on a mesh ("tp1of2", "full"): its own folder; NULL alone */
    uint64_t source_hash; /* kcache_source_hash_* */
} kcache_key_inputs;

typedef struct kcache_key {
    char group[2048];   /* <root>/<model>/<component> */
    char name[320];     /* the key folder's name */
    char prefix[256];   /* name without _c<content>: caches this one supersedes share it */
    char dir[2400];     /* group/name */
    char path[2600];    /* dir[/host_coords_...][/shard_...]: where the files are */
    char content[32];   /* the content hash in hex */
} kcache_key;

/* Build the key under root; checks names (no '/', no "..") and values. */
kiln_status kcache_key_make(const char *root, const kcache_key_inputs *in, kcache_key *out);
/* "CP2_1_TP4_1_SP4_0_" for the set fields (factor > 1), "" for none. */
void kcache_parallel_id(const kiln_parallel *p, char *buf, size_t cap);

/* Source identity for the content hash: sizes, mtimes and header bytes of a
 * checkpoint's files (config.json whole, safetensors headers, index.json). */
kiln_status kcache_source_hash_path(const char *path, const char *config_path, uint64_t *out);
uint64_t kcache_hash_bytes(const void *p, size_t n, uint64_t seed);

/* ---- one cache entry ------------------------------------------------------ */

typedef struct kcache_tensor {
    const char *name;
    kiln_dtype dtype;
    int ndim;
    int64_t shape[4];
    const char *layout; /* "rowmajor" */
    const void *data;
    size_t nbytes;
    uint64_t offset; /* in weights.bin (entries read back) */
    uint64_t xxh3;   /* of the bytes (entries read back) */
} kcache_tensor;

typedef struct kcache_entry {
    char *path;
    kb_map data;
    kcache_tensor *t;
    size_t n;
    char *config_json;
    char *key_json;
    uint64_t data_bytes; /* the size weights.bin must have */
} kcache_entry;

/* Map a published cache at path and check it: path a real folder (not a
 * symlink), manifest and data regular files, manifest checksum, format and
 * signature (kb_verify_sig: made by this user's trust key), every field
 * (kcache_manifest_parse), data file size, every tensor range in the file
 * and aligned; with verify, every tensor's xxh3. KILN_ERR_CACHE_MISSING when
 * there is no manifest, KILN_ERR_CORRUPT (with the reason) when a check
 * fails; another code (the trust key unreadable, out of memory) says
 * nothing about the cache. */
kiln_status kcache_open(const char *path, int verify, kcache_entry **out);
void kcache_close(kcache_entry *e);

/* What lies at path, without following a symlink: KILN_OK for a folder,
 * KILN_ERR_CACHE_MISSING for nothing, KILN_ERR_CORRUPT (message) for a
 * symlink or anything else in its place. */
kiln_status kcache_check_dir(const char *path);

/* The manifest's first line, "kiln-cache <format> xxh3:<16 hex> hmac:<64 hex>":
 * split text into the header's fields and the body both digests cover,
 * checking the xxh3 (not the signature). label names the cache in messages. */
kiln_status kcache_manifest_split(const char *text, size_t len, const char *label, int *version, char sig[65],
                                  const char **body, size_t *body_len);
/* Parse a manifest body into e (key_json, config_json, data_bytes, tensors
 * with name, dtype, shape, layout, offset, bytes, xxh3) checking every field
 * before use: integers integral and in range, shape products and offset +
 * bytes without overflow and inside data_bytes. Touches no file: the
 * tensors' data stay NULL. e is zeroed first; free with kcache_close (also
 * after a failure). This is what the libFuzzer harness
 * tests/fuzz/fuzz_cache_manifest.c runs. */
kiln_status kcache_manifest_parse(const char *body, size_t len, const char *label, kcache_entry *e);
/* A hit needs the manifest's key to be the one asked for: every member of
 * want_json (the load's key, as JSON) equal to the manifest's, and nothing
 * else in the manifest, except the names in skip (NULL-terminated; members
 * the caller cannot know, such as the source without one).
 * KILN_ERR_CORRUPT naming the first field that differs and both values. */
kiln_status kcache_check_key(const kcache_entry *e, const char *want_json, const char *const *skip);
/* For `kiln cache verify`, which knows no load's key: the manifest's key
 * must name the folder it sits in (rel "model/component/key", part this
 * folder's "/host_coords_.../shard_..." under the key, or ""): model,
 * component, content and part. KILN_ERR_CORRUPT naming the field. */
kiln_status kcache_check_place(const kcache_entry *e, const char *rel, const char *part);
/* The "source" recorded in the manifest under dir (malloc'd), read without
 * checking the signature: for removing superseded caches and for listing.
 * NULL when there is none. */
char *kcache_manifest_source(const char *dir);

/* Write tensors + manifest into a staging folder next to key->dir, fsync,
 * and rename into place. Call with the key's lock held. */
kiln_status kcache_publish(const kcache_key *key, const char *key_json, const char *config_json,
                           const kcache_tensor *t, size_t n);
/* The same, one tensor at a time: produce(user, i, t) fills tensor i (its
 * data valid until release(user, i), called once it is written; release may
 * be NULL), so a conversion holds one tensor, not the model. */
typedef kiln_status (*kcache_produce_fn)(void *user, size_t i, kcache_tensor *t);
typedef void (*kcache_release_fn)(void *user, size_t i);
kiln_status kcache_publish_stream(const kcache_key *key, const char *key_json, const char *config_json, size_t n,
                                  kcache_produce_fn produce, kcache_release_fn release, void *user);

/* Exclusive lock of a key (flock on <dir>.lock, released if the holder
 * dies). Blocks; logs once that it is waiting for another process. */
kiln_status kcache_lock(const kcache_key *key, int *fd);
void kcache_unlock(int fd);

/* Remove <dir>.staging.* leftovers of this key (call with the lock held). */
void kcache_clean_staging(const kcache_key *key);
/* Remove other folders of the group that share key->prefix (older content)
 * and whose manifest names the same source (another checkpoint's caches
 * under the same model name are not ours to remove). */
void kcache_remove_superseded(const kcache_key *key, const char *source);
/* Whether a cache under root at dir (a key folder, or a folder on the way
 * to one) could have been written by a user other than this one or root
 * (trust.c, docs/trust.md): KILN_OK, or KILN_ERR_UNTRUSTED naming the
 * folder or file and why (its owner, its mode, a symbolic link). What does
 * not exist yet is not checked. */
kiln_status kcache_check_trust(const char *root, const char *dir);
/* Remove a cache folder: rename aside first so no reader sees half of it. */
kiln_status kcache_remove(const char *dir);

/* ---- the whole cache root ------------------------------------------------- */

/* The one rule for where caches live (docs/cache.md): the given root when
 * set, else $KILN_CACHE_DIR when set (set and empty: no cache, NULL), else
 * $XDG_CACHE_HOME/kiln, else $HOME/.cache/kiln (NULL when neither variable
 * is an absolute path). A root that is missing is created on the first
 * publish; one that cannot be written is read, and misses convert in memory. */
const char *kcache_root(const char *given);
/* The one rule for where compiled packages live: the given folder when set,
 * else $KILN_PACKAGE_DIR, else <cache root>/packages (cache_root as
 * kcache_root resolves it). Malloc'd; NULL (no message) when there is none. */
char *kcache_package_root(const char *given, const char *cache_root);

typedef struct kcache_item {
    char dir[2400];      /* the key folder */
    char rel[1024];      /* model/component/name relative to the root */
    int64_t bytes;       /* all files */
    double last_used;    /* seconds since the epoch (folder mtime, touched on hits) */
    int complete;        /* has a manifest */
    int interrupted;     /* a staging folder (<key>.staging.PID.N) whose build died: nobody holds the key's lock */
    char source[1024];   /* the source its manifest names ("" when unknown) */
} kcache_item;

/* Every weight-cache key folder under root (sorted by rel): those holding a
 * kiln-cache manifest (itself, or in its host_coords_* / shard_* folders),
 * manifest-less folders named like a key (<prefix>_c<12 hex>: an
 * interrupted build), and the staging folders of builds that died (a
 * SIGINT, a kill, a crash: interrupted set; a live build holds the key's
 * lock, and its staging is not listed). Anything else, such as a compiled package (a
 * "kiln-package" manifest, <root>/packages), is not a cache: never listed,
 * verified or removed. */
kiln_status kcache_list(const char *root, kcache_item **out, size_t *n);
/* Remove the staging of dead builds, then least recently used caches until
 * the total is at most max_bytes; on_removed (may be NULL) hears each. */
kiln_status kcache_gc(const char *root, int64_t max_bytes, int *removed, int64_t *freed,
                      void (*on_removed)(void *user, const kcache_item *it), void *user);
/* The bytes of every file under dir (what `kiln cache ls` counts). */
int64_t kcache_dir_bytes(const char *dir);
/* Mark a key folder used now (for gc). */
void kcache_touch(const char *dir);

#endif
