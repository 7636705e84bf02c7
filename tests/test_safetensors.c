/* test_safetensors.c - reader validation, writer round trip and layout,
 * sharded sets. Malformed files are built from raw bytes so each test pins
 * one defect and the error it must produce. */
#include "base/base.h"
#include "format/safetensors.h"
#include "test.h"

#include <sys/resource.h>

#include <stdint.h>
#include <unistd.h>

/* ---- helpers ----------------------------------------------------------------- */

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f) != 0) {
        perror(path);
        exit(2);
    }
}

/* A raw safetensors file: u64 LE header length (hlen, or strlen(header) when
 * hlen is UINT64_MAX), the header, then ndata bytes 0, 1, 2, ... */
static void write_raw_len(const char *path, uint64_t hlen, const char *header, size_t ndata) {
    size_t hl = strlen(header);
    size_t n = 8 + hl + ndata;
    uint8_t *buf = malloc(n);
    if (hlen == UINT64_MAX) hlen = hl;
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(hlen >> (8 * i));
    memcpy(buf + 8, header, hl);
    for (size_t i = 0; i < ndata; i++) buf[8 + hl + i] = (uint8_t)i;
    write_bytes(path, buf, n);
    free(buf);
}

static void write_raw(const char *path, const char *header, size_t ndata) {
    write_raw_len(path, UINT64_MAX, header, ndata);
}

static void join(char *buf, size_t cap, const char *dir, const char *name) {
    snprintf(buf, cap, "%s/%s", dir, name);
}

/* st_open of a raw file must fail with code; the message must hold substr
 * and name the file. */
static void expect_open_fails(const char *dir, const char *header, size_t ndata,
                              kiln_status code, const char *substr) {
    char path[4096];
    join(path, sizeof path, dir, "bad.safetensors");
    write_raw(path, header, ndata);
    st_file *f = (st_file *)1;
    CHECK_FAILS(st_open(path, &f), code, substr);
    CHECK_MSG(strstr(kiln_last_error(), path) != NULL, "message \"%s\" lacks the path",
              kiln_last_error());
    CHECK(f == NULL);
}

static st_tensor mk(const char *name, kiln_dtype dt, int ndim, const int64_t *shape,
                    const void *data) {
    st_tensor t;
    memset(&t, 0, sizeof t);
    t.name = name;
    t.dtype = dt;
    t.ndim = ndim;
    for (int i = 0; i < ndim; i++) t.shape[i] = shape[i];
    t.data = data;
    t.nbytes = kiln_dtype_size(dt);
    for (int i = 0; i < ndim; i++) t.nbytes *= (size_t)shape[i];
    return t;
}

static int same_tensor(const st_tensor *a, const st_tensor *b) {
    if (strcmp(a->name, b->name) || a->dtype != b->dtype || a->ndim != b->ndim ||
        a->nbytes != b->nbytes)
        return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return 0;
    return a->nbytes == 0 || memcmp(a->data, b->data, a->nbytes) == 0;
}

static uint64_t header_len_of(const char *path) {
    uint8_t b[8] = {0};
    FILE *f = fopen(path, "rb");
    if (f) {
        if (fread(b, 1, 8, f) != 8) memset(b, 0, 8);
        fclose(f);
    }
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | b[i];
    return n;
}

/* ---- round trip ---------------------------------------------------------------- */

TEST(test_round_trip) {
    char dir[4096], path[4200];
    test_tmpdir(dir, sizeof dir, "st");
    join(path, sizeof path, dir, "rt.safetensors");

    float w[6] = {1, -2, 3.5f, 0, 1e-7f, -1e30f};
    uint16_t h[5] = {0x3c00, 0xbc00, 0x7c00, 0x0001, 0x8000}; /* odd byte count: forces padding */
    uint16_t bf[6] = {0x3f80, 0x4000, 0xc040, 0x7f80, 0xff80, 0x0000};
    int64_t ids[4] = {0, -1, INT64_MAX, INT64_MIN};
    const int64_t s_w[2] = {2, 3}, s_h[1] = {5}, s_bf[3] = {3, 1, 2}, s_ids[1] = {4};
    st_tensor ts[4] = {
        mk("layer.weight", KILN_F32, 2, s_w, w),
        mk("layer.half", KILN_F16, 1, s_h, h),
        mk("a.bf16 \"quoted\" \\ name", KILN_BF16, 3, s_bf, bf),
        mk("ids", KILN_I64, 1, s_ids, ids),
    };
    const char *meta[] = {"format", "pt", "note", "h\xc3\xa9llo \"q\"\n\ttab"};
    CHECK_OK(st_write(path, ts, 4, meta, 2));

    st_file *f = NULL;
    CHECK_OK(st_open(path, &f));
    if (!f) goto done;
    CHECK(st_count(f) == 4);
    for (size_t i = 0; i < 4 && i < st_count(f); i++) {
        const st_tensor *t = st_at(f, i);
        CHECK_MSG(same_tensor(t, &ts[i]), "tensor %zu (%s) differs", i, t->name);
        /* the data section starts 64-byte aligned (the mapping is page-aligned);
         * tensors follow back to back, as the reference reader demands */
        if (i == 0) CHECK_MSG(((uintptr_t)t->data & 63) == 0, "data section not 64-byte aligned");
        else CHECK_MSG((const uint8_t *)t->data == (const uint8_t *)st_at(f, i - 1)->data + st_at(f, i - 1)->nbytes,
                       "tensor %s does not follow the previous one", t->name);
        CHECK(st_find(f, ts[i].name) == t);
    }
    CHECK(st_at(f, 4) == NULL);
    CHECK(st_find(f, "nope") == NULL);
    CHECK(st_find(f, "") == NULL);
    CHECK(st_metadata(f, "format") && !strcmp(st_metadata(f, "format"), "pt"));
    CHECK(st_metadata(f, "note") && !strcmp(st_metadata(f, "note"), meta[3]));
    CHECK(st_metadata(f, "missing") == NULL);
    CHECK(!strcmp(st_path(f), path));
    CHECK(st_numel(st_at(f, 0)) == 6);
    CHECK(st_numel(st_at(f, 2)) == 6);
    CHECK((header_len_of(path) + 8) % 64 == 0);

    char *raw = NULL;
    size_t rawlen = 0;
    CHECK_OK(kb_read_file(path, &raw, &rawlen));
    CHECK(st_file_size(f) == rawlen);
    /* tensor bytes sit at their place in the file too, not only in the view */
    if (raw) {
        const uint8_t *base = (const uint8_t *)st_at(f, 0)->data;
        size_t off0 = 8 + (size_t)header_len_of(path); /* first tensor starts the data section */
        for (size_t i = 0; i < st_count(f); i++) {
            const st_tensor *t = st_at(f, i);
            size_t off = off0 + (size_t)((const uint8_t *)t->data - base);
            if (i == 0) CHECK(off % 64 == 0);
            CHECK(off + t->nbytes <= rawlen && !memcmp(raw + off, ts[i].data, t->nbytes));
            if (i + 1 == st_count(f)) CHECK(off + t->nbytes == rawlen); /* no trailing bytes */
        }
    }
    free(raw);
    st_close(f);

    /* rewriting over an existing file replaces it and leaves no temp file */
    CHECK_OK(st_write(path, ts, 1, NULL, 0));
    CHECK_OK(st_open(path, &f));
    if (f) {
        CHECK(st_count(f) == 1 && st_metadata(f, "format") == NULL);
        st_close(f);
    }
    char tmp[4300];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    CHECK(!kb_is_file(tmp));
done:
    test_rmrf(dir);
}

