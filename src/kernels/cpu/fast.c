/* fast.c - the fast CPU backend: GEMMs on weights packed once at conversion
 * (bf16, int8 and fp8 on kiln's AMX GEMM, gemm_amx.c, where the CPU has AMX;
 * f32 on kiln's AVX2 GEMM, gemm_avx2.c, on the avx2 class; oneDNN's matmul
 * for f32 and on CPUs without AMX otherwise), attention (the fused
 * kernels: AMX, attn_amx.c, else fp16, attn_f16.c, for head size 64; else
 * AVX512-BF16, attn_bf16.c, for multiples of 64; else oneDNN matmuls per
 * strip), and fused
 * elementwise kernels.
 *
 * Primitives are created once per shape and kept (a small table under a
 * lock); scratch buffers grow per thread and are reused, so a steady state
 * forward allocates nothing here. GEMM threads: KILN_GEMM_THREADS, default
 * all threads (see gemm_threads). Hot loops are compiled per CPU
 * (target_clones). */
#include "base/base.h"
#include "kernels/cpu/attn_amx.h"
#include "kernels/cpu/attn_bf16.h"
#include "kernels/cpu/attn_ex.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/attn_f16.h"
#include "kernels/cpu/conv.h"
#include "kernels/cpu/gemm_amx.h"
#include "kernels/cpu/gemm_avx2.h"
#include "kernels/cpu/gemm_f16.h"
#include "kernels/cpu/host_ops.h"
#include "kernels/cpu/onednn.h"
#include "kernels/cpu/vec.h"
#include "kernels/kernels.h"
#include "tensor/dtype.h"
#include "tensor/quant.h"

#include <math.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* ---- oneDNN engine, primitive table ------------------------------------------- */

static dnnl_engine_t g_eng;
static int g_ok;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

static void init_engine(void) {
    kk_cpu_class(); /* KILN_MAX_ISA reaches oneDNN before its first use */
    if (dnnl_engine_create(&g_eng, dnnl_cpu, 0) != dnnl_success) return;
    g_ok = 1;
}

static int engine(void) {
    pthread_once(&g_once, init_engine);
    return g_ok;
}

/* ---- per thread: a stream (attention runs matmuls from several threads at
 * once) and the work buffers, freed when the thread exits (a pool's
 * threads, a server's request threads) ---- */

typedef struct {
    dnnl_stream_t stream;
    void *buf[KK_SCRATCH_SLOTS];
    size_t cap[KK_SCRATCH_SLOTS];
} thread_state;

static _Thread_local thread_state *t_state;
static pthread_key_t g_state_key;
static pthread_once_t g_state_once = PTHREAD_ONCE_INIT;

static void thread_exit(void *arg) {
    thread_state *ts = arg;
    for (int i = 0; i < KK_SCRATCH_SLOTS; i++) kb_free_aligned(ts->buf[i]);
    if (ts->stream) dnnl_stream_destroy(ts->stream);
    free(ts);
    t_state = NULL;
}

static void make_state_key(void) {
    if (pthread_key_create(&g_state_key, thread_exit)) abort(); /* only fails when the process is out of keys */
}

/* NULL when out of memory */
static thread_state *tstate(void) {
    if (!t_state) {
        pthread_once(&g_state_once, make_state_key);
        thread_state *ts = calloc(1, sizeof *ts);
        if (!ts) return NULL;
        pthread_setspecific(g_state_key, ts);
        t_state = ts;
    }
    return t_state;
}

static dnnl_stream_t stream(void) {
    thread_state *ts = tstate();
    if (ts && !ts->stream && dnnl_stream_create(&ts->stream, g_eng, dnnl_stream_default_flags) != dnnl_success)
        ts->stream = NULL;
    return ts ? ts->stream : NULL;
}

dnnl_engine_t kk_dnnl_engine(void) { return engine() ? g_eng : NULL; }
dnnl_stream_t kk_dnnl_stream(void) { return engine() ? stream() : NULL; }

static dnnl_data_type_t dnnl_dt(kiln_dtype t) { return t == KILN_BF16 ? dnnl_bf16 : t == KILN_I8 ? dnnl_s8 : dnnl_f32; }

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }


/* Isolated AMX GEMMs sometimes ran faster on one thread than on two on the
 * 2-vCPU machines measured (bench_kernels), but whole forwards were faster
 * with both (docs/PERFORMANCE.md), so all threads is the default and
 * KILN_GEMM_THREADS overrides it. */
static int gemm_threads(kiln_dtype dt) {
    const char *e = getenv("KILN_GEMM_THREADS");
    int n = e ? atoi(e) : 0;
    (void)dt;
    return n >= 1 ? n : kiln_get_threads();
}

/* matmul src [m,k] (strides sa) x wei [k,n] (md) -> dst [m,n] f32 (strides sd) */
typedef struct {
    int64_t m, k, n, sa, sd;
    int dt, act, bias, wkind; /* wkind 0: packed weights md, 1: "ba" strided, 2: "ab" strided */
    int ydt;                  /* destination type; 0 means f32 */
    int64_t sw;
    /* quantized weights (packed, wkind 0), dequantized in post-ops, bias and
     * activation after them:
     *   Q_I8  s8 x s8 as a 3-D matmul [1,m,k] x [1,k,n]: per channel scales
     *         [1,1,n] then per token scales [1,m,1] (binary muls; in 3-D the
     *         per-row broadcast keeps oneDNN 2.6 on its AMX/VNNI kernels)
     *   Q_F8  bf16 x bf16 (weights decoded from e4m3), per channel scales [1,n] */
    int q;
    dnnl_primitive_t prim;
} prim_entry;

enum { Q_NONE = 0, Q_I8 = 1, Q_F8 = 2 };

static prim_entry *g_prims;
static size_t g_nprims, g_capprims;

/* The packed weights md for W [n outputs, k inputs] (B = W^T of dims {k, n});
 * I8: the weights of the 3-D s8 x s8 matmul, dims {1, k, n}. */
static int packed_md(int64_t n, int64_t k, kiln_dtype dt, dnnl_memory_desc_t *out) {
    dnnl_memory_desc_t a, b, c;
    if (dt == KILN_I8) {
        dnnl_dims_t da = {1, 1024, k}, db = {1, k, n}, dc = {1, 1024, n};
        if (dnnl_memory_desc_init_by_tag(&a, 3, da, dnnl_s8, dnnl_abc) ||
            dnnl_memory_desc_init_by_tag(&b, 3, db, dnnl_s8, dnnl_format_tag_any) ||
            dnnl_memory_desc_init_by_tag(&c, 3, dc, dnnl_f32, dnnl_abc))
            return 0;
    } else {
        dnnl_dims_t da = {1024, k}, db = {k, n}, dc = {1024, n};
        if (dnnl_memory_desc_init_by_tag(&a, 2, da, dnnl_dt(dt), dnnl_ab) ||
            dnnl_memory_desc_init_by_tag(&b, 2, db, dnnl_dt(dt), dnnl_format_tag_any) ||
            dnnl_memory_desc_init_by_tag(&c, 2, dc, dnnl_f32, dnnl_ab))
            return 0;
    }
    dnnl_matmul_desc_t md;
    dnnl_primitive_desc_t pd;
    if (dnnl_matmul_desc_init(&md, &a, &b, NULL, &c) || dnnl_primitive_desc_create(&pd, &md, NULL, g_eng, NULL))
        return 0;
    *out = *dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    dnnl_primitive_desc_destroy(pd);
    return 1;
}

static dnnl_primitive_t get_prim(const prim_entry *key) {
    pthread_mutex_lock(&g_lock);
    for (size_t i = 0; i < g_nprims; i++) {
        prim_entry *p = &g_prims[i];
        if (p->m == key->m && p->k == key->k && p->n == key->n && p->sa == key->sa && p->sd == key->sd &&
            p->dt == key->dt && p->act == key->act && p->bias == key->bias && p->wkind == key->wkind &&
            p->sw == key->sw && p->ydt == key->ydt && p->q == key->q) {
            pthread_mutex_unlock(&g_lock);
            return p->prim;
        }
    }
    double t0 = kb_now();
    dnnl_primitive_t prim = NULL;
    dnnl_memory_desc_t a, b, c, bias, col, row;
    dnnl_data_type_t ydt = key->ydt ? (dnnl_data_type_t)key->ydt : dnnl_f32;
    int ok;
    if (key->q == Q_I8) {
        dnnl_dims_t da = {1, key->m, key->k}, dc = {1, key->m, key->n}, dcol = {1, 1, key->n}, drow = {1, key->m, 1};
        dnnl_dims_t sa = {key->m * key->sa, key->sa, 1}, sc = {key->m * key->sd, key->sd, 1};
        ok = !dnnl_memory_desc_init_by_strides(&a, 3, da, dnnl_s8, sa) &&
             !dnnl_memory_desc_init_by_strides(&c, 3, dc, ydt, sc) &&
             !dnnl_memory_desc_init_by_tag(&col, 3, dcol, dnnl_f32, dnnl_abc) &&
             !dnnl_memory_desc_init_by_tag(&row, 3, drow, dnnl_f32, dnnl_abc);
    } else {
        dnnl_dims_t da = {key->m, key->k}, dc = {key->m, key->n}, dbias = {1, key->n};
        dnnl_dims_t sa = {key->sa, 1}, sc = {key->sd, 1};
        ok = !dnnl_memory_desc_init_by_strides(&a, 2, da, (dnnl_data_type_t)key->dt, sa) &&
             !dnnl_memory_desc_init_by_strides(&c, 2, dc, ydt, sc) &&
             !dnnl_memory_desc_init_by_tag(&bias, 2, dbias, dnnl_f32, dnnl_ab);
        col = bias;
    }
    if (ok && key->wkind == 0) {
        ok = packed_md(key->n, key->k, key->q == Q_I8 ? KILN_I8 : key->dt == dnnl_bf16 ? KILN_BF16 : KILN_F32, &b);
    } else if (ok) {
        dnnl_dims_t db = {key->k, key->n};
        dnnl_dims_t sb = {key->wkind == 1 ? 1 : key->sw, key->wkind == 1 ? key->sw : 1};
        ok = !dnnl_memory_desc_init_by_strides(&b, 2, db, (dnnl_data_type_t)key->dt, sb);
    }
    dnnl_matmul_desc_t md;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    if (ok) ok = !dnnl_matmul_desc_init(&md, &a, &b, key->bias && !key->q ? &bias : NULL, &c);
    if (ok) ok = !dnnl_primitive_attr_create(&attr);
    /* a scratchpad per call site and thread: the same primitive runs from
     * several threads at once (attention) */
    if (ok) ok = !dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
    if (ok && (key->act == KK_ACT_GELU_TANH || key->q)) {
        ok = !dnnl_post_ops_create(&po);
        /* quantized: dequantize, then bias, then the activation */
        if (ok && key->q) ok = !dnnl_post_ops_append_binary(po, dnnl_binary_mul, &col);
        if (ok && key->q == Q_I8) ok = !dnnl_post_ops_append_binary(po, dnnl_binary_mul, &row);
        if (ok && key->q && key->bias) ok = !dnnl_post_ops_append_binary(po, dnnl_binary_add, &col);
        if (ok && key->act == KK_ACT_GELU_TANH) ok = !dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_gelu_tanh, 0, 0);
        if (ok) ok = !dnnl_primitive_attr_set_post_ops(attr, po);
    }
    if (ok) ok = !dnnl_primitive_desc_create(&pd, &md, attr, g_eng, NULL);
    if (ok && key->q) {
        const char *impl = "";
        dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
        kb_log(KILN_LOG_DEBUG, "quantized matmul %lldx%lldx%lld (%s): %s", (long long)key->m, (long long)key->k,
               (long long)key->n, key->q == Q_I8 ? "int8" : "fp8", impl);
    }
    if (ok) ok = !dnnl_primitive_create(&prim, pd);
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (po) dnnl_post_ops_destroy(po);
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (ok && g_nprims == g_capprims) {
        size_t cap = g_capprims ? g_capprims * 2 : 64;
        prim_entry *np = realloc(g_prims, cap * sizeof *np);
        if (np) {
            g_prims = np;
            g_capprims = cap;
        }
    }
    if (ok && g_nprims < g_capprims) {
        g_prims[g_nprims] = *key;
        g_prims[g_nprims++].prim = prim;
    } else if (!ok) {
        prim = NULL;
    }
    pthread_mutex_unlock(&g_lock);
    kb_ledger_add("onednn_create", kb_now() - t0, "matmul");
    return prim;
}

