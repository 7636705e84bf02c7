/* fuzz_shard_index.c - libFuzzer harness for a sharded checkpoint's index
 * (model.safetensors.index.json: st_set_open in src/format/safetensors.c):
 * the weight map names the shards, and a shard is a .safetensors file
 * beside the index by a plain name. The harness's folder holds two real
 * shards (model-00001-of-00002: a, b; model-00002-of-00002: c), a text file
 * named like a shard, and a symbolic link named like one that leads out of
 * the folder (to the harness's own outside folder, which holds a valid
 * checkpoint). Properties beyond "no crash, no sanitizer report": a failure
 * leaves a message; an index that opens opened only files inside the folder
 * (never the outside checkpoint), every tensor its weight map names is
 * found, and a tensor is found by name.
 * Seeds: tests/fuzz/corpus/shard_index (make_file_seeds.py). */
#include "base/base.h"
#include "format/safetensors.h"
#include "fuzz_common.h"

#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char g_dir[512], g_out[512];

static void shard(const char *dir, const char *name, const char *const *tensors, int n) {
    char path[700];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    float v[2] = {1, 2};
    st_tensor t[3];
    for (int i = 0; i < n; i++)
        t[i] = (st_tensor){.name = tensors[i], .dtype = KILN_F32, .ndim = 1, .shape = {2}, .data = v, .nbytes = 8};
    if (st_write(path, t, (size_t)n, NULL, 0)) abort();
}

static void setup(void) {
    snprintf(g_dir, sizeof g_dir, "%s/model", kfz_scratch());
    snprintf(g_out, sizeof g_out, "%s/outside", kfz_scratch());
    mkdir(g_dir, 0700);
    mkdir(g_out, 0700);
    static const char *const ab[] = {"a", "b"}, *const c[] = {"c"}, *const x[] = {"x"};
    shard(g_dir, "model-00001-of-00002.safetensors", ab, 2);
    shard(g_dir, "model-00002-of-00002.safetensors", c, 1);
    shard(g_out, "other.safetensors", x, 1);
    char p[700], q[700];
    snprintf(p, sizeof p, "%s/notes.safetensors", g_dir);
    FILE *f = fopen(p, "w");
    if (!f) abort();
    fputs("root:x:0:0:root:/root:/bin/bash\n", f);
    fclose(f);
    snprintf(p, sizeof p, "%s/link.safetensors", g_dir);
    snprintf(q, sizeof q, "%s/other.safetensors", g_out);
    if (symlink(q, p)) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_dir[0]) setup();
    char path[700];
    kfz_write("model/model.safetensors.index.json", data, size, path, sizeof path);
    st_set *s = NULL;
    kiln_status st = st_set_open(path, &s);
    if (st) {
        KFZ_ASSERT(*kiln_last_error());
        KFZ_ASSERT(s == NULL);
        return 0;
    }
    for (size_t i = 0; i < st_set_nfiles(s); i++) {
        const char *fp = st_path(st_set_file(s, i));
        KFZ_ASSERT(!strncmp(fp, g_dir, strlen(g_dir)) && fp[strlen(g_dir)] == '/');
        KFZ_ASSERT(!strchr(fp + strlen(g_dir) + 1, '/'));
    }
    KFZ_ASSERT(!st_set_find(s, "x")); /* the outside checkpoint's tensor */
    for (size_t i = 0; i < st_set_count(s); i++) KFZ_ASSERT(st_set_find(s, st_set_at(s, i)->name) == st_set_at(s, i));
    st_set_close(s);
    return 0;
}