TEST(test_zero_element) {
    char dir[4096], path[4200];
    test_tmpdir(dir, sizeof dir, "st");
    join(path, sizeof path, dir, "z.safetensors");
    float one = 42.0f;
    const int64_t s0[2] = {0, 4}, s1[1] = {3};
    float three[3] = {1, 2, 3};
    st_tensor ts[4] = {
        mk("empty", KILN_F32, 2, s0, NULL),
        mk("scalar", KILN_F32, 0, NULL, &one),
        mk("three", KILN_F32, 1, s1, three),
        mk("empty_last", KILN_BF16, 2, s0, NULL),
    };
    CHECK_OK(st_write(path, ts, 4, NULL, 0));
    st_file *f = NULL;
    CHECK_OK(st_open(path, &f));
    if (f) {
        CHECK(st_count(f) == 4);
        const st_tensor *e = st_find(f, "empty");
        CHECK(e && e->nbytes == 0 && e->ndim == 2 && e->shape[0] == 0 && st_numel(e) == 0);
        const st_tensor *s = st_find(f, "scalar");
        CHECK(s && s->ndim == 0 && s->nbytes == 4 && st_numel(s) == 1 &&
              !memcmp(s->data, &one, 4));
        CHECK(same_tensor(st_find(f, "three"), &ts[2]));
        CHECK(st_find(f, "empty_last") && st_find(f, "empty_last")->nbytes == 0);
        st_close(f);
    }

    /* zero-size ranges never overlap, even inside another tensor's bytes */
    join(path, sizeof path, dir, "zr.safetensors");
    write_raw(path,
              "{\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]},"
              "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]},"
              "\"z2\":{\"dtype\":\"F32\",\"shape\":[2,0],\"data_offsets\":[8,8]}}",
              8);
    CHECK_OK(st_open(path, &f));
    if (f) {
        CHECK(st_count(f) == 3 && st_at(f, 1)->nbytes == 0);
        st_close(f);
    }

    /* an empty file set: no tensors, header padded, "__metadata__": null allowed */
    join(path, sizeof path, dir, "none.safetensors");
    CHECK_OK(st_write(path, NULL, 0, NULL, 0));
    CHECK_OK(st_open(path, &f));
    if (f) {
        CHECK(st_count(f) == 0 && st_find(f, "x") == NULL && st_file_size(f) == 64);
        st_close(f);
    }
    write_raw(path, "{\"__metadata__\":null}", 0);
    CHECK_OK(st_open(path, &f));
    if (f) {
        CHECK(st_count(f) == 0 && st_metadata(f, "k") == NULL);
        st_close(f);
    }
    test_rmrf(dir);
}

/* ---- malformed files ---------------------------------------------------------- */

TEST(test_short_file) {
    char dir[4096], path[4200];
    test_tmpdir(dir, sizeof dir, "st");
    join(path, sizeof path, dir, "short.safetensors");
    st_file *f = NULL;
    write_bytes(path, "\x02\0\0\0\0", 5);
    CHECK_FAILS(st_open(path, &f), KILN_ERR_FORMAT, "too short");
    CHECK(strstr(kiln_last_error(), path) != NULL);
    write_bytes(path, "", 0);
    CHECK_FAILS(st_open(path, &f), KILN_ERR_FORMAT, "too short");
    CHECK(f == NULL);
    test_rmrf(dir);
}