static void *scratch(int slot, size_t bytes);
static void *scratch_must(int slot, size_t bytes);

/* run a matmul; data pointers may be strided views; po[i] is the source of
 * binary post-op i (quantized matmuls) */
static int run_matmul_po(const prim_entry *key, const void *src, const void *wei, const float *bias, void *dst,
                         const float *const *po, int npo) {
    dnnl_primitive_t p = get_prim(key);
    if (!p) return 0;
    const dnnl_memory_desc_t *amd, *bmd, *cmd, *biasmd;
    dnnl_primitive_desc_t pd;
    if (dnnl_primitive_get_primitive_desc(p, (const_dnnl_primitive_desc_t *)&pd)) return 0;
    amd = dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0);
    bmd = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    cmd = dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0);
    biasmd = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 1);
    /* the scratchpad first: nothing is made yet when there is no memory for it */
    const dnnl_memory_desc_t *spmd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    size_t spbytes = spmd ? dnnl_memory_desc_get_size(spmd) : 0;
    void *sp = spbytes ? scratch_must(4, spbytes) : NULL;
    if (spbytes && !sp) return 0;
    dnnl_memory_t ma, mb, mc, mbias = NULL, msp = NULL;
    if (dnnl_memory_create(&ma, amd, g_eng, (void *)src)) return 0;
    dnnl_memory_create(&mb, bmd, g_eng, (void *)wei);
    dnnl_memory_create(&mc, cmd, g_eng, dst);
    if (sp) dnnl_memory_create(&msp, spmd, g_eng, sp);
    dnnl_exec_arg_t args[8] = {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}, {DNNL_ARG_BIAS, NULL},
                               {DNNL_ARG_SCRATCHPAD, NULL}};
    int nargs = 3;
    dnnl_memory_t mpo[3] = {NULL, NULL, NULL};
    dnnl_status_t st = dnnl_success;
    for (int i = 0; i < npo && i < 3 && st == dnnl_success; i++) {
        int arg = DNNL_ARG_ATTR_MULTIPLE_POST_OP(i) | DNNL_ARG_SRC_1;
        const dnnl_memory_desc_t *pmd = dnnl_primitive_desc_query_md(pd, dnnl_query_exec_arg_md, arg);
        st = pmd ? dnnl_memory_create(&mpo[i], pmd, g_eng, (void *)po[i]) : dnnl_invalid_arguments;
        args[nargs].arg = arg;
        args[nargs++].memory = mpo[i];
    }
    if (key->bias && !key->q) {
        dnnl_memory_create(&mbias, biasmd, g_eng, (void *)bias);
        args[nargs++].memory = mbias;
    }
    if (msp) {
        args[nargs].arg = DNNL_ARG_SCRATCHPAD;
        args[nargs++].memory = msp;
    }
    dnnl_stream_t strm = st == dnnl_success ? stream() : NULL;
    if (st == dnnl_success) st = strm ? dnnl_primitive_execute(p, strm, nargs, args) : dnnl_runtime_error;
    if (strm) dnnl_stream_wait(strm);
    dnnl_memory_destroy(ma);
    dnnl_memory_destroy(mb);
    dnnl_memory_destroy(mc);
    if (mbias) dnnl_memory_destroy(mbias);
    if (msp) dnnl_memory_destroy(msp);
    for (int i = 0; i < 3; i++)
        if (mpo[i]) dnnl_memory_destroy(mpo[i]);
    return st == dnnl_success;
}

static int run_matmul(const prim_entry *key, const void *src, const void *wei, const float *bias, float *dst) {
    return run_matmul_po(key, src, wei, bias, dst, NULL, 0);
}

/* ---- packing ------------------------------------------------------------------- */

static uint64_t md_id(const dnnl_memory_desc_t *md) {
    /* only the fields that define the layout (no padding bytes) */
    XXH3_state_t *s = XXH3_createState();
    if (!s) return 0;
    XXH3_64bits_reset(s);
    XXH3_64bits_update(s, &md->ndims, sizeof md->ndims);
    XXH3_64bits_update(s, md->dims, sizeof(md->dims[0]) * (size_t)md->ndims);
    XXH3_64bits_update(s, &md->data_type, sizeof md->data_type);
    XXH3_64bits_update(s, md->padded_dims, sizeof(md->padded_dims[0]) * (size_t)md->ndims);
    XXH3_64bits_update(s, &md->format_kind, sizeof md->format_kind);
    const dnnl_blocking_desc_t *bd = &md->format_desc.blocking;
    XXH3_64bits_update(s, bd->strides, sizeof(bd->strides[0]) * (size_t)md->ndims);
    XXH3_64bits_update(s, &bd->inner_nblks, sizeof bd->inner_nblks);
    XXH3_64bits_update(s, bd->inner_blks, sizeof(bd->inner_blks[0]) * (size_t)bd->inner_nblks);
    XXH3_64bits_update(s, bd->inner_idxs, sizeof(bd->inner_idxs[0]) * (size_t)bd->inner_nblks);
    /* s8 weights may carry compensation (VNNI without AMX); hashed only when
     * present, so the f32/bf16 layout names stay what they were */
    if (md->extra.flags) {
        XXH3_64bits_update(s, &md->extra.flags, sizeof md->extra.flags);
        XXH3_64bits_update(s, &md->extra.compensation_mask, sizeof md->extra.compensation_mask);
    }
    uint64_t h = XXH3_64bits_digest(s);
    XXH3_freeState(s);
    return h;
}

/* Quantized blobs: I8 is the s8 packed md's bytes, F8_E4M3 one byte per
 * element of the BF16 packed md; both then padded to 64 bytes and followed
 * by the scales [M] f32. */
static int layout_md(int64_t M, int64_t K, kiln_dtype dt, dnnl_memory_desc_t *md, size_t *q_bytes);

/* bf16 weights take kiln's own AMX GEMM where the CPU has AMX (gemm_amx.c),
 * and so do fp8 ones: the amx32 layout with each element an e4m3 code */
static int amx_bf16(kiln_dtype dt) {
    return (dt == KILN_BF16 || dt == KILN_F8_E4M3) && engine() && kk_amx_ready();
}

/* int8 weights take the AMX GEMM's s8 products where the CPU has AMX */
static int amx_i8(kiln_dtype dt) { return dt == KILN_I8 && engine() && kk_amx_ready(); }

/* bf16 weights take kiln's fp16 GEMM where the CPU has AVX512-FP16 but no
 * AMX (gemm_f16.c: there oneDNN's bf16 kernels run at a quarter of the
 * fp16 rate) */
static int f16_bf16(kiln_dtype dt) { return dt == KILN_BF16 && engine() && !kk_amx_ready() && kk_f16_ready(); }

/* f32 weights take kiln's AVX2 GEMM on the avx2 class (gemm_avx2.c: there
 * oneDNN's f32 matmul gives a row other bits in another batch) */
static int avx2_f32(kiln_dtype dt) { return dt == KILN_F32 && engine() && kk_cpu_class() == KK_CLASS_AVX2; }

/* 1 where the AMX GEMM reads and writes KK_FMT_BLOCKED activations itself
 * for w in every call (linear_io and linear_gate_add): bf16 weights */
static int fast_blocked_io(const kk_weight *w) {
    return w && w->packed && w->packed_dtype == KILN_BF16 && amx_bf16(KILN_BF16);
}

/* y = the epilogue e of x . W^T on kiln's AMX GEMM (packed: amx32 bf16),
 * with this thread's work buffer (slot 11) */
static void amx_linear(const void *x, int x_fmt, const uint16_t *packed, int64_t M, int64_t K,
                       const kk_amx_epilogue *e, void *y, int y_fmt, int64_t rows) {
    int nt = gemm_threads(KILN_BF16);
    /* (kk_amx_linear only declines without a work buffer: this runs where AMX is ready) */
    kk_amx_linear(x, x_fmt, packed, M, K, e, y, y_fmt, rows, nt, scratch_must(11, kk_amx_work_bytes(rows, K, nt)));
}

/* y = the epilogue e of x . W^T on kiln's fp16 GEMM (packed: f16p64), with
 * this thread's work buffer (slot 11); 0 where it does not run */
static int f16_linear(const void *x, int x_fmt, const void *packed, int64_t M, int64_t K, const kk_amx_epilogue *e,
                      void *y, int y_fmt, int64_t rows) {
    int nt = gemm_threads(KILN_BF16);
    void *work = scratch_must(11, kk_f16_work_bytes(rows, K, nt));
    return work && kk_f16_linear(x, x_fmt, packed, M, K, e, y, y_fmt, rows, nt, work);
}

/* The element count of a BF16 / F8_E4M3 packed layout (padding included) */
static int packed_elems(int64_t M, int64_t K, kiln_dtype dt, size_t *n) {
    dnnl_memory_desc_t md;
    if (amx_bf16(dt)) {
        *n = kk_amx_packed_bytes(M, K) / 2;
        return 1;
    }
    if (f16_bf16(dt)) {
        *n = kk_f16_packed_bytes(M, K) / 2;
        return 1;
    }
    if (!layout_md(M, K, dt, &md, n)) return 0;
    if (dt == KILN_BF16) *n /= 2;
    return 1;
}

static int layout_md(int64_t M, int64_t K, kiln_dtype dt, dnnl_memory_desc_t *md, size_t *q_bytes) {
    if (!engine() || !packed_md(M, K, dt == KILN_F8_E4M3 ? KILN_BF16 : dt, md)) return 0;
    size_t n = dnnl_memory_desc_get_size(md);
    *q_bytes = dt == KILN_F8_E4M3 ? n / 2 : n;
    return 1;
}

