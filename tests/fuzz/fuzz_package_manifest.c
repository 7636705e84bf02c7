/* fuzz_package_manifest.c - libFuzzer harness for the package manifest
 * parser (src/compile/manifest.c): any bytes give KILN_OK or a status with
 * a message, never a crash, a sanitizer report or a hang. Built from the
 * parser's sources alone (clang cannot compile the AMX/fp16 kernels):
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -Iinclude -Isrc \
 *     tests/fuzz/fuzz_package_manifest.c src/compile/manifest.c src/compile/expr.c src/base/fs.c \
 *     src/base/error.c src/base/mem.c src/base/sha256.c src/base/log.c src/tensor/dtype.c \
 *     $(pkg-config --cflags --libs libcjson) -lm -lpthread -o fuzz_package_manifest
 *   ./fuzz_package_manifest -dict=tests/fuzz/package_manifest.dict CORPUS tests/fuzz/corpus/package_manifest
 *
 * Seeds: real-*.json are manifests of compiled test packages (sd35-tiny
 * and sd3-tiny: fixed, dynamic w_tok, all four symbols dynamic, whole
 * graph); small*.json are hand-made small ones that parse, for runs with a
 * small -max_len.
 *
 * A manifest that parses also has its digest taken and every input
 * dimension printed and solved at the symbols' largest values, as a load
 * and a forward would. */
#include "base/base.h"
#include "compile/compile.h"
#include "compile/manifest.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kx_manifest *m = NULL;
    if (kx_manifest_parse((const char *)data, size, "fuzz", &m) != KILN_OK) return 0;
    char hex[65], buf[256];
    kx_manifest_digest(m, hex);
    int64_t shape[KX_MAX_IN][4] = {{0}}, hi[KX_MAX_SYMS] = {0}, s[KX_MAX_SYMS];
    for (int i = 0; i < m->nsym; i++) hi[i] = m->sym[i].hi;
    for (int i = 0; i < m->n_in; i++)
        for (int d = 0; d < m->in[i].ndim; d++) {
            kx_expr_str(&m->in[i].dim[d], m->sym, m->nsym, buf, sizeof buf);
            shape[m->in_slot[i]][d] = kx_eval(&m->in[i].dim[d], hi); /* the caller passes shapes by slot */
        }
    /* as kx_package_solve: the caller's shapes in slot order */
    int64_t sh[KX_MAX_IN][4];
    for (int i = 0; i < m->n_in; i++) memcpy(sh[i], shape[m->in_slot[i]], sizeof sh[i]);
    kx_solve(m->sym, m->nsym, m->in, m->n_in, (const int64_t(*)[4])sh, s);
    kx_manifest_free(m);
    return 0;
}
