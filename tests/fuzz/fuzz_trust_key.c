/* fuzz_trust_key.c - libFuzzer harness for the trust key file
 * (src/base/trust.c: kb_trust_key, the secret that signs packages and cache
 * manifests, read from $KILN_PACKAGE_KEY_FILE). Input: the file's bytes,
 * written mode 0600 under a name that changes every run (the key is read
 * again when its path changes). Properties beyond "no crash, no sanitizer
 * report": a failure leaves a message; a key that is read holds 32 to
 * KB_KEY_MAX bytes with no trailing whitespace, signs as 64 lowercase hex
 * digits, and verifies its own signature and no other data's.
 * Seeds: tests/fuzz/corpus/trust_key (make_file_seeds.py). */
#include "base/base.h"
#include "fuzz_common.h"

#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static unsigned run;
    char name[64], path[700];
    snprintf(name, sizeof name, "key-%u", run++ % 2);
    kfz_write(name, data, size, path, sizeof path);
    if (chmod(path, 0600)) abort();
    setenv("KILN_PACKAGE_KEY_FILE", path, 1);
    uint8_t key[KB_KEY_MAX];
    size_t len = 0;
    if (kb_trust_key(key, &len)) {
        KFZ_ASSERT(*kiln_last_error());
        return 0;
    }
    KFZ_ASSERT(len >= 32 && len <= KB_KEY_MAX);
    KFZ_ASSERT(key[len - 1] != ' ' && key[len - 1] != '\n' && key[len - 1] != '\r' && key[len - 1] != '\t');
    char sig[65];
    KFZ_ASSERT(kb_sign("kiln", 4, sig) == KILN_OK && strlen(sig) == 64);
    for (int i = 0; i < 64; i++) KFZ_ASSERT((sig[i] >= '0' && sig[i] <= '9') || (sig[i] >= 'a' && sig[i] <= 'f'));
    KFZ_ASSERT(kb_verify_sig("kiln", 4, sig) == KILN_OK);
    KFZ_ASSERT(kb_verify_sig("kilo", 4, sig) == KILN_ERR_CORRUPT);
    return 0;
}