kiln_status kk_fast_layout(int64_t M, int64_t K, kiln_dtype dt, char layout[40], size_t *bytes) {
    if (amx_i8(dt)) {
        snprintf(layout, 40, "s8-amx32");
        *bytes = align64(kk_amx_s8_packed_bytes(M, K)) + sizeof(float) * (size_t)M;
        return KILN_OK;
    }
    if (amx_bf16(dt)) {
        size_t n = kk_amx_packed_bytes(M, K);
        snprintf(layout, 40, dt == KILN_F8_E4M3 ? "e4m3-amx32" : "amx32");
        *bytes = dt == KILN_F8_E4M3 ? align64(n / 2) + sizeof(float) * (size_t)M : n;
        return KILN_OK;
    }
    if (f16_bf16(dt)) {
        snprintf(layout, 40, "f16p64");
        *bytes = kk_f16_packed_bytes(M, K);
        return KILN_OK;
    }
    if (avx2_f32(dt)) {
        snprintf(layout, 40, "f32p16");
        *bytes = kk_avx2_packed_bytes(M, K);
        return KILN_OK;
    }
    dnnl_memory_desc_t md;
    size_t qb;
    if ((dt != KILN_F32 && dt != KILN_BF16 && !kk_dtype_is_quant(dt)) || !layout_md(M, K, dt, &md, &qb))
        return kb_fail(KILN_ERR_UNSUPPORTED, "oneDNN has no matmul for %s [%lld x %lld] on this machine",
                       kiln_dtype_name(dt), (long long)M, (long long)K);
    snprintf(layout, 40, "%s-%016llx", dt == KILN_F8_E4M3 ? "e4m3" : "dnnl", (unsigned long long)md_id(&md));
    *bytes = kk_dtype_is_quant(dt) ? align64(qb) + sizeof(float) * (size_t)M : qb;
    return KILN_OK;
}


/* one oneDNN reorder between two mds (plain <-> packed, with type conversion) */
static kiln_status reorder_into(const dnnl_memory_desc_t *src, const void *sp, const dnnl_memory_desc_t *dst, void *dp) {
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t r;
    if (dnnl_reorder_primitive_desc_create(&pd, src, g_eng, dst, g_eng, NULL))
        return kb_fail(KILN_ERR_UNSUPPORTED, "oneDNN has no reorder between the plain and packed layouts");
    kiln_status st = KILN_OK;
    if (dnnl_primitive_create(&r, pd)) {
        dnnl_primitive_desc_destroy(pd);
        return kb_fail(KILN_ERR_UNSUPPORTED, "oneDNN reorder failed");
    }
    dnnl_memory_t ms, md;
    dnnl_memory_create(&ms, src, g_eng, (void *)sp);
    dnnl_memory_create(&md, dst, g_eng, dp);
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, ms}, {DNNL_ARG_TO, md}};
    dnnl_stream_t strm = stream();
    if (!strm || dnnl_primitive_execute(r, strm, 2, args) || dnnl_stream_wait(strm))
        st = kb_fail(KILN_ERR_UNSUPPORTED, "oneDNN reorder failed");
    dnnl_memory_destroy(ms);
    dnnl_memory_destroy(md);
    dnnl_primitive_destroy(r);
    dnnl_primitive_desc_destroy(pd);
    return st;
}

/* the plain view of W [M,K] row-major as the matmul's B = W^T: dims {K, M}
 * ({1, K, M} for I8), element (k, m) at m*K + k */
static int plain_md(int64_t M, int64_t K, dnnl_data_type_t t, int three_d, dnnl_memory_desc_t *md) {
    if (three_d) {
        dnnl_dims_t d = {1, K, M}, st = {K * M, 1, K};
        return !dnnl_memory_desc_init_by_strides(md, 3, d, t, st);
    }
    dnnl_dims_t d = {K, M};
    return !dnnl_memory_desc_init_by_tag(md, 2, d, t, dnnl_ba);
}

static kiln_status pack_quant(const float *w, int64_t M, int64_t K, kiln_dtype dt, void *out);
static kiln_status unpack_quant(const kk_weight *w, float *out);

kiln_status kk_fast_pack(const float *w, int64_t M, int64_t K, kiln_dtype dt, void *out) {
    if (kk_dtype_is_quant(dt)) return pack_quant(w, M, K, dt, out);
    if (amx_bf16(dt)) {
        kk_amx_pack(w, M, K, out);
        return KILN_OK;
    }
    if (f16_bf16(dt)) {
        kk_f16_pack(w, M, K, out);
        return KILN_OK;
    }
    if (avx2_f32(dt)) {
        kk_avx2_pack(w, M, K, out);
        return KILN_OK;
    }
    dnnl_memory_desc_t dst, src;
    size_t qb;
    if (!layout_md(M, K, dt, &dst, &qb) || !plain_md(M, K, dnnl_f32, 0, &src))
        return kb_fail(KILN_ERR_UNSUPPORTED, "oneDNN cannot pack [%lld x %lld]", (long long)M, (long long)K);
    return reorder_into(&src, w, &dst, out);
}

kiln_status kk_fast_unpack(const kk_weight *w, float *out) {
    if (!w->packed) {
        if (!w->f32) return kb_fail(KILN_ERR_INVALID_ARG, "kk_fast_unpack: a weight without data");
        memcpy(out, w->f32, sizeof(float) * (size_t)(w->M * w->K));
        return KILN_OK;
    }
    if (kk_dtype_is_quant(w->packed_dtype)) return unpack_quant(w, out);
    if (amx_bf16(w->packed_dtype)) {
        kk_amx_unpack(w->packed, w->M, w->K, out);
        return KILN_OK;
    }
    if (f16_bf16(w->packed_dtype)) {
        kk_f16_unpack(w->packed, w->M, w->K, out);
        return KILN_OK;
    }
    if (avx2_f32(w->packed_dtype)) {
        kk_avx2_unpack(w->packed, w->M, w->K, out);
        return KILN_OK;
    }
    dnnl_memory_desc_t src, dst;
    size_t qb;
    if (!layout_md(w->M, w->K, w->packed_dtype, &src, &qb) || !plain_md(w->M, w->K, dnnl_f32, 0, &dst))
        return kb_fail(KILN_ERR_UNSUPPORTED, "oneDNN cannot unpack [%lld x %lld]", (long long)w->M, (long long)w->K);
    return reorder_into(&src, w->packed, &dst, out);
}

/* ---- scratch --------------------------------------------------------------------- */

/* A per-thread buffer that only grows (freed when the thread exits). */
static void *scratch(int slot, size_t bytes) {
    thread_state *ts = tstate();
    if (!ts) return NULL;
    if (ts->cap[slot] < bytes) {
        kb_free_aligned(ts->buf[slot]);
        ts->buf[slot] = kb_alloc_aligned(bytes);
        ts->cap[slot] = ts->buf[slot] ? bytes : 0;
    }
    return ts->buf[slot];
}

/* scratch for a kernel with no other way to do its work: NULL records an
 * out-of-memory failure in run (the forward's: kb_run_current, taken
 * before a parallel region), which then fails instead of returning the
 * output the kernel did not write */
static void *scratch_in(kb_run *run, int slot, size_t bytes) {
    void *p = scratch(slot, bytes);
    if (!p) kb_run_fail(run, KILN_ERR_NOMEM, "out of memory for a %zu-byte kernel work buffer", bytes);
    return p;
}

static void *scratch_must(int slot, size_t bytes) { return scratch_in(kb_run_current(), slot, bytes); }

void *kk_scratch_must(int slot, size_t bytes) { return scratch_must(slot, bytes); }

void *kk_scratch(int slot, size_t bytes) { return scratch(slot, bytes); }


/* ---- vectorizable helpers, compiled per CPU (ifunc dispatch) ------------------ */

/* KK_CLONES, exp_f, bf16_of: kernels/cpu/vec.h (shared with conv.c) */

KK_CLONES static void to_bf16_scaled(const float *x, uint16_t *y, int64_t n, float scale) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) y[i] = bf16_of(x[i] * scale);
}

KK_CLONES static void copy_scaled(const float *x, float *y, int64_t n, float scale) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * scale;
}

/* softmax of row [n] in place (f32), then written to out in dt */
KK_CLONES static void softmax_row(float *row, int64_t n, void *out, int bf16) {
    float mx = -INFINITY, sum = 0;
#pragma omp simd reduction(max : mx)
    for (int64_t j = 0; j < n; j++) mx = row[j] > mx ? row[j] : mx;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < n; j++) {
        row[j] = exp_f(row[j] - mx);
        sum += row[j];
    }
    float inv = 1.0f / sum;
    if (bf16) {
        uint16_t *o = out;
#pragma omp simd
        for (int64_t j = 0; j < n; j++) o[j] = bf16_of(row[j] * inv);
    } else {
        float *o = out;
#pragma omp simd
        for (int64_t j = 0; j < n; j++) o[j] = row[j] * inv;
    }
}

/* ---- quantized weights ---------------------------------------------------------------- */

/* e4m3 -> bf16 bits, exact and branch-free (vectorizes): normals rebias the
 * exponent (7 -> 127), subnormals are m * 2^-9 (exact in f32), S.1111.111 is NaN */
static inline uint16_t e4m3_bf16(uint8_t b) {
    uint32_t s = (uint32_t)(b & 0x80u) << 8, e = (b >> 3) & 0xfu, m = b & 7u;
    uint32_t normal = s | ((e + 120u) << 7) | (m << 4);
    uint32_t sub = s | (f_bits((float)m * 0x1p-9f) >> 16);
    uint32_t v = e ? normal : sub;
    return (uint16_t)((b & 0x7fu) == 0x7fu ? (s | 0x7fc0u) : v);
}

KK_CLONES static void decode_e4m3(const uint8_t *p, uint16_t *o, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) o[i] = e4m3_bf16(p[i]);
}

/* f32 -> bf16 (nearest even), in parallel chunks; on one thread up to
 * 2^18 elements (~50 us): a parallel region there costs a wake-up and a
 * barrier for a few microseconds saved, and CLIP-G's GEMM inputs (77 x 1280,
 * 77 x 5120) are all below it */
static void to_bf16_par(const float *x, uint16_t *y, int64_t n) {
    int64_t chunk = 1 << 16;
#pragma omp parallel for schedule(static) if (n > (1 << 18))
    for (int64_t c = 0; c < n; c += chunk) to_bf16_scaled(x + c, y + c, n - c < chunk ? n - c : chunk, 1.0f);
}

/* e4m3 blob (n elements in the bf16 packed order) -> bf16, in parallel chunks */
static void decode_e4m3_par(const uint8_t *p, uint16_t *o, int64_t n) {
    int64_t chunk = 1 << 16;
#pragma omp parallel for schedule(static) if (n > chunk)
    for (int64_t c = 0; c < n; c += chunk) decode_e4m3(p + c, o + c, n - c < chunk ? n - c : chunk);
}

