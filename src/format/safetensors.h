/* safetensors.h - a validating, zero-copy safetensors reader (mmap) and an
 * atomic writer; plus sharded sets through *.safetensors.index.json.
 *
 * File layout: u64 little-endian header length N, N bytes of JSON header,
 * then the data section. The header maps tensor names to
 * {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the
 * data section) and may hold "__metadata__": {string: string}.
 *
 * st_open validates everything before any view is handed out: header length
 * bound (<= 100 MB and inside the file), JSON syntax, known dtypes, shapes of
 * non-negative integers, shape x dtype size == end - begin (no overflow),
 * ranges inside the data section, no two ranges overlapping, metadata values
 * are strings. Every failure is an error code plus a message naming the file
 * and, where there is one, the tensor. */
#ifndef KILN_SAFETENSORS_H
#define KILN_SAFETENSORS_H

#include "kiln.h"
#include <stddef.h>
#include <stdint.h>

#define ST_MAX_HEADER (100u * 1000u * 1000u)
/* A header's JSON values, counted before it is parsed (cJSON makes a node
 * of each, ~100 bytes with its strings): a real checkpoint holds a few
 * thousand tensors of ~6 values each, and a 1M-entry header took 976 MB to
 * refuse. 2^21 values is ~300,000 tensors. */
#define ST_MAX_HEADER_ITEMS (1L << 21)

typedef struct st_tensor {
    const char *name;
    kiln_dtype dtype;
    int ndim;
    int64_t shape[KILN_MAX_DIMS];
    const void *data; /* into the mapping (reader) or caller memory (writer); may be unaligned */
    size_t nbytes;
} st_tensor;

/* ---- one file ------------------------------------------------------------- */
typedef struct st_file st_file;

kiln_status st_open(const char *path, st_file **out);
void st_close(st_file *f);
size_t st_count(const st_file *f);
const st_tensor *st_at(const st_file *f, size_t i); /* in header order */
const st_tensor *st_find(const st_file *f, const char *name); /* NULL if absent */
const char *st_metadata(const st_file *f, const char *key);   /* NULL if absent */
const char *st_path(const st_file *f);
size_t st_file_size(const st_file *f);

/* Write tensors (data from st_tensor.data, nbytes must match shape x dtype)
 * and optional metadata pairs (meta[2*i] key, meta[2*i+1] value) to path,
 * atomically (temp file in the same folder, fsync, rename). The data section
 * starts 64-byte aligned (the header is padded with spaces); tensors follow
 * back to back without gaps, as the reference implementation requires. */
kiln_status st_write(const char *path, const st_tensor *tensors, size_t n,
                     const char *const *meta, size_t n_meta);
/* st_write of tensors whose bytes fill makes one at a time (their data may
 * be NULL): fill(user, i, buf) writes tensor i's nbytes into buf; a failure
 * it returns leaves nothing at path. So a file larger than the memory is
 * written in one tensor's memory. */
typedef kiln_status (*st_fill_fn)(void *user, size_t i, void *buf);
kiln_status st_write_stream(const char *path, const st_tensor *tensors, size_t n, const char *const *meta,
                            size_t n_meta, st_fill_fn fill, void *user);

/* ---- a set of files: one file, or shards named by an index.json ---------- */
typedef struct st_set st_set;

/* path: a .safetensors file or a *.safetensors.index.json ("weight_map":
 * name -> shard file, relative to the index's folder). Every name in the
 * weight map must be found in its shard, and no name may appear twice. */
kiln_status st_set_open(const char *path, st_set **out);
void st_set_close(st_set *s);
size_t st_set_count(const st_set *s);
const st_tensor *st_set_at(const st_set *s, size_t i);
const st_tensor *st_set_find(const st_set *s, const char *name);
size_t st_set_nfiles(const st_set *s);
const st_file *st_set_file(const st_set *s, size_t i);
int64_t st_set_bytes(const st_set *s); /* sum of file sizes */

/* number of elements of a shape; -1 on overflow */
int64_t st_numel(const st_tensor *t);

#endif