TEST(test_header_past_end) {
    char dir[4096], path[4200];
    test_tmpdir(dir, sizeof dir, "st");
    join(path, sizeof path, dir, "past.safetensors");
    st_file *f = NULL;
    write_raw_len(path, 100, "{}", 10);
    CHECK_FAILS(st_open(path, &f), KILN_ERR_FORMAT, "past the end of the file");
    write_raw_len(path, 13, "{}", 2); /* one byte short */
    CHECK_FAILS(st_open(path, &f), KILN_ERR_FORMAT, "header length 13");
    write_raw_len(path, UINT64_MAX - 3, "{}", 0); /* 8 + N would wrap */
    CHECK_FAILS(st_open(path, &f), KILN_ERR_FORMAT, "exceeds the limit");
    test_rmrf(dir);
}

TEST(test_header_too_big) {
    char dir[4096], path[4200];
    test_tmpdir(dir, sizeof dir, "st");
    join(path, sizeof path, dir, "big.safetensors");
    st_file *f = NULL;
    write_raw_len(path, (uint64_t)ST_MAX_HEADER + 1, "{}", 0);
    CHECK_FAILS(st_open(path, &f), KILN_ERR_FORMAT, "header length 100000001 exceeds the limit");
    test_rmrf(dir);
}

/* A header of a million entries (55 MB): refused by its count of values
 * before cJSON builds a node of each (it took 976 MB to refuse, issue 42) */
TEST(test_header_of_a_million_entries) {
    char dir[4096], path[4200];
    test_tmpdir(dir, sizeof dir, "st");
    join(path, sizeof path, dir, "million.safetensors");
    size_t cap = 64u << 20;
    char *h = malloc(cap), *p = h;
    p += sprintf(p, "{");
    for (int i = 0; i < 1000000; i++)
        p += sprintf(p, "%s\"t%d\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}", i ? "," : "", i);
    sprintf(p, "}");
    write_raw(path, h, 0);
    free(h);
    struct rusage ru0, ru1;
    getrusage(RUSAGE_SELF, &ru0);
    st_file *f = NULL;
    CHECK_FAILS(st_open(path, &f), KILN_ERR_FORMAT, "JSON values; at most");
    getrusage(RUSAGE_SELF, &ru1);
    fprintf(stderr, "  a 1M-entry header refused; peak RSS grew %ld MB\n", (ru1.ru_maxrss - ru0.ru_maxrss) / 1024);
    CHECK(ru1.ru_maxrss - ru0.ru_maxrss < 300 * 1024); /* the header's copy, not a node per value */
    test_rmrf(dir);
}

TEST(test_bad_json) {
    char dir[4096];
    test_tmpdir(dir, sizeof dir, "st");
    expect_open_fails(dir, "{\"a\": ", 0, KILN_ERR_FORMAT, "not valid JSON");
    expect_open_fails(dir, "", 0, KILN_ERR_FORMAT, "not valid JSON");
    expect_open_fails(dir, "{\"a\":{\"dtype\":\"F32\",}}", 0, KILN_ERR_FORMAT, "not valid JSON");
    expect_open_fails(dir, "{} x", 0, KILN_ERR_FORMAT, "trailing bytes");
    expect_open_fails(dir, "{}{}", 0, KILN_ERR_FORMAT, "trailing bytes");
    /* the header may be padded with whitespace */
    char path[4200];
    join(path, sizeof path, dir, "pad.safetensors");
    write_raw(path, "  {}   \n\t ", 0);
    st_file *f = NULL;
    CHECK_OK(st_open(path, &f));
    st_close(f);
    /* a NUL inside the header is not padding */
    uint8_t buf[8 + 4] = {4, 0, 0, 0, 0, 0, 0, 0, '{', '}', 0, ' '};
    write_bytes(path, buf, sizeof buf);
    CHECK_FAILS(st_open(path, &f), KILN_ERR_FORMAT, "trailing bytes");
    test_rmrf(dir);
}

TEST(test_not_object) {
    char dir[4096];
    test_tmpdir(dir, sizeof dir, "st");
    expect_open_fails(dir, "[1, 2]", 0, KILN_ERR_FORMAT, "header is not a JSON object");
    expect_open_fails(dir, "\"str\"", 0, KILN_ERR_FORMAT, "header is not a JSON object");
    expect_open_fails(dir, "{\"a\": 5}", 0, KILN_ERR_FORMAT, "tensor 'a': entry is not a JSON object");
    test_rmrf(dir);
}