static kiln_status pack_quant(const float *w, int64_t M, int64_t K, kiln_dtype dt, void *out) {
    dnnl_memory_desc_t dst, src;
    size_t qb, n = (size_t)(M * K);
    int amx = amx_bf16(dt) || amx_i8(dt);
    if (amx_i8(dt)) qb = kk_amx_s8_packed_bytes(M, K);
    else if (amx ? !packed_elems(M, K, dt, &qb)
                 : (!layout_md(M, K, dt, &dst, &qb) || !plain_md(M, K, dt == KILN_I8 ? dnnl_s8 : dnnl_f32, dt == KILN_I8, &src)))
        return kb_fail(KILN_ERR_UNSUPPORTED, "oneDNN cannot pack [%lld x %lld] as %s", (long long)M, (long long)K,
                       kiln_dtype_name(dt));
    float *scales = (float *)((char *)out + align64(qb));
    uint8_t *q = kb_alloc_aligned(n ? n : 1);
    if (!q) return kb_fail(KILN_ERR_NOMEM, "out of memory quantizing a [%lld x %lld] weight", (long long)M, (long long)K);
    kiln_status st = kt_quantize_rows(w, M, K, dt, q, scales);
    if (!st && dt == KILN_I8 && amx) kk_amx_s8_pack((const int8_t *)q, M, K, out);
    else if (!st && dt == KILN_I8) st = reorder_into(&src, q, &dst, out);
    if (!st && dt == KILN_F8_E4M3) {
        /* the e4m3 values (unscaled) are exact in bf16: pack them as bf16 (amx32
         * or through oneDNN), then store each packed element back as its e4m3 code */
        float *f = kb_alloc_aligned(sizeof(float) * (n ? n : 1));
        uint16_t *bf = kb_alloc_aligned(2 * qb + 64);
        if (!f || !bf) st = kb_fail(KILN_ERR_NOMEM, "out of memory packing an fp8 weight");
        for (size_t i = 0; !st && i < n; i++) f[i] = kt_e4m3_to_f32(q[i]);
        if (!st && amx) kk_amx_pack(f, M, K, bf);
        else if (!st) st = reorder_into(&src, f, &dst, bf);
        for (size_t i = 0; !st && i < qb; i++) ((uint8_t *)out)[i] = kt_f32_to_e4m3(kt_bf16_to_f32(bf[i]));
        kb_free_aligned(f);
        kb_free_aligned(bf);
    }
    if (!st) memset((char *)out + qb, 0, align64(qb) - qb);
    kb_free_aligned(q);
    return st;
}

static kiln_status unpack_quant(const kk_weight *w, float *out) {
    dnnl_memory_desc_t src, dst;
    size_t qb, n = (size_t)(w->M * w->K);
    if (!w->scales) return kb_fail(KILN_ERR_INVALID_ARG, "kk_fast_unpack: a %s weight without scales", kiln_dtype_name(w->packed_dtype));
    int i8 = w->packed_dtype == KILN_I8, amx = amx_bf16(w->packed_dtype) || amx_i8(w->packed_dtype);
    if (amx_i8(w->packed_dtype)) qb = kk_amx_s8_packed_bytes(w->M, w->K);
    else if (amx ? !packed_elems(w->M, w->K, w->packed_dtype, &qb)
                 : (!layout_md(w->M, w->K, w->packed_dtype, &src, &qb) || !plain_md(w->M, w->K, dnnl_f32, i8, &dst)))
        return kb_fail(KILN_ERR_UNSUPPORTED, "oneDNN cannot unpack [%lld x %lld]", (long long)w->M, (long long)w->K);
    kiln_status st = KILN_OK;
    if (i8 && amx) {
        int8_t *q = kb_alloc_aligned(n ? n : 1);
        if (!q) return kb_fail(KILN_ERR_NOMEM, "out of memory unpacking an int8 weight");
        kk_amx_s8_unpack(w->packed, w->M, w->K, q);
        for (size_t i = 0; i < n; i++) out[i] = (float)q[i]; /* exact */
        kb_free_aligned(q);
    } else if (i8) {
        st = reorder_into(&src, w->packed, &dst, out); /* s8 -> f32 is exact */
    } else {
        uint16_t *bf = kb_alloc_aligned(2 * qb + 64);
        if (!bf) return kb_fail(KILN_ERR_NOMEM, "out of memory unpacking an fp8 weight");
        decode_e4m3_par(w->packed, bf, (int64_t)qb);
        if (amx) kk_amx_unpack(bf, w->M, w->K, out);
        else st = reorder_into(&src, bf, &dst, out);
        kb_free_aligned(bf);
    }
    for (size_t i = 0; !st && i < n; i++) out[i] *= w->scales[i / (size_t)w->K];
    return st;
}

/* x [rows,K] (f32 or bf16) -> s8 per token: s[r] = max|x[r,:]| / 127,
 * q = round(x / s) (a zero row: s = 1, q = 0) */
KK_CLONES static void quant_row_s8(const void *x, int x_bf16, int64_t K, int8_t *q, float *s) {
    float amax = 0;
    if (x_bf16) {
        const uint16_t *xb = x;
#pragma omp simd reduction(max : amax)
        for (int64_t k = 0; k < K; k++) {
            float v = fabsf(bits_f((uint32_t)xb[k] << 16));
            amax = v > amax ? v : amax;
        }
    } else {
        const float *xf = x;
#pragma omp simd reduction(max : amax)
        for (int64_t k = 0; k < K; k++) {
            float v = fabsf(xf[k]);
            amax = v > amax ? v : amax;
        }
    }
    float inv = amax > 0 ? 127.0f / amax : 0.0f;
    *s = amax > 0 ? amax / 127.0f : 1.0f;
    if (x_bf16) {
        const uint16_t *xb = x;
#pragma omp simd
        for (int64_t k = 0; k < K; k++) {
            float v = __builtin_rintf(bits_f((uint32_t)xb[k] << 16) * inv);
            q[k] = (int8_t)(v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v);
        }
    } else {
        const float *xf = x;
#pragma omp simd
        for (int64_t k = 0; k < K; k++) {
            float v = __builtin_rintf(xf[k] * inv);
            q[k] = (int8_t)(v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v);
        }
    }
}

/* y = act(dequant(x_q . W_q^T) + b) on quantized weights, for any
 * combination of f32 / bf16 activations (x_fmt, y_fmt; blocked only on the
 * AMX fp8 path, fast_linear_io converts it for the others):
 *   I8: tokens quantized to s8 here (per token), s8 x s8 with int32
 *       accumulation, scales, bias and activation fused as post-ops
 *   F8_E4M3: weights decoded to bf16 (their packed layout is kept, so no
 *       reorder), x in bf16, bf16 GEMM with f32 accumulation, channel scales,
 *       bias and activation fused */
static void quant_linear(const void *x, int x_fmt, const kk_weight *w, const float *b, void *y, int y_fmt,
                         int64_t rows, int act) {
    int64_t K = w->K, M = w->M;
    prim_entry key = {.m = rows, .k = K, .n = M, .sa = K, .sd = M, .act = act, .bias = b != NULL, .wkind = 0,
                      .ydt = y_fmt ? dnnl_bf16 : dnnl_f32};
    const void *src = x, *wei = w->packed;
    const float *po[3] = {w->scales, NULL, NULL};
    int npo;
    if (w->packed_dtype == KILN_I8) {
        int8_t *xq = scratch_must(8, (size_t)(rows * K));
        float *sx = scratch_must(9, sizeof(float) * (size_t)rows);
        if (!xq || !sx) return;
        const char *xc = x;
        size_t esz = x_fmt != KK_FMT_F32 ? 2 : 4;
#pragma omp parallel for schedule(static) if (rows * K > (1 << 15))
        for (int64_t r = 0; r < rows; r++) quant_row_s8(xc + esz * (size_t)(r * K), x_fmt != KK_FMT_F32, K, xq + r * K, sx + r);
        if (amx_i8(KILN_I8)) {
            int nt = gemm_threads(KILN_BF16);
            void *work = scratch_must(11, kk_amx_work_bytes(rows, K, nt));
            kk_amx_epilogue e = {.scales = w->scales, .bias = b, .act = act};
            kk_amx_linear_s8(xq, sx, w->packed, M, K, &e, y, y_fmt, rows, nt, work);
            return;
        }
        key.dt = dnnl_s8;
        key.q = Q_I8;
        src = xq;
        po[1] = sx;
        po[2] = b;
        npo = b ? 3 : 2;
    } else {
        key.dt = dnnl_bf16;
        key.q = Q_F8;
        size_t qb;
        if (!packed_elems(M, K, KILN_F8_E4M3, &qb)) {
            kb_defer_failure(KILN_ERR_UNSUPPORTED, "oneDNN has no bf16 matmul for an fp8 weight [%lld x %lld] here",
                             (long long)M, (long long)K);
            return;
        }
        uint16_t *wb = scratch_must(10, 2 * qb);
        if (!wb) return;
        decode_e4m3_par(w->packed, wb, (int64_t)qb);
        if (amx_bf16(KILN_F8_E4M3)) {
            kk_amx_epilogue e = {.scales = w->scales, .bias = b, .act = act};
            amx_linear(x, x_fmt, wb, M, K, &e, y, y_fmt, rows);
            return;
        }
        if (x_fmt == KK_FMT_F32) {
            uint16_t *xb = scratch_must(0, sizeof(uint16_t) * (size_t)(rows * K));
            if (!xb) return;
            to_bf16_par(x, xb, rows * K);
            src = xb;
        }
        wei = wb;
        po[1] = b;
        npo = b ? 2 : 1;
    }
    int saved = omp_get_max_threads(), nt = gemm_threads(KILN_BF16);
    omp_set_num_threads(nt);
    if (!run_matmul_po(&key, src, wei, NULL, y, po, npo))
        kb_defer_failure(KILN_ERR_UNSUPPORTED, "oneDNN's quantized matmul [%lld x %lld] x [%lld x %lld]^T failed",
                         (long long)rows, (long long)K, (long long)M, (long long)K);
    omp_set_num_threads(saved);
}

/* ---- the kernels ------------------------------------------------------------------ */

/* y (f32 or bf16) = act(x W^T + b); x is f32 (converted here for bf16
 * GEMMs) or already bf16; x_fmt / y_fmt are KK_FMT_*. Blocked activations
 * go to and from bf16 rows here for every GEMM but the AMX one, which
 * reads and writes them itself (quant_linear's AMX fp8 path included) */
