/* fuzz_safetensors.c - libFuzzer harness for the safetensors reader
 * (src/format/safetensors.c) and the checkpoint layer above it
 * (src/format/checkpoint.c: SD3 and Flux renames, fused qkv split, Flux's
 * 1:1:1:4 linear1 split) and config inference from shapes
 * (sd3_config_infer, flux_config_infer).
 *
 * The input is a whole file. Properties checked beyond "no crash, no
 * sanitizer report": a failure leaves a message; every view handed out lies
 * inside the file and is readable; st_find finds every tensor by its name;
 * a file that opens survives st_write and reads back with the same tensors. */
#include "fuzz_common.h"

#include "base/base.h"
#include "format/checkpoint.h"
#include "format/safetensors.h"
#include "arch/flux/flux.h"
#include "arch/sd3/sd3.h"

/* SD3's and Flux's original names: the renamers run on every fuzzed file */
static const kc_renamer *const k_renamers[] = {&sd3_renamer, &flux_renamer, NULL};

static volatile uint8_t kfz_sink;

/* Touch every byte of a view: ASan (or a SIGSEGV) catches a view that
 * leaves the mapping. */
static void touch(const void *p, size_t n) {
    const uint8_t *b = p;
    uint8_t x = 0;
    for (size_t i = 0; i < n; i++) x ^= b[i];
    kfz_sink ^= x;
}

static void check_file(const st_file *f, size_t file_size) {
    KFZ_ASSERT(st_file_size(f) == file_size);
    size_t n = st_count(f);
    KFZ_ASSERT(st_at(f, n) == NULL);
    for (size_t i = 0; i < n; i++) {
        const st_tensor *t = st_at(f, i);
        KFZ_ASSERT(t && t->name);
        KFZ_ASSERT(t->ndim >= 0 && t->ndim <= KILN_MAX_DIMS);
        int64_t numel = st_numel(t);
        KFZ_ASSERT(numel >= 0);
        KFZ_ASSERT((uint64_t)numel * kiln_dtype_size(t->dtype) == t->nbytes);
        KFZ_ASSERT(t->nbytes <= file_size);
        touch(t->data, t->nbytes);
        KFZ_ASSERT(st_find(f, t->name) == t);
    }
    KFZ_ASSERT(st_find(f, "\x01 no such tensor") == NULL || st_count(f) > 0);
}

/* st_write what was read, open the copy, compare. */
static void round_trip(const st_file *f) {
    size_t n = st_count(f);
    st_tensor *ts = calloc(n ? n : 1, sizeof *ts);
    KFZ_ASSERT(ts);
    for (size_t i = 0; i < n; i++) ts[i] = *st_at(f, i);
    char path[512];
    snprintf(path, sizeof path, "%s/copy.safetensors", kfz_scratch());
    const char *meta[] = {"format", "pt"};
    kiln_status st = st_write(path, ts, n, meta, 1);
    if (st != KILN_OK) {
        /* only a name the writer cannot express may fail (message says which) */
        KFZ_ASSERT(kiln_last_error()[0]);
        free(ts);
        return;
    }
    st_file *g = NULL;
    st = st_open(path, &g);
    if (st != KILN_OK) fprintf(stderr, "kiln fuzz: reopening the copy: %s\n", kiln_last_error());
    KFZ_ASSERT(st == KILN_OK);
    KFZ_ASSERT(st_count(g) == n);
    for (size_t i = 0; i < n; i++) {
        const st_tensor *a = &ts[i], *b = st_find(g, a->name);
        KFZ_ASSERT(b && b->dtype == a->dtype && b->ndim == a->ndim && b->nbytes == a->nbytes);
        KFZ_ASSERT(!memcmp(a->shape, b->shape, sizeof a->shape[0] * (size_t)a->ndim));
        KFZ_ASSERT(!a->nbytes || !memcmp(a->data, b->data, a->nbytes));
    }
    const char *fmt = st_metadata(g, "format");
    KFZ_ASSERT(fmt && !strcmp(fmt, "pt"));
    st_close(g);
    free(ts);
}

/* The checkpoint layer on the same file: renames and splits are views too. */
static void checkpoint(const char *path) {
    kc_checkpoint *c = NULL;
    if (kc_open(path, NULL, k_renamers, &c) != KILN_OK) {
        KFZ_ASSERT(kiln_last_error()[0]);
        return;
    }
    for (size_t i = 0; i < c->n; i++) {
        const kc_tensor *t = &c->t[i];
        touch(t->part[0], t->part_bytes[0]);
        touch(t->part[1], t->part_bytes[1]);
        KFZ_ASSERT(kc_find(c, t->name) != NULL);
    }
    kiln_config cfg;
    if (sd3_config_infer(c, &cfg) == KILN_OK) {
        ka_spec *spec = NULL;
        size_t ns = 0;
        if (sd3_weight_spec(&cfg, &spec, &ns) == KILN_OK) free(spec);
    } else {
        KFZ_ASSERT(kiln_last_error()[0]);
    }
    for (int guided = 0; guided < 2; guided++) {
        flux_config fc;
        if (flux_config_infer(c, &fc, guided) == KILN_OK) {
            KFZ_ASSERT(flux_config_validate(&fc) == KILN_OK && fc.guidance_embeds == guided);
            ka_spec *spec = NULL;
            size_t ns = 0;
            if (flux_weight_spec(&fc, &spec, &ns) == KILN_OK) free(spec);
        } else {
            KFZ_ASSERT(kiln_last_error()[0]);
        }
    }
    kc_close(c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[512];
    kfz_write("in.safetensors", data, size, path, sizeof path);
    kb_clear_error();
    st_file *f = NULL;
    kiln_status st = st_open(path, &f);
    if (st != KILN_OK) {
        KFZ_ASSERT(f == NULL);
        KFZ_ASSERT(kiln_last_error()[0]);
        return 0;
    }
    check_file(f, size);
    round_trip(f);
    st_close(f);
    checkpoint(path);
    return 0;
}
