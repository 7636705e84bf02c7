/* test_base.c - src/base primitives: SHA-256 in steps, HMAC-SHA256 (RFC 4231
 * vectors) and the trust key's file rules (base.h). */
#include "base/base.h"
#include "test.h"

#include <sys/stat.h>
#include <unistd.h>

static void hex_of(const uint8_t *b, char *hex) { kb_hex(b, 32, hex); }

TEST(sha256_vectors) {
    char hex[65];
    kb_sha256("abc", 3, hex);
    CHECK(!strcmp(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"));
    kb_sha256("", 0, hex);
    CHECK(!strcmp(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"));
    /* in uneven steps: the same digest as whole */
    static uint8_t buf[1000];
    for (int i = 0; i < 1000; i++) buf[i] = (uint8_t)(i * 7 + 3);
    char whole[65], steps[65];
    kb_sha256(buf, sizeof buf, whole);
    kb_sha256_ctx c;
    kb_sha256_init(&c);
    size_t at = 0, step = 1;
    while (at < sizeof buf) {
        size_t n = step < sizeof buf - at ? step : sizeof buf - at;
        kb_sha256_update(&c, buf + at, n);
        at += n;
        step = step * 3 % 131 + 1;
    }
    uint8_t out[32];
    kb_sha256_final(&c, out);
    hex_of(out, steps);
    CHECK(!strcmp(whole, steps));
}

TEST(hmac_rfc4231) {
    uint8_t mac[32];
    char hex[65];
    /* test case 2 */
    kb_hmac_sha256("Jefe", 4, "what do ya want for nothing?", 28, mac);
    hex_of(mac, hex);
    CHECK(!strcmp(hex, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"));
    /* test case 6: a key longer than the block */
    uint8_t key[131];
    memset(key, 0xaa, sizeof key);
    const char *msg = "Test Using Larger Than Block-Size Key - Hash Key First";
    kb_hmac_sha256(key, sizeof key, msg, strlen(msg), mac);
    hex_of(mac, hex);
    CHECK(!strcmp(hex, "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"));
    CHECK(kb_const_eq("abcd", "abcd", 4) && !kb_const_eq("abcd", "abce", 4));
}

TEST(trust_key_file) {
    char dir[256], path[400];
    test_tmpdir(dir, sizeof dir, "key");
    /* created on first use under XDG_CONFIG_HOME, 0600 */
    unsetenv("KILN_PACKAGE_KEY_FILE");
    setenv("XDG_CONFIG_HOME", dir, 1);
    uint8_t k1[KB_KEY_MAX], k2[KB_KEY_MAX];
    size_t n1 = 0, n2 = 0;
    CHECK_OK(kb_trust_key(k1, &n1));
    CHECK(n1 == 64);
    snprintf(path, sizeof path, "%s/kiln/package.key", dir);
    struct stat st;
    CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0600);
    CHECK_OK(kb_trust_key(k2, &n2));
    CHECK(n1 == n2 && !memcmp(k1, k2, n1));
    char s1[65];
    CHECK_OK(kb_sign("data", 4, s1));
    CHECK_OK(kb_verify_sig("data", 4, s1));
    CHECK_FAILS(kb_verify_sig("datb", 4, s1), KILN_ERR_CORRUPT, "signature");
    CHECK_FAILS(kb_verify_sig("data", 4, "00"), KILN_ERR_CORRUPT, "signature");
    /* a given key file must exist and be private */
    char given[400];
    snprintf(given, sizeof given, "%s/fleet.key", dir);
    setenv("KILN_PACKAGE_KEY_FILE", given, 1);
    CHECK_FAILS(kb_trust_key(k2, &n2), KILN_ERR_IO, "KILN_PACKAGE_KEY_FILE");
    FILE *f = fopen(given, "w");
    fputs("0123456789abcdef0123456789abcdef0123456789abcdef\n", f);
    fclose(f);
    chmod(given, 0644);
    CHECK_FAILS(kb_trust_key(k2, &n2), KILN_ERR_INVALID_ARG, "chmod 600");
    chmod(given, 0600);
    CHECK_OK(kb_trust_key(k2, &n2));
    CHECK(n2 == 48);
    char s2[65];
    CHECK_OK(kb_sign("data", 4, s2));
    CHECK(strcmp(s1, s2) != 0); /* another key, another signature */
    /* too short */
    char shortk[400];
    snprintf(shortk, sizeof shortk, "%s/short.key", dir);
    f = fopen(shortk, "w");
    fputs("tooshort\n", f);
    fclose(f);
    chmod(shortk, 0600);
    setenv("KILN_PACKAGE_KEY_FILE", shortk, 1);
    CHECK_FAILS(kb_trust_key(k2, &n2), KILN_ERR_INVALID_ARG, "bytes");
    /* a symbolic link is not followed */
    char link[400];
    snprintf(link, sizeof link, "%s/link.key", dir);
    CHECK(symlink(given, link) == 0);
    setenv("KILN_PACKAGE_KEY_FILE", link, 1);
    CHECK_FAILS(kb_trust_key(k2, &n2), KILN_ERR_IO, "symbolic link");
    unsetenv("KILN_PACKAGE_KEY_FILE");
    unsetenv("XDG_CONFIG_HOME");
    test_rmrf(dir);
}

int main(void) {
    RUN(sha256_vectors);
    RUN(hmac_rfc4231);
    RUN(trust_key_file);
    return TEST_SUMMARY();
}