static void fast_linear_io(kiln_dtype dt, const void *x, int x_fmt, const kk_weight *w, const float *b, void *y,
                           int y_fmt, int64_t rows, int act) {
    /* scratch slots 14 and 15 (13 holds a joint attention's concatenations) */
    int native = dt == KILN_BF16 && w->packed && amx_bf16(w->packed_dtype);
    if (!native && x_fmt == KK_FMT_BLOCKED) {
        uint16_t *xr = scratch_must(14, sizeof(uint16_t) * (size_t)(rows * w->K));
        if (!xr) return;
        kk_unblock_rows(x, rows, w->K, xr);
        x = xr;
        x_fmt = KK_FMT_BF16;
    }
    if (!native && y_fmt == KK_FMT_BLOCKED) {
        uint16_t *yr = scratch_must(15, sizeof(uint16_t) * (size_t)(rows * w->M));
        if (!yr) return;
        fast_linear_io(dt, x, x_fmt, w, b, yr, KK_FMT_BF16, rows, act);
        kk_block_rows(yr, rows, w->M, y);
        return;
    }
    int x_bf16 = x_fmt != KK_FMT_F32, y_bf16 = y_fmt != KK_FMT_F32;
    if (dt == KILN_BF16 && w->packed && w->packed_dtype == KILN_F32) {
        /* a linear the model keeps f32 (ka_spec.keep_f32): the f32 GEMM, its
         * rows converted from and to bf16 where the graph gives them so */
        float *xf = NULL, *yf = NULL;
        if (x_bf16 && !(xf = kb_alloc_aligned(sizeof(float) * (size_t)(rows * w->K)))) goto nomem;
        if (y_bf16 && !(yf = kb_alloc_aligned(sizeof(float) * (size_t)(rows * w->M)))) goto nomem;
        if (xf)
            for (int64_t i = 0; i < rows * w->K; i++) xf[i] = kt_bf16_to_f32(((const uint16_t *)x)[i]);
        fast_linear_io(KILN_F32, xf ? xf : x, KK_FMT_F32, w, b, yf ? (void *)yf : y, KK_FMT_F32, rows, act);
        if (yf) to_bf16_par(yf, y, rows * w->M);
        kb_free_aligned(xf);
        kb_free_aligned(yf);
        return;
    nomem:
        kb_free_aligned(xf);
        kb_defer_failure(KILN_ERR_NOMEM, "linear: out of memory converting the rows of an f32 weight");
        return;
    }
    if (w->packed && kk_dtype_is_quant(w->packed_dtype)) {
        quant_linear(x, x_fmt, w, b, y, y_fmt, rows, act);
        return;
    }
    if (!w->packed || w->packed_dtype != dt || (x_bf16 && dt != KILN_BF16) || (y_bf16 && dt != KILN_BF16)) {
        /* an unpacked weight (or a combination the GEMM does not take): the reference, in f32 */
        kk_reference()->linear(x, w, b, y, rows, act);
        return;
    }
    if (amx_bf16(dt)) {
        kk_amx_epilogue e = {.bias = b, .act = act};
        amx_linear(x, x_fmt, w->packed, w->M, w->K, &e, y, y_fmt, rows);
        return;
    }
    if (f16_bf16(dt)) {
        kk_amx_epilogue e = {.bias = b, .act = act};
        f16_linear(x, x_fmt, w->packed, w->M, w->K, &e, y, y_fmt, rows);
        return;
    }
    if (avx2_f32(dt)) { /* x and y f32 here: the checks above */
        kk_avx2_linear(x, w->packed, w->M, w->K, b, act, y, rows, gemm_threads(dt));
        return;
    }
    const void *src = x;
    if (dt == KILN_BF16 && !x_bf16) {
        uint16_t *xb = scratch_must(0, sizeof(uint16_t) * (size_t)(rows * w->K));
        if (!xb) return;
        to_bf16_par(x, xb, rows * w->K);
        src = xb;
    }
    prim_entry key = {.m = rows, .k = w->K, .n = w->M, .sa = w->K, .sd = w->M, .dt = dnnl_dt(dt), .act = act,
                      .bias = b != NULL, .wkind = 0, .ydt = y_bf16 ? dnnl_bf16 : dnnl_f32};
    int saved = omp_get_max_threads(), nt = gemm_threads(dt);
    omp_set_num_threads(nt);
    if (!run_matmul(&key, src, w->packed, b, y))
        kb_defer_failure(KILN_ERR_UNSUPPORTED, "oneDNN's matmul [%lld x %lld] x [%lld x %lld]^T failed", (long long)rows,
                         (long long)w->K, (long long)w->M, (long long)w->K);
    omp_set_num_threads(saved);
}

static void fast_linear(kiln_dtype dt, const float *x, const kk_weight *w, const float *b, float *y, int64_t rows,
                        int act) {
    fast_linear_io(dt, x, 0, w, b, y, 0, rows, act);
}

static void linear_io_bf16(const void *x, int x_fmt, const kk_weight *w, const float *b, void *y, int y_fmt,
                           int64_t rows, int act) {
    fast_linear_io(KILN_BF16, x, x_fmt, w, b, y, y_fmt, rows, act);
}

/* y = res + gate * (x W^T + b): in the AMX GEMM's epilogue where it runs
 * the bf16 weights, else the linear and then gate_add over its output */
static void fast_linear_gate_add(kiln_dtype dt, const void *x, int x_fmt, const kk_weight *w, const float *b,
                                 const float *res, const float *gate, int64_t gate_ld, float *y, int64_t B, int64_t N) {
    if (dt == KILN_BF16 && fast_blocked_io(w)) {
        kk_amx_epilogue e = {.bias = b, .res = res, .gate = gate, .gate_ld = gate_ld, .tokens = N};
        amx_linear(x, x_fmt, w->packed, w->M, w->K, &e, y, KK_FMT_F32, B * N);
        return;
    }
    if (w->packed && w->packed_dtype == KILN_BF16 && f16_bf16(dt)) {
        kk_amx_epilogue e = {.bias = b, .res = res, .gate = gate, .gate_ld = gate_ld, .tokens = N};
        if (f16_linear(x, x_fmt, w->packed, w->M, w->K, &e, y, KK_FMT_F32, B * N)) return;
    }
    kk_linear_then_gate_add(kk_fast(dt), x, x_fmt, w, b, res, gate, gate_ld, y, B, N);
}

static void linear_gate_add_f32(const void *x, int x_fmt, const kk_weight *w, const float *b, const float *res,
                                const float *gate, int64_t gate_ld, float *y, int64_t B, int64_t N) {
    fast_linear_gate_add(KILN_F32, x, x_fmt, w, b, res, gate, gate_ld, y, B, N);
}

static void linear_gate_add_bf16(const void *x, int x_fmt, const kk_weight *w, const float *b, const float *res,
                                 const float *gate, int64_t gate_ld, float *y, int64_t B, int64_t N) {
    fast_linear_gate_add(KILN_BF16, x, x_fmt, w, b, res, gate, gate_ld, y, B, N);
}

static void linear_f32(const float *x, const kk_weight *w, const float *b, float *y, int64_t rows, int act) {
    fast_linear(KILN_F32, x, w, b, y, rows, act);
}

static void linear_bf16(const float *x, const kk_weight *w, const float *b, float *y, int64_t rows, int act) {
    fast_linear(KILN_BF16, x, w, b, y, rows, act);
}

/* silu and tanh-GELU through exp_f, so they vectorize (per CPU, KK_CLONES);
 * tanh(u) = 1 - 2 / (e^2u + 1) */
KK_CLONES static void silu_chunk(const float *x, float *y, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) y[i] = x[i] / (1.0f + exp_f(-x[i]));
}

KK_CLONES static void gelu_chunk(const float *x, float *y, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) y[i] = gelu_tanh_f(x[i]);
}

static void fast_silu(const float *x, float *y, int64_t n) {
    int64_t chunk = 1 << 14;
#pragma omp parallel for schedule(static) if (n > 4 * chunk)
    for (int64_t c = 0; c < n; c += chunk) silu_chunk(x + c, y + c, n - c < chunk ? n - c : chunk);
}

static void fast_gelu(const float *x, float *y, int64_t n) {
    int64_t chunk = 1 << 14;
#pragma omp parallel for schedule(static) if (n > 4 * chunk)
    for (int64_t c = 0; c < n; c += chunk) gelu_chunk(x + c, y + c, n - c < chunk ? n - c : chunk);
}

/* exact GELU 0.5 x (1 + erf(x / sqrt 2)) with erf by Abramowitz & Stegun
 * 7.1.26 (|error| <= 1.5e-7, as PyTorch's vectorized erf) on exp_f, quick
 * GELU x / (1 + e^(-1.702 x)), ReLU: f32, vectorized (kk_unary, the
 * reference's, takes erf and exp in double one element at a time: 11% of
 * a CLIP-G encode) */
KK_CLONES static void unary_chunk(int op, const float *x, float *y, int64_t n) {
    if (op == KK_UN_GELU) {
#pragma omp simd
        for (int64_t i = 0; i < n; i++) {
            float v = x[i], z = fabsf(v) * 0.70710678118654752f, t = 1.0f / (1.0f + 0.3275911f * z);
            float p = t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
            float e = 1.0f - p * exp_f(-z * z); /* erf(|v| / sqrt 2) */
            y[i] = 0.5f * v * (1.0f + (v < 0 ? -e : e));
        }
    } else if (op == KK_UN_QUICK_GELU) {
#pragma omp simd
        for (int64_t i = 0; i < n; i++) y[i] = x[i] / (1.0f + exp_f(-1.702f * x[i]));
    } else {
#pragma omp simd
        for (int64_t i = 0; i < n; i++) y[i] = x[i] > 0 ? x[i] : 0.0f;
    }
}

static void fast_unary(int op, const float *x, float *y, int64_t n) {
    int64_t chunk = 1 << 14;
#pragma omp parallel for schedule(static) if (n > 4 * chunk)
    for (int64_t c = 0; c < n; c += chunk) unary_chunk(op, x + c, y + c, n - c < chunk ? n - c : chunk);
}

/* A row's mean and 1 / sqrt(variance + eps), each sum over RS_LANES
 * interleaved partial sums (element i into lane i % RS_LANES), added up
 * in one fixed order: the lanes are independent chains, which the
 * compiler keeps apart in vector registers without reordering a sum, so
 * every instruction set gives the same bits (C11: no contraction into
 * FMAs). One sum per pass (an omp simd reduction) made each pass wait on
 * its adds: 1,096 cycles a row of 1536 in L1 against 203 (built for the
 * base x86-64; layernorm + modulate in the forward 0.95x, 16 pairs) */
#define RS_LANES 64
static inline float lanes_sum(const float *l) {
    float t = 0;
    for (int j = 0; j < RS_LANES; j++) t += l[j];
    return t;
}

static inline void row_stats(const float *x, int64_t D, float eps, float *mean, float *inv) {
    float l[RS_LANES] = {0};
    int64_t i = 0;
    for (; i + RS_LANES <= D; i += RS_LANES)
        for (int j = 0; j < RS_LANES; j++) l[j] += x[i + j];
    for (int j = 0; i + j < D; j++) l[j] += x[i + j];
    float mu = lanes_sum(l) / (float)D;
    memset(l, 0, sizeof l);
    for (i = 0; i + RS_LANES <= D; i += RS_LANES)
        for (int j = 0; j < RS_LANES; j++) l[j] += (x[i + j] - mu) * (x[i + j] - mu);
    for (int j = 0; i + j < D; j++) l[j] += (x[i + j] - mu) * (x[i + j] - mu);
    *mean = mu;
    *inv = 1.0f / sqrtf(lanes_sum(l) / (float)D + eps);
}

static void fast_layernorm(const float *x, float *y, int64_t rows, int64_t D, float eps) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        float mu, inv;
        row_stats(x + r * D, D, eps, &mu, &inv);
#pragma omp simd
        for (int64_t i = 0; i < D; i++) y[r * D + i] = (x[r * D + i] - mu) * inv;
    }
}

/* one row of layernorm + modulate, f32 out, compiled per CPU */
KK_CLONES static void ln_mod_row(const float *xr, const float *sh, const float *sc, float *yr, int64_t D, float eps) {
    float mu, inv;
    row_stats(xr, D, eps, &mu, &inv);
#pragma omp simd
    for (int64_t i = 0; i < D; i++) yr[i] = (xr[i] - mu) * inv * (1.0f + sc[i]) + sh[i];
}

static void fast_ln_modulate(const float *x, const float *shift, const float *scale, float *y, int64_t B,
                             int64_t N, int64_t D, float eps) {
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; b++)
        for (int64_t n = 0; n < N; n++)
            ln_mod_row(x + (b * N + n) * D, shift + b * D, scale + b * D, y + (b * N + n) * D, D, eps);
}

