/* sha256.c - SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104): the package
 * manifest's hash of its shared object, and the keyed signatures of packages
 * and cache manifests (trust.c holds the key). */
#include "base/base.h"

#include <stdio.h>
#include <string.h>

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static uint32_t ror(uint32_t x, int n) { return x >> n | x << (32 - n); }

static void block(uint32_t h[8], const uint8_t *p) {
    uint32_t w[64];
    for (int i = 0; i < 16; i++) w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ror(w[i - 15], 7) ^ ror(w[i - 15], 18) ^ w[i - 15] >> 3;
        uint32_t s1 = ror(w[i - 2], 17) ^ ror(w[i - 2], 19) ^ w[i - 2] >> 10;
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = k + (ror(e, 6) ^ ror(e, 11) ^ ror(e, 25)) + ((e & f) ^ (~e & g)) + K[i] + w[i];
        uint32_t t2 = (ror(a, 2) ^ ror(a, 13) ^ ror(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        k = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
    }
    h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += k;
}

void kb_sha256_init(kb_sha256_ctx *c) {
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(c->h, h0, sizeof h0);
    c->n = 0;
    c->len = 0;
}

void kb_sha256_update(kb_sha256_ctx *c, const void *data, size_t n) {
    const uint8_t *p = data;
    c->n += n;
    if (c->len) {
        size_t take = 64 - c->len < n ? 64 - c->len : n;
        memcpy(c->buf + c->len, p, take);
        c->len += take;
        p += take;
        n -= take;
        if (c->len < 64) return;
        block(c->h, c->buf);
        c->len = 0;
    }
    for (; n >= 64; n -= 64, p += 64) block(c->h, p);
    if (n) memcpy(c->buf, p, n);
    c->len = n;
}

void kb_sha256_final(kb_sha256_ctx *c, uint8_t out[32]) {
    uint8_t tail[128] = {0};
    size_t left = c->len;
    memcpy(tail, c->buf, left);
    tail[left] = 0x80;
    size_t tl = left < 56 ? 64 : 128;
    uint64_t bits = c->n * 8;
    for (int i = 0; i < 8; i++) tail[tl - 1 - i] = (uint8_t)(bits >> (8 * i));
    block(c->h, tail);
    if (tl == 128) block(c->h, tail + 64);
    for (int i = 0; i < 8; i++)
        for (int k = 0; k < 4; k++) out[4 * i + k] = (uint8_t)(c->h[i] >> (24 - 8 * k));
}

void kb_hex(const uint8_t *b, size_t n, char *hex) {
    static const char d[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        hex[2 * i] = d[b[i] >> 4];
        hex[2 * i + 1] = d[b[i] & 15];
    }
    hex[2 * n] = 0;
}

void kb_sha256(const void *data, size_t n, char hex[65]) {
    kb_sha256_ctx c;
    uint8_t out[32];
    kb_sha256_init(&c);
    kb_sha256_update(&c, data, n);
    kb_sha256_final(&c, out);
    kb_hex(out, 32, hex);
}

kiln_status kb_sha256_file(const char *path, char hex[65]) {
    kb_map m;
    kiln_status st = kb_map_file(path, &m);
    if (st) return st;
    kb_sha256(m.data, m.size, hex);
    kb_unmap(&m);
    return KILN_OK;
}

/* ---- HMAC-SHA256 (RFC 2104) ------------------------------------------------------ */

void kb_hmac_init(kb_hmac_ctx *c, const void *key, size_t klen) {
    uint8_t k[64] = {0}, pad[64];
    if (klen > 64) {
        kb_sha256_ctx h;
        kb_sha256_init(&h);
        kb_sha256_update(&h, key, klen);
        kb_sha256_final(&h, k);
    } else if (klen) {
        memcpy(k, key, klen);
    }
    for (int i = 0; i < 64; i++) pad[i] = k[i] ^ 0x36;
    kb_sha256_init(&c->inner);
    kb_sha256_update(&c->inner, pad, 64);
    for (int i = 0; i < 64; i++) pad[i] = k[i] ^ 0x5c;
    kb_sha256_init(&c->outer);
    kb_sha256_update(&c->outer, pad, 64);
}

void kb_hmac_update(kb_hmac_ctx *c, const void *data, size_t n) { kb_sha256_update(&c->inner, data, n); }

void kb_hmac_final(kb_hmac_ctx *c, uint8_t out[32]) {
    uint8_t ih[32];
    kb_sha256_final(&c->inner, ih);
    kb_sha256_update(&c->outer, ih, 32);
    kb_sha256_final(&c->outer, out);
}

void kb_hmac_sha256(const void *key, size_t klen, const void *data, size_t n, uint8_t out[32]) {
    kb_hmac_ctx c;
    kb_hmac_init(&c, key, klen);
    kb_hmac_update(&c, data, n);
    kb_hmac_final(&c, out);
}

int kb_const_eq(const void *a, const void *b, size_t n) {
    const volatile uint8_t *x = a, *y = b;
    uint8_t d = 0;
    for (size_t i = 0; i < n; i++) d |= x[i] ^ y[i];
    return d == 0;
}