TEST(test_unknown_dtype) {
    char dir[4096];
    test_tmpdir(dir, sizeof dir, "st");
    expect_open_fails(dir, "{\"w\":{\"dtype\":\"F7\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                      KILN_ERR_FORMAT, "unknown dtype");
    CHECK(strstr(kiln_last_error(), "tensor 'w'") != NULL);
    expect_open_fails(dir, "{\"w\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                      KILN_ERR_FORMAT, "unknown dtype 'f32'");
    expect_open_fails(dir, "{\"w\":{\"dtype\":32,\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                      KILN_ERR_FORMAT, "dtype is missing or not a string");
    expect_open_fails(dir, "{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, KILN_ERR_FORMAT,
                      "dtype is missing");
    test_rmrf(dir);
}

TEST(test_bad_shape) {
    char dir[4096];
    test_tmpdir(dir, sizeof dir, "st");
    expect_open_fails(dir, "{\"w\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,8]}}", 8,
                      KILN_ERR_FORMAT, "shape element 0 (2.5) is not a non-negative integer");
    expect_open_fails(dir, "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,-1],\"data_offsets\":[0,8]}}", 8,
                      KILN_ERR_FORMAT, "shape element 1 (-1) is not a non-negative integer");
    expect_open_fails(dir, "{\"w\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}", 8,
                      KILN_ERR_FORMAT, "shape element 0 is not a non-negative integer");
    expect_open_fails(dir, "{\"w\":{\"dtype\":\"F32\",\"shape\":[1e300],\"data_offsets\":[0,8]}}", 8,
                      KILN_ERR_FORMAT, "not a non-negative integer");
    expect_open_fails(dir, "{\"w\":{\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]}}", 8,
                      KILN_ERR_FORMAT, "shape is missing or not an array");
    expect_open_fails(dir, "{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8, KILN_ERR_FORMAT,
                      "shape is missing");
    expect_open_fails(dir,
                      "{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],"
                      "\"data_offsets\":[0,1]}}",
                      1, KILN_ERR_FORMAT, "more than 8 dimensions");
    test_rmrf(dir);
}

TEST(test_bad_offsets) {
    char dir[4096];
    test_tmpdir(dir, sizeof dir, "st");
    /* out of range: 16 bytes claimed, 8 present */
    expect_open_fails(dir, "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8,
                      KILN_ERR_FORMAT, "run past the data section (8 bytes)");
    expect_open_fails(dir, "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 7,
                      KILN_ERR_FORMAT, "data section");
    expect_open_fails(dir,
                      "{\"w\":{\"dtype\":\"U8\",\"shape\":[1],"
                      "\"data_offsets\":[9007199254740991,9007199254740992]}}",
                      1, KILN_ERR_FORMAT, "data section");
    /* malformed arrays */
    expect_open_fails(dir, "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4,
                      KILN_ERR_FORMAT, "data_offsets must be an array of 2");
    expect_open_fails(dir, "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 8,
                      KILN_ERR_FORMAT, "data_offsets must be an array of 2");
    expect_open_fails(dir, "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 4,
                      KILN_ERR_FORMAT, "data_offsets must be");
    expect_open_fails(dir, "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4.5]}}", 8,
                      KILN_ERR_FORMAT, "data_offsets must be");
    expect_open_fails(dir, "{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, KILN_ERR_FORMAT,
                      "data_offsets must be");
    test_rmrf(dir);
}

TEST(test_begin_after_end) {
    char dir[4096];
    test_tmpdir(dir, sizeof dir, "st");
    expect_open_fails(dir, "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8,
                      KILN_ERR_FORMAT, "tensor 'w': data_offsets [8, 0] begin after end");
    test_rmrf(dir);
}

TEST(test_overlap) {
    char dir[4096];
    test_tmpdir(dir, sizeof dir, "st");
    expect_open_fails(dir,
                      "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                      12, KILN_ERR_FORMAT, "overlap");
    CHECK(strstr(kiln_last_error(), "'a'") && strstr(kiln_last_error(), "'b'"));
    /* same range twice; and a short range inside a long one, listed first */
    expect_open_fails(dir,
                      "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                      "\"b\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
                      8, KILN_ERR_FORMAT, "overlap");
    expect_open_fails(dir,
                      "{\"in\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[30,31]},"
                      "\"mid\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[8,12]},"
                      "\"long\":{\"dtype\":\"U8\",\"shape\":[32],\"data_offsets\":[0,32]}}",
                      32, KILN_ERR_FORMAT, "overlap");
    /* a range hidden behind a long earlier one is still caught */
    expect_open_fails(dir,
                      "{\"long\":{\"dtype\":\"U8\",\"shape\":[32],\"data_offsets\":[0,32]},"
                      "\"x\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[4,6]},"
                      "\"y\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[20,22]}}",
                      32, KILN_ERR_FORMAT, "overlap");
    /* touching ranges and gaps are fine */
    char path[4200];
    join(path, sizeof path, dir, "ok.safetensors");
    write_raw(path,
              "{\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[4,8]},"
              "\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
              "\"c\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[12,14]}}",
              16);
    st_file *f = NULL;
    CHECK_OK(st_open(path, &f));
    if (f) {
        CHECK(!strcmp(st_at(f, 0)->name, "b")); /* header order kept */
        CHECK(((const uint8_t *)st_find(f, "b")->data)[0] == 4);
        CHECK(((const uint8_t *)st_find(f, "c")->data)[1] == 13);
        st_close(f);
    }
    test_rmrf(dir);
}

TEST(test_size_mismatch) {
    char dir[4096];
    test_tmpdir(dir, sizeof dir, "st");
    char path[4200];
    join(path, sizeof path, dir, "bad.safetensors");
    expect_open_fails(dir, "{\"a.weight\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,12]}}",
                      24, KILN_ERR_FORMAT, "");
    char want[4400];
    snprintf(want, sizeof want,
             "%s: tensor 'a.weight': data_offsets [0, 12] hold 12 bytes but shape [2, 3] of F32 "
             "needs 24",
             path);
    CHECK_MSG(!strcmp(kiln_last_error(), want), "got \"%s\"", kiln_last_error());
    expect_open_fails(dir, "{\"s\":{\"dtype\":\"F16\",\"shape\":[],\"data_offsets\":[0,4]}}", 4,
                      KILN_ERR_FORMAT, "hold 4 bytes but shape [] of F16 needs 2");
    test_rmrf(dir);
}

TEST(test_shape_overflow) {
    char dir[4096];
    test_tmpdir(dir, sizeof dir, "st");
    expect_open_fails(dir,
                      "{\"h\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4],"
                      "\"data_offsets\":[0,0]}}",
                      0, KILN_ERR_FORMAT, "overflows");
    CHECK(strstr(kiln_last_error(), "shape [4294967296, 4294967296, 4] of F32"));
    /* element count fits but the byte count does not */
    expect_open_fails(dir,
                      "{\"h\":{\"dtype\":\"F64\",\"shape\":[4611686018427387904],"
                      "\"data_offsets\":[0,0]}}",
                      0, KILN_ERR_FORMAT, "not a non-negative integer"); /* > 2^53: inexact */
    expect_open_fails(dir,
                      "{\"h\":{\"dtype\":\"F64\",\"shape\":[9007199254740992, 4096],"
                      "\"data_offsets\":[0,0]}}",
                      0, KILN_ERR_FORMAT, "overflows");
    test_rmrf(dir);
}

TEST(test_bad_metadata) {
    char dir[4096];
    test_tmpdir(dir, sizeof dir, "st");
    expect_open_fails(dir, "{\"__metadata__\":{\"a\":\"x\",\"b\":1}}", 0, KILN_ERR_FORMAT,
                      "__metadata__ value of 'b' is not a string");
    expect_open_fails(dir, "{\"__metadata__\":[\"a\"]}", 0, KILN_ERR_FORMAT,
                      "__metadata__ is not a JSON object");
    expect_open_fails(dir, "{\"__metadata__\":{\"a\":{}}}", 0, KILN_ERR_FORMAT, "not a string");
    expect_open_fails(dir, "{\"__metadata__\":{\"a\":\"1\",\"a\":\"2\"}}", 0, KILN_ERR_FORMAT,
                      "key 'a' appears twice");
    expect_open_fails(dir, "{\"__metadata__\":{},\"__metadata__\":{}}", 0, KILN_ERR_FORMAT,
                      "__metadata__ appears twice");
    test_rmrf(dir);
}

TEST(test_duplicate_names) {
    char dir[4096];
    test_tmpdir(dir, sizeof dir, "st");
    expect_open_fails(dir,
                      "{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                      "\"v\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]},"
                      "\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[2,3]}}",
                      3, KILN_ERR_FORMAT, "tensor 'w' appears twice");
    test_rmrf(dir);
}

TEST(test_missing_file) {
    char dir[4096], path[4200];
    test_tmpdir(dir, sizeof dir, "st");
    join(path, sizeof path, dir, "nothere.safetensors");
    st_file *f = (st_file *)1;
    CHECK_FAILS(st_open(path, &f), KILN_ERR_IO, "nothere.safetensors");
    CHECK(f == NULL);
    CHECK_FAILS(st_open(dir, &f), KILN_ERR_IO, "not a regular file"); /* a folder */
    test_rmrf(dir);
}

/* Every truncation and many single-byte corruptions of a valid file: errors
 * only, never a crash or an out-of-bounds read (run under ASan). */
TEST(test_corruption_never_crashes) {
    char dir[4096], path[4200], bad[4200];
    test_tmpdir(dir, sizeof dir, "st");
    join(path, sizeof path, dir, "good.safetensors");
    join(bad, sizeof bad, dir, "bad.safetensors");
    float w[6] = {1, 2, 3, 4, 5, 6};
    uint16_t h[3] = {1, 2, 3};
    const int64_t s_w[2] = {2, 3}, s_h[1] = {3};
    st_tensor ts[2] = {mk("w", KILN_F32, 2, s_w, w), mk("h", KILN_F16, 1, s_h, h)};
    const char *meta[] = {"k", "v"};
    CHECK_OK(st_write(path, ts, 2, meta, 1));
    char *raw = NULL;
    size_t n = 0;
    CHECK_OK(kb_read_file(path, &raw, &n));
    if (!raw) goto done;
    int trunc_failures = 0;
    for (size_t len = 0; len < n; len++) {
        write_bytes(bad, raw, len);
        st_file *f = NULL;
        if (st_open(bad, &f) != KILN_OK) trunc_failures++;
        st_close(f);
    }
    CHECK(trunc_failures == (int)n); /* the last tensor ends the file */
    static const uint8_t vals[] = {0, '"', '{', '}', '[', ']', ',', ':', '-', '9', 0xff, ' '};
    size_t hdr_end = 8 + (size_t)header_len_of(path);
    for (size_t at = 0; at < hdr_end; at++) {
        for (size_t v = 0; v < sizeof vals; v++) {
            char saved = raw[at];
            raw[at] = (char)vals[v];
            write_bytes(bad, raw, n);
            raw[at] = saved;
            st_file *f = NULL;
            if (st_open(bad, &f) == KILN_OK) {
                /* whatever was accepted must be self-consistent */
                for (size_t i = 0; i < st_count(f); i++) {
                    const st_tensor *t = st_at(f, i);
                    CHECK(t->nbytes == (size_t)st_numel(t) * kiln_dtype_size(t->dtype));
                    CHECK(st_find(f, t->name) == t);
                }
            }
            st_close(f);
        }
    }
done:
    free(raw);
    test_rmrf(dir);
}

/* ---- writer failures ------------------------------------------------------------ */

TEST(test_writer_failures) {
    char dir[4096], path[4200], tmp[4300];
    test_tmpdir(dir, sizeof dir, "st");
    float w[4] = {1, 2, 3, 4};
    const int64_t s[1] = {4};
    st_tensor t = mk("w", KILN_F32, 1, s, w);

    join(path, sizeof path, dir, "no/such/folder/x.safetensors");
    CHECK_FAILS(st_write(path, &t, 1, NULL, 0), KILN_ERR_IO, "no/such/folder/x.safetensors");
    CHECK(!kb_is_file(path));

    join(path, sizeof path, dir, "x.safetensors");
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    st_tensor bad = t;
    bad.nbytes = 12;
    CHECK_FAILS(st_write(path, &bad, 1, NULL, 0), KILN_ERR_INVALID_ARG,
                "tensor 'w': nbytes is 12 but shape [4] of F32 needs 16");
    bad = t;
    bad.dtype = KILN_DTYPE_INVALID;
    CHECK_FAILS(st_write(path, &bad, 1, NULL, 0), KILN_ERR_INVALID_ARG, "unknown dtype");
    bad = t;
    bad.shape[0] = -4;
    CHECK_FAILS(st_write(path, &bad, 1, NULL, 0), KILN_ERR_INVALID_ARG, "bad shape [-4]");
    bad = t;
    bad.ndim = KILN_MAX_DIMS + 1;
    CHECK_FAILS(st_write(path, &bad, 1, NULL, 0), KILN_ERR_INVALID_ARG, "dimensions");
    bad = t;
    bad.data = NULL;
    CHECK_FAILS(st_write(path, &bad, 1, NULL, 0), KILN_ERR_INVALID_ARG, "has no data");
    bad = t;
    bad.name = "__metadata__";
    CHECK_FAILS(st_write(path, &bad, 1, NULL, 0), KILN_ERR_INVALID_ARG, "not a tensor name");
    st_tensor two[2] = {t, t};
    CHECK_FAILS(st_write(path, two, 2, NULL, 0), KILN_ERR_INVALID_ARG, "tensor 'w' given twice");
    const char *meta[] = {"k", "1", "k", "2"};
    CHECK_FAILS(st_write(path, &t, 1, meta, 2), KILN_ERR_INVALID_ARG, "metadata key 'k' given twice");
    CHECK(!kb_is_file(path));
    CHECK(!kb_is_file(tmp));

    /* a failed write must not disturb an existing file */
    CHECK_OK(st_write(path, &t, 1, NULL, 0));
    CHECK_FAILS(st_write(path, two, 2, NULL, 0), KILN_ERR_INVALID_ARG, "given twice");
    st_file *f = NULL;
    CHECK_OK(st_open(path, &f));
    if (f) {
        CHECK(st_count(f) == 1 && same_tensor(st_at(f, 0), &t));
        st_close(f);
    }
    CHECK(!kb_is_file(tmp));
    test_rmrf(dir);
}

/* st_write_stream: the bytes st_write writes from the same values, one
 * tensor at a time from fill; a fill that fails leaves nothing at the path
 * and an existing file as it was */
typedef struct {
    const st_tensor *t;
    size_t fail_at; /* tensor index whose fill fails; (size_t)-1: none */
} stream_src;

static kiln_status fill_from(void *user, size_t i, void *buf) {
    const stream_src *s = user;
    if (i == s->fail_at) return kb_fail(KILN_ERR_IO, "fill %zu failed on purpose", i);
    memcpy(buf, s->t[i].data, s->t[i].nbytes);
    return KILN_OK;
}

TEST(test_stream_writer) {
    char dir[4096], a[4200], b[4200], tmp[4300];
    test_tmpdir(dir, sizeof dir, "st");
    float w[6] = {1, 2, 3, 4, 5, 6};
    uint16_t h[3] = {0x3f80, 0x4000, 0x4040};
    const int64_t s6[2] = {2, 3}, s3[1] = {3};
    st_tensor t[2] = {mk("w", KILN_F32, 2, s6, w), mk("h", KILN_BF16, 1, s3, h)};
    const char *meta[] = {"format", "pt"};
    join(a, sizeof a, dir, "a.safetensors");
    join(b, sizeof b, dir, "b.safetensors");
    CHECK_OK(st_write(a, t, 2, meta, 1));
    st_tensor hdr[2] = {t[0], t[1]};
    hdr[0].data = hdr[1].data = NULL; /* the stream writer needs the shapes only */
    stream_src src = {t, (size_t)-1};
    CHECK_OK(st_write_stream(b, hdr, 2, meta, 1, fill_from, &src));
    char *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    CHECK_OK(kb_read_file(a, &x, &nx));
    CHECK_OK(kb_read_file(b, &y, &ny));
    CHECK(x && y && nx == ny && !memcmp(x, y, nx));
    free(x);
    src.fail_at = 1;
    CHECK_FAILS(st_write_stream(b, hdr, 2, meta, 1, fill_from, &src), KILN_ERR_IO, "fill 1 failed on purpose");
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", b, (long)getpid());
    CHECK(!kb_is_file(tmp));
    char *z = NULL;
    size_t nz = 0;
    CHECK_OK(kb_read_file(b, &z, &nz)); /* the earlier file, untouched */
    CHECK(z && y && nz == ny && !memcmp(z, y, nz));
    free(y);
    free(z);
    CHECK_FAILS(st_write_stream(b, hdr, 2, meta, 1, NULL, NULL), KILN_ERR_INVALID_ARG, "a fill function is required");
    test_rmrf(dir);
}

/* ---- sets ------------------------------------------------------------------------- */

static void write_shards(const char *dir, const char *weight_map) {
    char p[4200];
    float a[2] = {1, 2}, b[3] = {3, 4, 5}, c[1] = {6};
    const int64_t s2[1] = {2}, s3[1] = {3}, s1[1] = {1};
    st_tensor t1[2] = {mk("a", KILN_F32, 1, s2, a), mk("b", KILN_F32, 1, s3, b)};
    st_tensor t2[1] = {mk("c", KILN_F32, 1, s1, c)};
    join(p, sizeof p, dir, "model-00001-of-00002.safetensors");
    CHECK_OK(st_write(p, t1, 2, NULL, 0));
    join(p, sizeof p, dir, "model-00002-of-00002.safetensors");
    CHECK_OK(st_write(p, t2, 1, NULL, 0));
    char idx[4096];
    snprintf(idx, sizeof idx, "{\"metadata\": {\"total_size\": 24}, \"weight_map\": %s}",
             weight_map);
    join(p, sizeof p, dir, "model.safetensors.index.json");
    write_bytes(p, idx, strlen(idx));
}

TEST(test_set_sharded) {
    char dir[4096], idx[4200];
    test_tmpdir(dir, sizeof dir, "st");
    write_shards(dir, "{\"c\": \"model-00002-of-00002.safetensors\","
                      " \"a\": \"model-00001-of-00002.safetensors\","
                      " \"b\": \"model-00001-of-00002.safetensors\"}");
    join(idx, sizeof idx, dir, "model.safetensors.index.json");
    st_set *s = NULL;
    CHECK_OK(st_set_open(idx, &s));
    if (s) {
        CHECK(st_set_nfiles(s) == 2);
        CHECK(st_set_count(s) == 3);
        const st_tensor *a = st_set_find(s, "a"), *c = st_set_find(s, "c");
        CHECK(a && a->nbytes == 8 && ((const float *)a->data)[1] == 2.0f);
        CHECK(c && c->nbytes == 4 && ((const float *)c->data)[0] == 6.0f);
        CHECK(st_set_find(s, "b") && st_set_find(s, "zz") == NULL);
        int64_t bytes = 0;
        for (size_t i = 0; i < st_set_nfiles(s); i++) bytes += (int64_t)st_file_size(st_set_file(s, i));
        CHECK(bytes == st_set_bytes(s) && bytes > 0);
        CHECK(strstr(st_path(st_set_file(s, 0)), "model-00001-of-00002"));
        for (size_t i = 0; i < st_set_count(s); i++)
            CHECK(st_set_find(s, st_set_at(s, i)->name) == st_set_at(s, i));
        CHECK(st_set_at(s, 3) == NULL && st_set_file(s, 2) == NULL);
        st_set_close(s);
    }

    /* a plain file through the same interface */
    char one[4200];
    join(one, sizeof one, dir, "model-00001-of-00002.safetensors");
    CHECK_OK(st_set_open(one, &s));
    if (s) {
        CHECK(st_set_nfiles(s) == 1 && st_set_count(s) == 2 && st_set_find(s, "b"));
        CHECK(st_set_bytes(s) == (int64_t)st_file_size(st_set_file(s, 0)));
        st_set_close(s);
    }
    test_rmrf(dir);
}

TEST(test_set_errors) {
    char dir[4096], idx[4200];
    test_tmpdir(dir, sizeof dir, "st");
    join(idx, sizeof idx, dir, "model.safetensors.index.json");
    st_set *s = (st_set *)1;

    write_shards(dir, "{\"a\": \"model-00001-of-00002.safetensors\","
                      " \"d\": \"model-00001-of-00002.safetensors\","
                      " \"c\": \"model-00001-of-00002.safetensors\"}");
    CHECK_FAILS(st_set_open(idx, &s), KILN_ERR_MISSING, "'d' (model-00001-of-00002.safetensors)");
    CHECK(strstr(kiln_last_error(), "'c'") && strstr(kiln_last_error(), "2 tensors"));
    CHECK(s == NULL);

    write_shards(dir, "{\"a\": \"model-00001-of-00002.safetensors\","
                      " \"x\": \"model-00009-of-00002.safetensors\"}");
    CHECK_FAILS(st_set_open(idx, &s), KILN_ERR_IO, "model-00009-of-00002.safetensors");
    CHECK(strstr(kiln_last_error(), "index.json"));

    write_shards(dir, "{\"a\": \"model-00001-of-00002.safetensors\", \"b\": 3}");
    CHECK_FAILS(st_set_open(idx, &s), KILN_ERR_FORMAT, "weight_map entry 'b' is not a string");
    write_shards(dir, "[]");
    CHECK_FAILS(st_set_open(idx, &s), KILN_ERR_FORMAT, "weight_map");
    write_shards(dir, "{\"a\": \"model-00001-of-00002.safetensors\","
                      " \"a\": \"model-00001-of-00002.safetensors\"}");
    CHECK_FAILS(st_set_open(idx, &s), KILN_ERR_FORMAT, "'a' appears twice in the weight map");
    write_bytes(idx, "{\"weight_map\": {", 16);
    CHECK_FAILS(st_set_open(idx, &s), KILN_ERR_FORMAT, "not valid JSON");

    /* a name in two shards, whatever the weight map says */
    char p[4200];
    float z[2] = {0, 0};
    const int64_t s2[1] = {2};
    st_tensor dup[2] = {mk("c", KILN_F32, 1, s2, z), mk("a", KILN_F32, 1, s2, z)};
    write_shards(dir, "{\"a\": \"model-00001-of-00002.safetensors\","
                      " \"c\": \"model-00002-of-00002.safetensors\"}");
    join(p, sizeof p, dir, "model-00002-of-00002.safetensors");
    CHECK_OK(st_write(p, dup, 2, NULL, 0));
    CHECK_FAILS(st_set_open(idx, &s), KILN_ERR_FORMAT, "tensor 'a' is in both");

    char none[4200];
    join(none, sizeof none, dir, "absent.index.json");
    CHECK_FAILS(st_set_open(none, &s), KILN_ERR_IO, "absent.index.json");
    CHECK(s == NULL);
    test_rmrf(dir);
}

/* A shard is a file beside the index, by a plain name (issue 42): an index
 * naming ../../../etc/passwd, an absolute path, a folder, or a symbolic link
 * that leads out of the folder is refused naming the shard, before any file
 * opens; a file that is not safetensors is said so, never its bytes as a number. */
TEST(test_set_shards_stay_in_their_folder) {
    char dir[4096], idx[4200], outside[4200], p[4200];
    test_tmpdir(dir, sizeof dir, "st");
    join(idx, sizeof idx, dir, "model.safetensors.index.json");
    st_set *s = (st_set *)1;
    static const char *const bad[] = {"../../../etc/passwd", "/etc/passwd", "sub/model.safetensors",
                                      "..", ".", "", "model.bin", "../model-00001-of-00002.safetensors"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char wm[512];
        snprintf(wm, sizeof wm, "{\"a\": \"model-00001-of-00002.safetensors\", \"x\": \"%s\"}", bad[i]);
        write_shards(dir, wm);
        char want[300];
        snprintf(want, sizeof want, "shard \"%s\" is not the name of a .safetensors file beside the index", bad[i]);
        CHECK_FAILS(st_set_open(idx, &s), KILN_ERR_FORMAT, want);
        CHECK(s == NULL && !strstr(kiln_last_error(), "header length"));
    }
    /* a symbolic link out of the folder, to a valid checkpoint: refused; one inside it: fine */
    char odir[4096];
    test_tmpdir(odir, sizeof odir, "st-out");
    join(outside, sizeof outside, odir, "other.safetensors");
    float v[2] = {7, 8};
    const int64_t s2[1] = {2};
    st_tensor t[1] = {mk("x", KILN_F32, 1, s2, v)};
    CHECK_OK(st_write(outside, t, 1, NULL, 0));
    write_shards(dir, "{\"a\": \"model-00001-of-00002.safetensors\", \"x\": \"link.safetensors\"}");
    join(p, sizeof p, dir, "link.safetensors");
    CHECK(symlink(outside, p) == 0);
    CHECK_FAILS(st_set_open(idx, &s), KILN_ERR_FORMAT, "shard \"link.safetensors\" is a symbolic link that leads out");
    CHECK(unlink(p) == 0);
    char inside[4200];
    join(inside, sizeof inside, dir, "real.safetensors");
    CHECK_OK(st_write(inside, t, 1, NULL, 0));
    CHECK(symlink("real.safetensors", p) == 0);
    CHECK_OK(st_set_open(idx, &s));
    if (s) st_set_close(s);
    /* a shard that is another kind of file: said so, not read as a number */
    write_shards(dir, "{\"a\": \"model-00001-of-00002.safetensors\", \"x\": \"text.safetensors\"}");
    join(p, sizeof p, dir, "text.safetensors");
    write_bytes(p, "root:x:0:0:root:/root:/bin/bash\n", 32);
    s = (st_set *)1;
    CHECK_FAILS(st_set_open(idx, &s), KILN_ERR_FORMAT, "is not a safetensors file (it looks like a text file)");
    CHECK(!strstr(kiln_last_error(), "header length"));
    test_rmrf(dir);
    test_rmrf(odir);
}

/* ~2000 tensors, as in a real checkpoint: every one found by name. */
TEST(test_set_many) {
    char dir[4096], path[4200];
    test_tmpdir(dir, sizeof dir, "st");
    join(path, sizeof path, dir, "many.safetensors");
    enum { N = 2000 };
    st_tensor *ts = calloc(N, sizeof *ts);
    char (*names)[32] = calloc(N, sizeof *names);
    int32_t *vals = calloc(N, sizeof *vals);
    const int64_t s1[1] = {1};
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "blocks.%d.w%d", (i * 7919) % N, i);
        vals[i] = i;
        ts[i] = mk(names[i], KILN_I32, 1, s1, &vals[i]);
    }
    CHECK_OK(st_write(path, ts, N, NULL, 0));
    st_set *s = NULL;
    CHECK_OK(st_set_open(path, &s));
    if (s) {
        CHECK(st_set_count(s) == N);
        int bad = 0;
        for (int i = 0; i < N; i++) {
            const st_tensor *t = st_set_find(s, names[i]);
            int32_t v;
            if (!t) {
                bad++;
                continue;
            }
            memcpy(&v, t->data, 4);
            if (v != i || st_set_at(s, (size_t)i) != t) bad++;
        }
        CHECK_MSG(bad == 0, "%d lookups failed", bad);
        st_set_close(s);
    }
    free(ts);
    free(names);
    free(vals);
    test_rmrf(dir);
}

int main(void) {
    RUN(test_round_trip);
    RUN(test_zero_element);
    RUN(test_short_file);
    RUN(test_header_past_end);
    RUN(test_header_too_big);
    RUN(test_bad_json);
    RUN(test_not_object);
    RUN(test_unknown_dtype);
    RUN(test_bad_shape);
    RUN(test_bad_offsets);
    RUN(test_begin_after_end);
    RUN(test_overlap);
    RUN(test_size_mismatch);
    RUN(test_shape_overflow);
    RUN(test_bad_metadata);
    RUN(test_duplicate_names);
    RUN(test_stream_writer);
    RUN(test_missing_file);
    RUN(test_corruption_never_crashes);
    RUN(test_writer_failures);
    RUN(test_set_sharded);
    RUN(test_header_of_a_million_entries);
    RUN(test_set_errors);
    RUN(test_set_shards_stay_in_their_folder);
    RUN(test_set_many);
    return TEST_SUMMARY();
}