/* The bf16 producers (layernorm + modulate, modulate) belong to the bf16
 * backend, which kk_fast offers only with AVX512-BF16: built for it, they
 * round to bf16 with one VCVTNEPS2BF16 per 16 values, as the GEMM's epilogue
 * does (the portable bit arithmetic ran in 256-bit halves, ~2 cycles a value;
 * BF16_FN: simd.h) */

/* n (<= 16; none when n <= 0) values of layernorm + modulate (ln: mu, inv
 * are the row's) or modulate alone to bf16 at d; pad: the other lanes of the
 * 16 get zeros */
BF16_FN static inline void mod16(const float *x, const float *sh, const float *sc, int ln, float mu, float inv,
                                 int64_t n, uint16_t *d, int pad) {
    __mmask16 m = n >= 16 ? 0xffff : n <= 0 ? 0 : (__mmask16)((1u << n) - 1);
    __m512 t = _mm512_maskz_loadu_ps(m, x);
    if (ln) t = _mm512_mul_ps(_mm512_sub_ps(t, _mm512_set1_ps(mu)), _mm512_set1_ps(inv));
    __m512 v = _mm512_fmadd_ps(t, _mm512_add_ps(_mm512_maskz_loadu_ps(m, sc), _mm512_set1_ps(1.0f)),
                               _mm512_maskz_loadu_ps(m, sh));
    __m256i b = (__m256i)_mm512_cvtneps_pbh(v);
    if (pad) _mm256_storeu_si256((__m256i *)d, _mm256_maskz_mov_epi16(m, b));
    else _mm256_mask_storeu_epi16(d, m, b);
}

/* y [B*N, D] = layernorm (ln) + modulate, or modulate alone, of x as bf16
 * rows or blocked (fmt). Blocked goes one row block of 32 at a time: its
 * rows' statistics first, then per step of 32 columns the block's 32 rows,
 * 2 KiB in a row, written in order (row by row over all of D would write
 * one line every 2 KiB); the padding (rows past B*N, columns past D) gets
 * zeros. While it writes a block it brings the next block's rows (the
 * thread's next, with the static schedule) into L2, two lines per 32
 * values written: the statistics pass then reads from L2, not L3 (it
 * waited on memory; paired, 333-2048 rows of 1536: 1.13-1.23x in a busy
 * spell, 1.05-1.07x in a quiet one) */
BF16_FN static void mod_bf16(const float *x, const float *shift, const float *scale, uint16_t *y, int64_t B,
                             int64_t N, int64_t D, int ln, float eps, int fmt) {
    int64_t rows = B * N;
    if (fmt != KK_FMT_BLOCKED) {
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            const float *xr = x + r * D, *sh = shift + r / N * D, *sc = scale + r / N * D;
            float mu = 0, inv = 1;
            if (ln) row_stats(xr, D, eps, &mu, &inv);
            for (int64_t c = 0; c < D; c += 16) mod16(xr + c, sh + c, sc + c, ln, mu, inv, D - c, y + r * D + c, 0);
        }
        return;
    }
#pragma omp parallel for schedule(static)
    for (int64_t rb = 0; rb < (rows + 31) / 32; rb++) {
        float mu[32] = {0}, inv[32] = {0};
        for (int64_t i = 0; i < 32 && ln; i++)
            if (rb * 32 + i < rows) row_stats(x + (rb * 32 + i) * D, D, eps, &mu[i], &inv[i]);
        int64_t next = rows - (rb + 1) * 32 < 32 ? rows - (rb + 1) * 32 : 32; /* the next block's rows */
        const char *pf = next > 0 ? (const char *)(x + (rb + 1) * 32 * D) : (const char *)x;
        int64_t lines = next > 0 ? (next * D * 4 + 63) / 64 : 0; /* left to bring */
        for (int64_t c = 0; c < D; c += 32) {
            uint16_t *d = y + kk_blocked_index(rb * 32, c, D);
            for (int64_t i = 0; i < 32; i++, d += 32) {
                int64_t r = rb * 32 + i;
                if (r >= rows) {
                    memset(d, 0, 64);
                    continue;
                }
                for (int l = 0; l < 2 && lines > 0; l++, lines--, pf += 64) _mm_prefetch(pf, _MM_HINT_T1);
                int64_t at = r / N * D + c;
                const float *xr = x + r * D + c, *sh = shift + at, *sc = scale + at;
                mod16(xr, sh, sc, ln, mu[i], inv[i], D - c, d, 1);
                mod16(xr + 16, sh + 16, sc + 16, ln, mu[i], inv[i], D - c - 16, d + 16, 1);
            }
        }
    }
}

static void fast_ln_modulate_bf16(const float *x, const float *shift, const float *scale, uint16_t *y, int64_t B,
                                  int64_t N, int64_t D, float eps, int y_fmt) {
    mod_bf16(x, shift, scale, y, B, N, D, 1, eps, y_fmt);
}

static void fast_modulate_bf16(const float *x, const float *shift, const float *scale, uint16_t *y, int64_t B,
                               int64_t N, int64_t D, int y_fmt) {
    mod_bf16(x, shift, scale, y, B, N, D, 0, 0, y_fmt);
}

static void fast_rmsnorm_heads(const float *x, const float *w, float *y, int64_t rows, int64_t H, int64_t Dh,
                               float eps) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows * H; r++) {
        const float *xh = x + r * Dh;
        float ss = 0;
#pragma omp simd reduction(+ : ss)
        for (int64_t i = 0; i < Dh; i++) ss += xh[i] * xh[i];
        float inv = 1.0f / sqrtf(ss / (float)Dh + eps);
#pragma omp simd
        for (int64_t i = 0; i < Dh; i++) y[r * Dh + i] = xh[i] * inv * w[i];
    }
}

static void fast_modulate(const float *x, const float *shift, const float *scale, float *y, int64_t B, int64_t N,
                          int64_t D) {
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; b++)
        for (int64_t n = 0; n < N; n++) {
            const float *xr = x + (b * N + n) * D, *sh = shift + b * D, *sc = scale + b * D;
            float *yr = y + (b * N + n) * D;
#pragma omp simd
            for (int64_t i = 0; i < D; i++) yr[i] = xr[i] * (1.0f + sc[i]) + sh[i];
        }
}

static void fast_gate_add(const float *res, const float *gate, const float *v, float *y, int64_t B, int64_t N,
                          int64_t D) {
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; b++)
        for (int64_t n = 0; n < N; n++) {
            const float *rr = res + (b * N + n) * D, *vr = v + (b * N + n) * D, *g = gate + b * D;
            float *yr = y + (b * N + n) * D;
#pragma omp simd
            for (int64_t i = 0; i < D; i++) yr[i] = rr[i] + g[i] * vr[i];
        }
}

/* Cached reorders into the packed weights layout of a matmul with B [k, n]:
 * src is dense row-major, either B itself ("ab") or B^T ("ba"). */
typedef struct {
    int64_t k, n;
    int dt, tag;
    dnnl_primitive_t prim;
    dnnl_memory_desc_t src, dst;
} reorder_entry;

static reorder_entry **g_reorders; /* entries never move once made */
static size_t g_nreorders;

static const reorder_entry *get_reorder(int64_t k, int64_t n, kiln_dtype dt, dnnl_format_tag_t tag) {
    pthread_mutex_lock(&g_lock);
    for (size_t i = 0; i < g_nreorders; i++) {
        reorder_entry *r = g_reorders[i];
        if (r->k == k && r->n == n && r->dt == (int)dt && r->tag == (int)tag) {
            pthread_mutex_unlock(&g_lock);
            return r;
        }
    }
    double t0 = kb_now();
    reorder_entry e = {.k = k, .n = n, .dt = (int)dt, .tag = (int)tag};
    dnnl_dims_t d = {k, n};
    dnnl_primitive_desc_t pd = NULL;
    int ok = packed_md(n, k, dt, &e.dst) && !dnnl_memory_desc_init_by_tag(&e.src, 2, d, dnnl_dt(dt), tag) &&
             !dnnl_reorder_primitive_desc_create(&pd, &e.src, g_eng, &e.dst, g_eng, NULL) &&
             !dnnl_primitive_create(&e.prim, pd);
    if (pd) dnnl_primitive_desc_destroy(pd);
    reorder_entry **nr = ok ? realloc(g_reorders, (g_nreorders + 1) * sizeof *nr) : NULL;
    reorder_entry *out = nr ? malloc(sizeof *out) : NULL;
    if (nr) g_reorders = nr;
    if (out) {
        *out = e;
        g_reorders[g_nreorders++] = out;
    }
    pthread_mutex_unlock(&g_lock);
    kb_ledger_add("onednn_create", kb_now() - t0, "reorder");
    return out;
}

static int reorder_run(const reorder_entry *r, const void *src, void *dst) {
    dnnl_memory_t ms, md;
    if (dnnl_memory_create(&ms, &r->src, g_eng, (void *)src)) return 0;
    dnnl_memory_create(&md, &r->dst, g_eng, dst);
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, ms}, {DNNL_ARG_TO, md}};
    dnnl_stream_t strm = stream();
    int ok = strm && !dnnl_primitive_execute(r->prim, strm, 2, args) && !dnnl_stream_wait(strm);
    dnnl_memory_destroy(ms);
    dnnl_memory_destroy(md);
    return ok;
}

/* Attention per (batch, head) in query strips of QT rows: S = Q K^T over all
 * keys (a QT x Nk strip, never Nq x Nk), exact row softmax, O = P V. K^T and
 * V are packed once per head into the matmul's weights layout; both products
 * run through oneDNN in dt (bf16 with f32 accumulation, or f32). */
#define QT 256

/* head (b, h)'s q (scaled by 1/sqrt(Dh)), k and v, dense, in dt (bf16 or
 * f32), into qh [Nq,Dh], kh and vh [Nk,Dh], q and k rotated by the table
 * rope first where one is given (kk_rope_row: the rope op's values); their
 * rows shared out among the threads when par (a caller outside a parallel
 * region) */
static void attn_pack_head(int bf, const float *q, const float *k, const float *v, int64_t b, int64_t h, int64_t Nq,
                           int64_t Nk, int64_t H, int64_t Dh, uint8_t *qh, uint8_t *kh, uint8_t *vh, int par,
                           const float *rope) {
    const int64_t D = H * Dh;
    const float scale = 1.0f / sqrtf((float)Dh);
#pragma omp parallel for schedule(static) if (par)
    for (int64_t i = 0; i < Nq; i++) {
        const float *src = q + (b * Nq + i) * D + h * Dh;
        float rot[rope ? Dh : 1];
        if (rope) src = (kk_rope_row(src, rope + i * Dh, rot, Dh), rot);
        if (bf) to_bf16_scaled(src, (uint16_t *)qh + i * Dh, Dh, scale);
        else copy_scaled(src, (float *)qh + i * Dh, Dh, scale);
    }
#pragma omp parallel for schedule(static) if (par)
    for (int64_t j = 0; j < Nk; j++) {
        const float *ks = k + (b * Nk + j) * D + h * Dh, *vs = v + (b * Nk + j) * D + h * Dh;
        float rot[rope ? Dh : 1];
        if (rope) ks = (kk_rope_row(ks, rope + j * Dh, rot, Dh), rot);
        if (bf) {
            to_bf16_scaled(ks, (uint16_t *)kh + j * Dh, Dh, 1.0f);
            to_bf16_scaled(vs, (uint16_t *)vh + j * Dh, Dh, 1.0f);
        } else {
            memcpy((float *)kh + j * Dh, ks, sizeof(float) * (size_t)Dh);
            memcpy((float *)vh + j * Dh, vs, sizeof(float) * (size_t)Dh);
        }
    }
}

/* one strip of QT (or fewer) queries from i0 of head (b, h): S = Q K^T
 * (kp: K^T packed), exact row softmax into P, O = P V (vp), written to o;
 * on this thread's work buffers; 0 when oneDNN failed (deferred) */
static int attn_strip(kb_run *run, kiln_dtype dt, const uint8_t *qh, const void *kp, const void *vp, float *o, int64_t b,
                      int64_t h, int64_t i0, int64_t Nq, int64_t Nk, int64_t H, int64_t Dh) {
    const int bf = dt == KILN_BF16;
    size_t esz = bf ? 2 : 4;
    float *s = scratch_in(run, 3, sizeof(float) * (size_t)(QT * Nk + QT * Dh));
    uint8_t *p = scratch_in(run, 7, esz * (size_t)(QT * Nk));
    if (!s || !p) return 0;
    float *ot = s + QT * Nk;
    int64_t m = Nq - i0 < QT ? Nq - i0 : QT;
    prim_entry k1 = {.m = m, .k = Dh, .n = Nk, .sa = Dh, .sd = Nk, .dt = dnnl_dt(dt), .wkind = 0};
    if (!run_matmul(&k1, qh + esz * (size_t)(i0 * Dh), kp, NULL, s)) {
        kb_run_fail(run, KILN_ERR_UNSUPPORTED, "oneDNN's attention scores matmul failed");
        return 0;
    }
    for (int64_t r = 0; r < m; r++) /* exact row softmax into P (dt, dense) */
        softmax_row(s + r * Nk, Nk, p + esz * (size_t)(r * Nk), bf);
    prim_entry k2 = {.m = m, .k = Nk, .n = Dh, .sa = Nk, .sd = Dh, .dt = dnnl_dt(dt), .wkind = 0};
    if (!run_matmul(&k2, p, vp, NULL, ot)) {
        kb_run_fail(run, KILN_ERR_UNSUPPORTED, "oneDNN's attention output matmul failed");
        return 0;
    }
    for (int64_t r = 0; r < m; r++)
        memcpy(o + (b * Nq + i0 + r) * H * Dh + h * Dh, ot + r * Dh, sizeof(float) * (size_t)Dh);
    return 1;
}

static void fast_attention(kiln_dtype dt, const float *q, const float *k, const float *v, float *o, int64_t B,
                           int64_t Nq, int64_t Nk, int64_t H, int64_t Dh, const float *rope) {
    size_t esz = dt == KILN_BF16 ? 2 : 4;
    const int bf = dt == KILN_BF16;
    const reorder_entry *rk = get_reorder(Dh, Nk, dt, dnnl_ba); /* K^T [Dh, Nk] from K [Nk, Dh] */
    const reorder_entry *rv = get_reorder(Nk, Dh, dt, dnnl_ab); /* V [Nk, Dh] */
    if (!rk || !rv) {
        kb_log(KILN_LOG_WARN, "oneDNN cannot pack attention operands; using the reference attention");
        kk_reference()->attention(q, k, v, o, B, Nq, Nk, H, Dh, rope);
        return;
    }
    size_t kp_bytes = dnnl_memory_desc_get_size(&rk->dst), vp_bytes = dnnl_memory_desc_get_size(&rv->dst);
    int nt = omp_get_max_threads();
    kb_run *run = kb_run_current(); /* the forward's, for the worker threads' failures */
    if (B * H < nt && Nq > QT) {
        /* fewer (batch, head) pairs than threads (the VAE's one head): each
         * head packed by all threads, then its strips shared out (the same
         * calls a strip as below: the same bits) */
        uint8_t *qh = scratch_must(0, esz * (size_t)(Nq * Dh)), *kh = scratch_must(1, esz * (size_t)(Nk * Dh)),
                *vh = scratch_must(2, esz * (size_t)(Nk * Dh));
        void *kp = scratch_must(5, kp_bytes), *vp = scratch_must(6, vp_bytes);
        for (int64_t b = 0; qh && kh && vh && kp && vp && b < B; b++)
            for (int64_t h = 0; h < H; h++) {
                attn_pack_head(bf, q, k, v, b, h, Nq, Nk, H, Dh, qh, kh, vh, 1, rope);
                if (!reorder_run(rk, kh, kp) || !reorder_run(rv, vh, vp)) {
                    kb_defer_failure(KILN_ERR_UNSUPPORTED, "oneDNN could not pack an attention head's keys and values");
                    return;
                }
#pragma omp parallel for schedule(dynamic)
                for (int64_t i0 = 0; i0 < Nq; i0 += QT) attn_strip(run, dt, qh, kp, vp, o, b, h, i0, Nq, Nk, H, Dh);
            }
        return;
    }
#pragma omp parallel for collapse(2) schedule(dynamic) num_threads(nt)
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
            uint8_t *qh = scratch_in(run, 0, esz * (size_t)(Nq * Dh));
            uint8_t *kh = scratch_in(run, 1, esz * (size_t)(Nk * Dh));
            uint8_t *vh = scratch_in(run, 2, esz * (size_t)(Nk * Dh));
            void *kp = scratch_in(run, 5, kp_bytes), *vp = scratch_in(run, 6, vp_bytes);
            if (!qh || !kh || !vh || !kp || !vp) continue;
            attn_pack_head(bf, q, k, v, b, h, Nq, Nk, H, Dh, qh, kh, vh, 0, rope);
            if (!reorder_run(rk, kh, kp) || !reorder_run(rv, vh, vp)) {
                kb_run_fail(run, KILN_ERR_UNSUPPORTED, "oneDNN could not pack an attention head's keys and values");
                continue;
            }
            for (int64_t i0 = 0; i0 < Nq; i0 += QT)
                if (!attn_strip(run, dt, qh, kp, vp, o, b, h, i0, Nq, Nk, H, Dh)) break;
        }
}

static void attention_f32(const float *q, const float *k, const float *v, float *o, int64_t B, int64_t Nq,
                          int64_t Nk, int64_t H, int64_t Dh, const float *rope) {
    fast_attention(KILN_F32, q, k, v, o, B, Nq, Nk, H, Dh, rope);
}

/* KILN_ATTENTION=strips turns the fused AMX, fp16 and AVX512-BF16 kernels off (read once: this runs every layer) */
static int attention_strips(void) {
    static int strips = -1;
    if (__atomic_load_n(&strips, __ATOMIC_RELAXED) < 0) {
        const char *mode = getenv("KILN_ATTENTION");
        __atomic_store_n(&strips, mode && !strcmp(mode, "strips"), __ATOMIC_RELAXED);
    }
    return __atomic_load_n(&strips, __ATOMIC_RELAXED);
}

static void attention_bf16(const float *q, const float *k, const float *v, float *o, int64_t B, int64_t Nq,
                           int64_t Nk, int64_t H, int64_t Dh, const float *rope) {
    /* a fused kernel where one applies: AMX, else fp16 on CPUs without AMX (head size 64, no
     * rotary table), else AVX512-BF16 on CPUs with neither in the hardware (kk_bf16_only:
     * KILN_F16=0 on an fp16 CPU keeps the strips; head sizes that are multiples of 64, the VAE's
     * 512 too; RoPE applied as it packs q and k) */
    if (rope && Dh == 64 && !attention_strips() && (kk_amx_ready() || kk_f16_ready())) {
        /* the AMX and fp16 kernels take no table: q and k rotated first (kk_rope: the same values), so
         * a rotation folded into the attention gives what the rope op and this kernel give */
        size_t nq = (size_t)(B * Nq * H * Dh), nk = (size_t)(B * Nk * H * Dh);
        float *qr = scratch(KK_SCRATCH_ROPE, sizeof(float) * (nq + nk));
        if (qr) {
            kk_rope(q, rope, qr, B, Nq, H, Dh);
            kk_rope(k, rope, qr + nq, B, Nk, H, Dh);
            q = qr, k = qr + nq, rope = NULL;
        }
    }
    if (!attention_strips() &&
        (kk_amx_ready()   ? Dh == 64 && !rope && kk_attention_amx(q, k, v, o, B, Nq, Nk, H, Dh, scratch(12, kk_attention_amx_work_bytes(B, Nq, Nk, H)))
         : kk_f16_ready() ? Dh == 64 && !rope && kk_attention_f16(q, k, v, o, B, Nq, Nk, H, Dh, scratch(12, kk_attention_f16_work_bytes(B, Nq, Nk, H)))
         : kk_bf16_only() && kk_attention_bf16(q, k, v, o, B, Nq, Nk, H, Dh, rope, scratch(12, kk_attention_bf16_work_bytes(B, Nq, Nk, H, Dh)))))
        return;
    fast_attention(KILN_BF16, q, k, v, o, B, Nq, Nk, H, Dh, rope);
}

/* attention_joint on a fused kernel that reads both segments in place (f32
 * or, bf16 set, bf16 rows) and writes o in o_fmt: the AMX one, else the fp16
 * one on CPUs without AMX (head size 64), else the AVX512-BF16 one (head
 * sizes that are multiples of 64; slot 12); 0 where none ran */
static int fused_joint(const void *qa, const void *ka, const void *va, const void *qb, const void *kb, const void *vb,
                       int bf16, void *o, int o_fmt, int64_t B, int64_t Na, int64_t Nb, int64_t H, int64_t Dh,
                       const float *rope) {
    if (attention_strips()) return 0;
    /* the AMX and fp16 kernels: head size 64, no rotary table (Flux's heads of 128 take the strips there) */
    if ((Dh != 64 || rope) && (kk_amx_ready() || kk_f16_ready())) return 0;
    if (kk_amx_ready())
        return kk_attention_amx_joint(qa, ka, va, qb, kb, vb, bf16, o, o_fmt, B, Na, Nb, H, Dh,
                                      scratch(12, kk_attention_amx_work_bytes(B, Na + Nb, Na + Nb, H)));
    if (kk_f16_ready())
        return kk_attention_f16_joint(qa, ka, va, qb, kb, vb, bf16, o, o_fmt, B, Na, Nb, H, Dh,
                                      scratch(12, kk_attention_f16_work_bytes(B, Na + Nb, Na + Nb, H)));
    return kk_bf16_only() &&
           kk_attention_bf16_joint(qa, ka, va, qb, kb, vb, bf16, o, o_fmt, B, Na, Nb, H, Dh, rope,
                                   scratch(12, kk_attention_bf16_work_bytes(B, Na + Nb, Na + Nb, H, Dh)));
}

/* the concatenations for kernels without segmented reads (slot 13) */
static void attention_joint_concat(const kk_backend *be, const float *qa, const float *ka, const float *va,
                                   const float *qb, const float *kb, const float *vb, float *o, int64_t B, int64_t Na,
                                   int64_t Nb, int64_t H, int64_t Dh, const float *rope) {
    float *work = scratch(13, sizeof(float) * 3 * (size_t)(B * (Na + Nb) * H * Dh));
    if (!work) {
        kb_log(KILN_LOG_WARN, "out of memory for attention; using the reference attention");
        kk_reference()->attention_joint(qa, ka, va, qb, kb, vb, o, B, Na, Nb, H, Dh, rope);
        return;
    }
    kk_attention_joint_concat(be, qa, ka, va, qb, kb, vb, o, B, Na, Nb, H, Dh, work, rope);
}

static void attention_joint_f32(const float *qa, const float *ka, const float *va, const float *qb, const float *kb,
                                const float *vb, float *o, int64_t B, int64_t Na, int64_t Nb, int64_t H, int64_t Dh,
                                const float *rope) {
    attention_joint_concat(kk_fast(KILN_F32), qa, ka, va, qb, kb, vb, o, B, Na, Nb, H, Dh, rope);
}

static void attention_joint_bf16(const float *qa, const float *ka, const float *va, const float *qb, const float *kb,
                                 const float *vb, float *o, int64_t B, int64_t Na, int64_t Nb, int64_t H, int64_t Dh,
                                 const float *rope) {
    if (fused_joint(qa, ka, va, qb, kb, vb, 0, o, KK_FMT_F32, B, Na, Nb, H, Dh, rope)) return;
    attention_joint_concat(kk_fast(KILN_BF16), qa, ka, va, qb, kb, vb, o, B, Na, Nb, H, Dh, rope);
}

/* attention_joint on q, k, v that the GEMMs before wrote as bf16 rows, its
 * output f32, bf16 rows or blocked by segment (o_fmt) for the GEMMs after:
 * the fused kernels (fused_joint) pack and write them so; elsewhere the inputs are widened
 * to f32 (exact; slot 16) for attention_joint_bf16, and a bf16 output is
 * rounded from f32 rows there too */
static void attention_joint_bf16_in(const uint16_t *qa, const uint16_t *ka, const uint16_t *va, const uint16_t *qb,
                                    const uint16_t *kb, const uint16_t *vb, void *o, int o_fmt, int64_t B, int64_t Na,
                                    int64_t Nb, int64_t H, int64_t Dh, const float *rope) {
    if (fused_joint(qa, ka, va, qb, kb, vb, 1, o, o_fmt, B, Na, Nb, H, Dh, rope)) return;
    int64_t D = H * Dh, na = B * Na * D, nb = B * Nb * D, no = B * (Na + (qb ? Nb : 0)) * D;
    int o16 = o_fmt != KK_FMT_F32;
    float *f = scratch_must(16, sizeof(float) * (size_t)(3 * (na + nb) + (o16 ? no : 0)));
    if (!f) return;
    float *of = o16 ? f + 3 * (na + nb) : o;
    const uint16_t *src[6] = {qa, ka, va, qb, kb, vb};
    float *dst[6];
    for (int s = 0; s < 6; s++) {
        dst[s] = f + (s % 3) * (na + nb) + (s < 3 ? 0 : na);
        if (src[s]) kt_to_f32(KILN_BF16, src[s], dst[s], (size_t)(s < 3 ? na : nb));
    }
    if (!kb) /* one segment: plain attention */
        attention_bf16(dst[0], dst[1], dst[2], of, B, Na, Na, H, Dh, rope);
    else
        attention_joint_bf16(dst[0], dst[1], dst[2], qb ? dst[3] : NULL, dst[4], dst[5], of, B, Na, Nb, H, Dh, rope);
    if (o_fmt == KK_FMT_BF16) to_bf16_par(of, o, no);
    if (o_fmt == KK_FMT_BLOCKED) kk_block_segments(of, B, Na, qb ? Nb : 0, D, o);
}

/* attention_ex (scale, bias, causal: the text encoders) on the AVX-512 kernel
 * (attn_ex.c, f32 arithmetic for both backends), else the general form */
static void fast_attention_ex(const float *q, const float *k, const float *v, const float *bias, const int64_t bs[4],
                              float *o, int64_t B, int64_t Nq, int64_t Nk, int64_t H, int64_t Dh, float scale,
                              int causal) {
    if (!kk_attention_ex_avx512(q, k, v, 0, bias, bs, o, B, Nq, Nk, H, Dh, scale, causal))
        kk_attention_general(q, k, v, bias, bs, o, B, Nq, Nk, H, Dh, scale, causal);
}

/* ---- the weights the fast kernels read (kk_backend's weight slots) ---- */

static kiln_status fast_pack_layout(const int64_t sh[4], int conv, kiln_dtype dt, char layout[40], size_t *bytes) {
    return conv ? kk_fast_conv_layout(sh[0], sh[1], sh[2], sh[3], dt, layout, bytes)
                : kk_fast_layout(sh[0], sh[1], dt, layout, bytes);
}

static kiln_status fast_pack(const float *w, const int64_t sh[4], int conv, kiln_dtype dt, void *out) {
    return conv ? kk_fast_conv_pack(w, sh[0], sh[1], sh[2], sh[3], dt, out) : kk_fast_pack(w, sh[0], sh[1], dt, out);
}

static const char *fast_weight_dtype_error(kiln_dtype dt) {
    static _Thread_local char msg[200];
    char name[40];
    size_t bytes;
    /* without VNNI (or AMX), oneDNN's s8 products go through 16-bit pair sums
     * that saturate: int8 would be wrong by ~10%, not slow */
    if (dt == KILN_I8 && !kk_cpu_has("avx512vnni"))
        snprintf(msg, sizeof msg, "int8 weights need a CPU with AVX-512 VNNI or AMX-INT8 (this one: %s); without them "
                                  "the int8 products saturate", kk_fast_isa());
    else if ((dt == KILN_F8_E4M3 || dt == KILN_BF16) && !kk_fast(KILN_BF16))
        snprintf(msg, sizeof msg, "%s weights compute in bf16, and this CPU has no bf16 GEMM (AVX-512 BF16 / AMX)",
                 dt == KILN_BF16 ? "bf16" : "fp8");
    else if (kk_fast_layout(64, 64, dt, name, &bytes))
        snprintf(msg, sizeof msg, "this build or CPU has no %s GEMM", kiln_dtype_name(dt));
    else
        return NULL;
    return msg;
}

/* the formats the bf16 backend's slots take (kk_backend.supports); w NULL: some weight */
static int supports_bf16(int slot, int fmt, const kk_weight *w) {
    if (fmt == KK_FMT_F32) return 1;
    switch (slot) {
    case KK_SLOT_LINEAR:
        if (fmt == KK_FMT_BF16) return !w || kk_weight_bf16_io(w);
        return fmt == KK_FMT_BLOCKED && (w ? fast_blocked_io(w) : amx_bf16(KILN_BF16));
    case KK_SLOT_LAYERNORM_MODULATE:
    case KK_SLOT_MODULATE:
    case KK_SLOT_ATTENTION: /* they write blocked rows for the AMX GEMM, which alone reads them */
        return fmt == KK_FMT_BF16 || (fmt == KK_FMT_BLOCKED && amx_bf16(KILN_BF16));
    case KK_SLOT_CONV2D: return fmt == KK_FMT_BF16 && (!w || kk_fast_conv_bf16_io(w));
    case KK_SLOT_GROUP_NORM:
    case KK_SLOT_SLICE_ROWS: return fmt == KK_FMT_BF16;
    default: return 0;
    }
}

#define FAST_COMMON                                                                                                 \
    .silu = fast_silu, .gelu_tanh = fast_gelu, .layernorm = fast_layernorm,                                        \
    .layernorm_modulate = fast_ln_modulate, .rmsnorm_heads = fast_rmsnorm_heads,                                   \
    .modulate = fast_modulate, .gate_add = fast_gate_add, .group_norm = kk_fast_group_norm,                        \
    .attention_ex = fast_attention_ex, .unary = fast_unary, .weights_tag = kk_fast_isa,                           \
    .pack_layout = fast_pack_layout, .pack = fast_pack, .weight_dtype_error = fast_weight_dtype_error,            \
    .has_feature = kk_cpu_has, KK_HOST_OPS

static const kk_backend k_fast_f32 = {.name = "fast-f32", .linear = linear_f32, .attention = attention_f32,
                                      .conv2d = kk_fast_conv2d_f32,
                                      .attention_joint = attention_joint_f32,
                                      .linear_gate_add = linear_gate_add_f32, FAST_COMMON};
static const kk_backend k_fast_bf16 = {.name = "fast-bf16", .linear = linear_bf16, .attention = attention_bf16,
                                       .conv2d = kk_fast_conv2d_bf16,
                                       .attention_joint = attention_joint_bf16,
                                       .attention_joint_bf16 = attention_joint_bf16_in,
                                       .linear_gate_add = linear_gate_add_bf16,
                                       .linear_io = linear_io_bf16, .layernorm_modulate_bf16 = fast_ln_modulate_bf16,
                                       .modulate_bf16 = fast_modulate_bf16, .supports = supports_bf16,
                                       FAST_COMMON};

const kk_backend *kk_fast(kiln_dtype dt) {
    if (!engine()) return NULL;
    if (dt == KILN_F32) return &k_fast_f32;
    if (dt == KILN_BF16) return kk_bf16_ready() ? &k_fast_bf16 : NULL;
    return NULL;
}

/* CPU feature tags, weakest first, as oneDNN's ISA levels */
const char *kk_fast_isa(void) {
    static char name[48];
    if (!engine()) return "none";
    const dnnl_version_t *v = dnnl_version();
    const char *tag = kk_cpu_isa_tag();
    /* bf16 and fp8 weights in kiln's AMX layout where it runs (amx32); bf16 ones in
     * the fp16 GEMM's (f16p64) where that runs; else oneDNN's */
    snprintf(name, sizeof name, "%s-dnnl%d.%d%s", tag, v->major, v->minor,
             kk_amx_ready() ? "-amx32" : kk_f16_ready() ? "-f16p64" : avx2_f32(KILN_F32) ? "-f32p16" : "");
    return name;
}

const char *kiln_kernels(kiln_dtype dt) {
    static char name[2][160];
    char *out = name[dt == KILN_BF16];
    const char *what;
    if (!kk_fast(dt)) what = "the reference kernels (no fast backend for this dtype on this machine)";
    else if (dt != KILN_BF16 && avx2_f32(dt)) what = "kiln's AVX2 f32 GEMM, kiln's fused elementwise kernels";
    else if (dt != KILN_BF16) what = "oneDNN's f32 matmul, kiln's fused elementwise kernels";
    else if (kk_amx_ready()) what = "kiln's AMX GEMM and attention (AMX-BF16 tiles)";
    else if (kk_f16_ready()) what = "kiln's fp16 GEMM and attention (AVX512-FP16, no AMX)";
    else if (kk_bf16_only() && !attention_strips()) what = "oneDNN's bf16 matmul, kiln's AVX512-BF16 attention";
    else what = "oneDNN's bf16 matmul, attention in strips";
    if (dt == KILN_BF16 && kk_fast(dt)) snprintf(out, sizeof name[0], "%s; weight cache layouts %s", what, kk_fast_isa());
    else snprintf(out, sizeof name[0], "%s", what);
    return out;
}
